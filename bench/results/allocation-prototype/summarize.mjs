// Medians over the seeds in each <label>.jsonl given: node summarize.mjs off.jsonl zoneonly.jsonl ...
import { readFileSync } from 'node:fs';
const med = (a) => {
  a = a.filter((x) => x != null).sort((x, y) => x - y);
  return a.length ? a[Math.floor((a.length - 1) / 2)] : null;
};
for (const file of process.argv.slice(2)) {
  const label = file.replace(/\.jsonl$/, '');
  const by = {};
  for (const l of readFileSync(file, 'utf8').trim().split('\n').map((x) => JSON.parse(x))) (by[l.preset] ??= []).push(l);
  for (const [preset, ls] of Object.entries(by)) {
    const conv = {};
    for (const l of ls) for (const part of l.within.split(' ')) {
      const [t, v] = part.split(':');
      (conv[t] ??= []).push(v === 'null' ? 99 : Number(v));
    }
    console.log([label.padEnd(10), preset.padEnd(18), `seeds ${ls.length}`, `err ${med(ls.map((l) => l.steadyErr))}`, `abs ${med(ls.map((l) => l.meanAbs))}`,
      `within ${Object.entries(conv).map(([t, v]) => `${t}:${med(v)}`).join(' ')}`, `overshoot ${med(ls.map((l) => l.overshoot))}`, `wrong ${med(ls.map((l) => l.wrong))}`].join('  '));
  }
}
