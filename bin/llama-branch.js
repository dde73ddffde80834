#!/usr/bin/env node
'use strict';

/**
 * The `llama-branch` command: `llama-branch <command> [options]`. Each command is a module with
 * `summary`, `usage`, `options` (node:util parseArgs specs plus a `help` line) and
 * `run(values, { log })`; add one by adding a line to COMMANDS.
 */

const { parseArgs } = require('node:util');

const COMMANDS = {
  serve: () => require('../lib/cli/serve'),
  'rpc-server': () => require('../lib/cli/rpc-server'),
  devices: () => require('../lib/cli/devices'),
};

function help() {
  const lines = ['usage: llama-branch <command> [options]', '', 'commands:'];
  for (const [name, load] of Object.entries(COMMANDS)) lines.push(`  ${name.padEnd(12)} ${load().summary}`);
  lines.push('', 'llama-branch <command> --help shows its options');
  return lines.join('\n');
}

function commandHelp(command) {
  const lines = [`usage: ${command.usage}`, '', 'options:'];
  for (const [name, spec] of Object.entries(command.options)) {
    const flag = `--${name}${spec.type === 'string' ? ' <value>' : ''}`;
    const def = spec.default !== undefined ? ` (default ${spec.default})` : '';
    lines.push(`  ${flag.padEnd(26)} ${spec.help}${def}`);
  }
  return lines.join('\n');
}

async function main(argv) {
  const [name, ...rest] = argv;
  if (!name || name === '--help' || name === '-h' || name === 'help') {
    console.log(help());
    return 0;
  }
  const load = COMMANDS[name];
  if (!load) {
    console.error(`error: unknown command ${JSON.stringify(name)}\n\n${help()}`);
    return 2;
  }
  const command = load();
  const specs = Object.fromEntries(Object.entries(command.options).map(([k, { help: _help, ...spec }]) => [k, spec]));
  let values;
  try {
    ({ values } = parseArgs({
      args: rest,
      options: { ...specs, help: { type: 'boolean', short: 'h' } },
      allowPositionals: false,
    }));
  } catch (e) {
    console.error(`error: ${e.message}\n\n${commandHelp(command)}`);
    return 2;
  }
  if (values.help) {
    console.log(commandHelp(command));
    return 0;
  }
  try {
    await command.run(values, { log: (line) => console.log(line) });
    return 0;
  } catch (e) {
    console.error(`error: ${e.message}${e.code ? ` (${e.code})` : ''}`);
    return command.UsageError && e instanceof command.UsageError ? 2 : 1;
  }
}

main(process.argv.slice(2)).then((code) => {
  process.exitCode = code;
});
