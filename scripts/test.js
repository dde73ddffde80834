#!/usr/bin/env node
'use strict';

/**
 * The one test command (`npm test`): lint, build, tier 1 without a model (Rust and JS unit tests,
 * the generated typings current and type-checked), the model fetched (exported as LLAMA_TEST_MODEL
 * unless set), then tier 2 on it (integration tests, RPC, examples, the packed and the prebuilt
 * package installed). Stops at the first failing step with its exit code; prints a summary.
 */

const fs = require('node:fs');
const path = require('node:path');
const { repoRoot, run, formatDuration } = require('./env');

/** Runs a file of this repository (scripts, devDependencies' CLIs) with this node; a trailing object is spawn options. */
function node(file, ...args) {
  const opts = typeof args[args.length - 1] === 'object' ? args.pop() : {};
  if (fs.existsSync(path.join(repoRoot, file)))
    return run(process.execPath, [path.join(repoRoot, file), ...args], opts);
  console.error(`error: ${file} is missing${file.startsWith('node_modules') ? '; run `npm install` first' : ''}`);
  return 1;
}

// A test marked `.only` or left pending (`it.skip`, `this.skip()`) fails the run: a test that
// should run never passes by not running (.mocharc.json says the same for plain `mocha`).
const mocha = (...args) => node('node_modules/mocha/bin/mocha.js', '--forbid-only', '--forbid-pending', ...args);
const tsc = (project) => node('node_modules/typescript/bin/tsc', '-p', path.join(repoRoot, project));
// The Scheduler's KV safety net throws instead of warning in every step below (examples and
// spawned servers too): a plan that fell short is a failure, not a line in the log.
process.env.LLAMA_BRANCH_STRICT_KV ??= '1';

const skipIf = (name) => () => (process.env[name] === '1' ? `${name}=1` : null);

const steps = [
  {
    name: 'lint: prettier --check, eslint (rustfmt and clippy after the build, in CI)',
    run: () =>
      node('node_modules/prettier/bin/prettier.cjs', '--check', '--log-level', 'warn', '.') ||
      node('node_modules/eslint/bin/eslint.js', '.'),
  },
  { name: 'build native addon', run: () => node('scripts/build.js') },
  {
    // `npm run lint`'s Rust half, where CI runs it (locally `npm run lint` does): after the build,
    // whose llama.cpp build script run clippy shares.
    name: 'lint (CI): cargo fmt --check, clippy --release --all-targets -D warnings',
    skip: () => (process.env.CI ? null : 'CI unset: `npm run lint` runs them'),
    run: () =>
      node('scripts/cargo.js', 'fmt', '--check') ||
      node('scripts/cargo.js', 'clippy', '--release', '--all-targets', '--', '-D', 'warnings'),
  },
  {
    name: 'tier 1: rust unit tests (cargo test --release --lib)',
    run: () => node('scripts/cargo.js', 'test', '--release', '--lib'),
  },
  {
    name: 'tier 1: js unit tests, no model (mocha test/unit)',
    run: () => mocha('--no-config', '--node-option', 'expose-gc', 'test/unit'),
  },
  {
    name: 'tier 1: typings (lib/native.d.ts and types/ current, tsc -p lib, tsc -p test/types)',
    run: () =>
      node('scripts/native-typings.js', '--check') ||
      node('scripts/lib-typings.js', '--check') ||
      tsc('lib') ||
      tsc('test/types'),
  },
  {
    name: 'fetch model',
    run: () => {
      const code = node('scripts/fetch-model.js');
      if (code === 0) process.env.LLAMA_TEST_MODEL ||= require('./fetch-model').defaultModelPath();
      return code;
    },
  },
  { name: 'tier 2: integration tests on the model (mocha)', run: () => mocha() },
  {
    // No --exit: the process must end by itself (freeing a model whose server died once hung it at
    // exit); the hard time limit turns such a hang into a failure instead of a stuck CI run.
    name: 'tier 2: RPC across two loopback rpc-server processes (test/rpc.test.js)',
    run: () =>
      mocha('--no-config', '--timeout', '240000', '--node-option', 'expose-gc', 'test/rpc.test.js', {
        timeout: 600000,
        killSignal: 'SIGKILL',
      }),
  },
  {
    // Three server processes and a router on 2 cores: its own step, with a hard limit like RPC's.
    name: 'tier 2: three replicas behind a real sglang-router (test/router.test.js)',
    run: () =>
      mocha('--no-config', '--timeout', '300000', '--node-option', 'expose-gc', 'test/router.test.js', {
        timeout: 600000,
        killSignal: 'SIGKILL',
      }),
  },
  {
    name: 'tier 2: three gRPC replicas behind a real SMG (test/smg.test.js)',
    run: () =>
      mocha('--no-config', '--timeout', '300000', '--node-option', 'expose-gc', 'test/smg.test.js', {
        timeout: 600000,
        killSignal: 'SIGKILL',
      }),
  },
  { name: 'tier 2: examples (node test/examples.js)', run: () => node('test/examples.js') },
  {
    name: 'tier 2: package (node test/install/pack.js)',
    skip: skipIf('LLAMA_BRANCH_SKIP_PACK_TEST'),
    run: () => node('test/install/pack.js'),
  },
  {
    name: 'prebuilt install (node test/install/prebuilt.js)',
    skip: skipIf('LLAMA_BRANCH_SKIP_PREBUILT_TEST'),
    run: () => node('test/install/prebuilt.js'),
  },
];

const startedAll = Date.now();
const summary = [];
for (const step of steps) {
  const reason = step.skip?.();
  console.log(`\n==> ${step.name}${reason ? `: skipped (${reason})` : ''}`);
  if (reason) {
    summary.push(`  skipped  ${step.name}`);
    continue;
  }
  const started = Date.now();
  const code = step.run();
  const elapsed = formatDuration(Date.now() - started);
  if (code !== 0) {
    summary.push(`  FAILED   ${step.name} (exit code ${code}, ${elapsed})`);
    console.error(`\n==> FAILED: ${step.name} (exit code ${code})\n${summary.join('\n')}`);
    process.exit(code);
  }
  summary.push(`  ok       ${step.name} (${elapsed})`);
}
console.log(`\n==> all tests passed in ${formatDuration(Date.now() - startedAll)}\n${summary.join('\n')}`);
