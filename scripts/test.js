#!/usr/bin/env node
'use strict';

/**
 * The one test command (`npm test`). Runs, in order, stopping at the first failure:
 *   1. build the addon (scripts/build.js; cheap when up to date)
 *   2. first tier, no model, seconds once built:
 *        Rust unit tests (cargo test --release --lib: the store and the decode engine over an
 *        in-memory KV backend, planning, sampling, metrics, conversions);
 *        JS unit tests of lib/ (mocha test/unit);
 *        the typed native contract: lib/native.d.ts matches the Rust #[napi] signatures, lib/
 *        type-checks against it (tsc -p lib), index.d.ts's option/result fields match the Rust
 *        DTOs (test/types/contract.ts, with the public usage check, tsc -p test/types)
 *   3. fetch the default model (scripts/fetch-model.js; no-op when cached or LLAMA_TEST_MODEL is set)
 *   4. second tier, on the real model: mocha integration tests (test/*.test.js), the RPC test
 *      (test/rpc.test.js: two rpc-server child processes on loopback; its own mocha process), every example
 *      (node test/examples.js), and packaging: npm pack, install the tarball into a scratch
 *      project, build, require it and generate (scripts/test-pack.js; ~1-2 min;
 *      LLAMA_BRANCH_SKIP_PACK_TEST=1 skips it and says so)
 *   8. prebuilt: install the two tarballs of `npm run build:prebuilt` into a scratch project with no
 *      compiler and no network, require it and generate (scripts/test-prebuilt.js; runs the
 *      prebuild first when dist/ is stale: ~20 min on a cold machine, seconds otherwise;
 *      LLAMA_BRANCH_SKIP_PREBUILT_TEST=1 skips it and says so)
 *
 * After step 3, LLAMA_TEST_MODEL is exported to the later steps (pointing at the fetched model)
 * unless it was already set, so JS tests and examples all use the same file.
 *
 * Exits with the failing step's exit code, or 0 when everything passed.
 */

const fs = require('node:fs');
const path = require('node:path');
const { repoRoot, featureArgs, cpuArgs, cargoEnv, findCargo, run, formatDuration } = require('./env');

const node = process.execPath;
const script = (...p) => path.join(repoRoot, ...p);

/** Path of an installed devDependency's entry file, or null if not installed. */
function devTool(...p) {
  const file = script('node_modules', ...p);
  return fs.existsSync(file) ? file : null;
}

/**
 * Each step: a name for the header, an optional `skip()` returning a reason
 * to skip, and `run()` returning an exit code.
 */
function tsc(project) {
  const bin = devTool('typescript', 'bin', 'tsc');
  if (!bin) {
    console.error('error: typescript is not installed; run `npm install` first');
    return 1;
  }
  return run(node, [bin, '-p', script(...project)]);
}

/** Runs mocha with `args`; a trailing object is spawn options (e.g. a time limit). */
function mocha(...args) {
  const bin = devTool('mocha', 'bin', 'mocha.js');
  if (!bin) {
    console.error('error: mocha is not installed; run `npm install` first');
    return 1;
  }
  const opts = typeof args[args.length - 1] === 'object' ? args.pop() : {};
  return run(node, [bin, ...args], opts);
}

/** Runs a devDependency's CLI (`node_modules/<pkg>/<bin>`) with `args`. */
function devCli(pkg, bin, args) {
  const file = devTool(pkg, ...bin.split('/'));
  if (!file) {
    console.error(`error: ${pkg} is not installed; run \`npm install\` first`);
    return 1;
  }
  return run(node, [file, ...args]);
}

const steps = [
  {
    name: 'lint: prettier --check, eslint (npm run lint adds rustfmt and clippy)',
    run: () =>
      devCli('prettier', 'bin/prettier.cjs', ['--check', '--log-level', 'warn', '.']) ||
      devCli('eslint', 'bin/eslint.js', ['.']),
  },
  {
    name: 'build native addon',
    run: () => run(node, [script('scripts', 'build.js')]),
  },
  {
    name: 'tier 1: rust unit tests (cargo test --release --lib)',
    run: () => {
      if (!findCargo()) {
        console.error('error: cargo not found; install Rust with rustup (https://rustup.rs)');
        return 127;
      }
      return run('cargo', ['test', '--release', '--lib', ...featureArgs(), ...cpuArgs()], { env: cargoEnv() });
    },
  },
  {
    name: 'tier 1: js unit tests, no model (mocha test/unit)',
    run: () => mocha('--no-config', '--node-option', 'expose-gc', script('test', 'unit')),
  },
  {
    name: 'tier 1: typings (lib/native.d.ts and types/ current, tsc -p lib, tsc -p test/types)',
    run: () =>
      run(node, [script('scripts', 'native-typings.js'), '--check']) ||
      run(node, [script('scripts', 'lib-typings.js'), '--check']) ||
      tsc(['lib']) ||
      tsc(['test', 'types']),
  },
  {
    name: 'fetch model',
    run: () => {
      const code = run(node, [script('scripts', 'fetch-model.js')]);
      if (code === 0 && !process.env.LLAMA_TEST_MODEL) {
        process.env.LLAMA_TEST_MODEL = require('./fetch-model').defaultModelPath();
      }
      return code;
    },
  },
  {
    name: 'tier 2: integration tests on the model (mocha)',
    run: () => mocha(),
  },
  {
    // Its own mocha process: it starts rpc-server child processes and kills one mid-generation,
    // leaving parked ggml threads behind. No --exit: the process must end by itself (freeing a
    // model whose server died once hung it at exit). A hard time limit turns a hang into a
    // failure instead of a stuck CI run.
    name: 'tier 2: RPC across two loopback rpc-server processes (test/rpc.test.js)',
    run: () =>
      mocha('--no-config', '--timeout', '240000', '--node-option', 'expose-gc', script('test', 'rpc.test.js'), {
        timeout: 600000,
        killSignal: 'SIGKILL',
      }),
  },
  {
    name: 'tier 2: examples (node test/examples.js)',
    run: () => run(node, [script('test', 'examples.js')]),
  },
  {
    name: 'tier 2: package (node scripts/test-pack.js)',
    skip: () => (process.env.LLAMA_BRANCH_SKIP_PACK_TEST === '1' ? 'LLAMA_BRANCH_SKIP_PACK_TEST=1' : null),
    run: () => run(node, [script('scripts', 'test-pack.js')]),
  },
  {
    name: 'prebuilt install (node scripts/test-prebuilt.js)',
    skip: () => (process.env.LLAMA_BRANCH_SKIP_PREBUILT_TEST === '1' ? 'LLAMA_BRANCH_SKIP_PREBUILT_TEST=1' : null),
    run: () => run(node, [script('scripts', 'test-prebuilt.js')]),
  },
];

function main() {
  const startedAll = Date.now();
  const summary = [];
  for (const step of steps) {
    const reason = step.skip ? step.skip() : null;
    if (reason) {
      console.log(`\n==> ${step.name}: skipped (${reason})`);
      summary.push(`  skipped  ${step.name}`);
      continue;
    }
    console.log(`\n==> ${step.name}`);
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
}

main();
