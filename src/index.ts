// The root entry re-exports the shared vocabulary; each family lives at its own subpath
// (`spillway/local`, `spillway/redis`, `spillway/global`...) so an app loads only what it uses.
export * from './core/index.js';
