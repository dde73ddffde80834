#!/usr/bin/env node
'use strict';

/**
 * Packaging test (`npm run test:pack`): what `npm publish` would ship must install, build and run
 * in a project that knows nothing about this repository.
 *
 *   1. `npm pack` into a temporary directory, and check the file list (sources and build files
 *      in; tests, models and build outputs out);
 *   2. install the tarball into a scratch project (test/install/scratch.js: an empty npm cache and
 *      HOME of its own, the runtime dependencies from a loopback registry of tarballs packed from
 *      node_modules),
 *      which runs the package's install hook = the native build. The cargo target directory is
 *      the shared one (CARGO_TARGET_DIR, else ~/.cache/llama-branch/target), so llama.cpp is not
 *      compiled again; only this crate is;
 *   3. in the scratch project, `require('llama-branch')` and generate a few tokens on the test
 *      model (LLAMA_TEST_MODEL, else the default model).
 *
 * Exits non-zero on the first failure. Keeps the temporary directory when KEEP_PACK_DIR=1.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { repoRoot, cargoEnv, formatDuration, npmCommand } = require('../../scripts/env');
const { scratchInstall } = require('./scratch');

function log(msg) {
  console.log(`[test-pack] ${msg}`);
}

function die(msg) {
  console.error(`[test-pack] FAILED: ${msg}`);
  process.exit(1);
}

function npm(args, cwd, extraEnv = {}) {
  const [cmd, pre] = npmCommand();
  return spawnSync(cmd, [...pre, ...args], {
    cwd,
    env: { ...cargoEnv(), ...extraEnv },
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
}

const REQUIRED_FILES = [
  'package.json',
  'README.md',
  'index.d.ts',
  'lib/index.js',
  'src/lib.rs',
  'Cargo.toml',
  'Cargo.lock',
  'build.rs',
  '.cargo/config.toml',
  // the vendored ggml's deterministic patch, which .cargo/config.toml points CMake at
  'patches/ggml/deterministic.cmake',
  'patches/ggml/flash-attn-order-independent.inc',
  'patches/ggml/kquant-cols.inc',
  'scripts/build.js',
  'scripts/env.js',
];
const FORBIDDEN = [/^test\//, /^models\//, /^build\//, /^target\//, /^node_modules\//, /\.gguf$/, /\.node$/, /^\.ci\//];

function main() {
  const started = Date.now();
  const model = process.env.LLAMA_TEST_MODEL
    ? path.resolve(process.env.LLAMA_TEST_MODEL)
    : require('../../scripts/fetch-model').ensureModel();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-pack-'));
  try {
    // 1. Pack.
    const packed = npm(['pack', '--json', '--pack-destination', dir], repoRoot);
    if (packed.status !== 0) die(`npm pack exited with ${packed.status}`);
    const [info] = JSON.parse(packed.stdout.slice(packed.stdout.indexOf('[')));
    const files = info.files.map((f) => f.path);
    for (const f of REQUIRED_FILES) if (!files.includes(f)) die(`the package lacks ${f}`);
    const stray = files.filter((f) => FORBIDDEN.some((re) => re.test(f)));
    if (stray.length) die(`the package contains files it should not: ${stray.join(', ')}`);
    log(`packed ${info.filename}: ${files.length} files, ${(info.size / 1024).toFixed(0)} KiB`);

    // 2. Install into a scratch project (runs the install hook: the native build).
    log('npm install <tarball> in a scratch project (loopback registry), empty npm cache (builds the addon) ...');
    const installed = scratchInstall({
      dir,
      tarballs: [path.join(dir, info.filename)],
      env: cargoEnv(),
      foregroundScripts: true,
    });
    if (installed.status !== 0) die(`npm install exited with ${installed.status}:\n${installed.output}`);
    log(`installed in ${formatDuration(installed.ms)}`);
    const { project } = installed;

    // 3. Use it like a consumer would.
    const program = `
      const { createContext, Branch, BranchStore } = require('llama-branch');
      (async () => {
        const ctx = await createContext({ modelPath: process.argv[1], nCtx: 256, nSeqMax: 2 });
        const root = Branch.create(ctx, 0, { temperature: 0 });
        await root.prefill(await ctx.tokenize('The capital of France is'));
        const forks = [root.fork(), root];
        const store = new BranchStore(ctx);
        let text = '';
        for (let i = 0; i < 4; i++) {
          const out = store.produce(forks);
          text += out[0].text;
          await store.commit(forks.map((b, j) => [b, out[j].token]));
        }
        if (typeof require.resolve('llama-branch') !== 'string' || text.length === 0) process.exit(1);
        console.log(JSON.stringify({ text, position: root.position }));
        ctx.dispose();
      })().catch((e) => { console.error(e.code, e.message); process.exit(1); });`;
    const ran = spawnSync(process.execPath, ['-e', program, model], { cwd: project, encoding: 'utf8' });
    if (ran.status !== 0) die(`the installed package did not run: ${ran.stderr || ran.stdout}`);
    const result = JSON.parse(ran.stdout.trim().split('\n').pop());
    log(`generated ${JSON.stringify(result.text)} from the installed package`);
    const resolved = spawnSync(process.execPath, ['-p', "require.resolve('llama-branch')"], {
      cwd: project,
      encoding: 'utf8',
    }).stdout.trim();
    if (!resolved.startsWith(path.join(project, 'node_modules')))
      die(`llama-branch resolved outside the scratch project: ${resolved}`);
    log(`ok in ${formatDuration(Date.now() - started)}`);
  } finally {
    if (process.env.KEEP_PACK_DIR === '1') log(`kept ${dir}`);
    else fs.rmSync(dir, { recursive: true, force: true });
  }
}

main();
