import type { CommandSpec } from './command-line.js';
import { subcommands } from './main.js';

/** The flag declarations of every registered subcommand that declares them (`export const spec`). */
export async function loadCommandSpecs(): Promise<CommandSpec[]> {
  const specs: CommandSpec[] = [];
  for (const name of Object.keys(subcommands)) {
    const module = (await subcommands[name]!.load()) as { spec?: CommandSpec };
    if (module.spec) specs.push(module.spec);
  }
  return specs;
}
