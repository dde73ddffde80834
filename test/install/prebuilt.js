#!/usr/bin/env node
'use strict';

/**
 * Prebuilt install test (`npm run test:prebuilt`, a step of `npm test`): the two tarballs of
 * `npm run build:prebuilt` install into an app on a machine with no compiler and no network, and run.
 *
 *   1. dist/ holds both tarballs for this version, newer than every input of the build; if not,
 *      run scripts/build-prebuilt.js (a cold machine pays the ~20 min build once);
 *   2. a scratch project, and a PATH holding only node, npm and sh: cargo, cmake, cc, gcc, g++ and
 *      c++ are unreachable (checked), and HOME / CARGO_HOME point at empty folders so that the
 *      install script cannot find ~/.cargo/bin/cargo either. `npm install` of both
 *      tarballs must finish in under 60 s, say that it used the prebuilt binary and leave no
 *      build/ folder (nothing compiled);
 *   3. in the scratch project: require('llama-branch') resolves the binary from the platform
 *      package, systemInfo() names the CPU variant ggml chose, and greedy generation on the test
 *      model gives text (its first greedy token must be in the source build's top 5 and the other
 *      way round, when a source build exists);
 *   4. failure paths: the platform package's .node without its backend modules throws
 *      ERR_NATIVE_LOAD at require (no crash), so does a second prebuilt build (a GPU variant
 *      package) in the same process; LLAMA_BRANCH_BUILD_FROM_SOURCE=1 makes the install
 *      script build (which fails here, for want of cargo, with the rustup hint) and the prebuilt
 *      keeps working afterwards.
 *
 * Exits non-zero on the first failure. Keeps the temporary directory when KEEP_PACK_DIR=1.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { repoRoot, addonPath, formatDuration, npmCli } = require('../../scripts/env');
const { distDir, addonFileName } = require('../../scripts/build-prebuilt');
const { platformKey, platformPackageName } = require('../../lib/loader');
const { vulkanBuildEnv } = require('../../scripts/vulkan');
const { scratchNpmEnv, scratchInstall } = require('./scratch');

const INSTALL_LIMIT_MS = 60000;
const COMPILERS = ['cargo', 'rustc', 'cmake', 'cc', 'gcc', 'g++', 'c++', 'clang', 'make'];
/** What the build reads: a newer file than the tarballs means dist/ is stale. */
const BUILD_INPUTS = [
  'src',
  'lib',
  'types',
  'scripts',
  'build.rs',
  'Cargo.toml',
  'Cargo.lock',
  '.cargo',
  'package.json',
  'index.d.ts',
  'README.md',
  'npm',
];

function log(msg) {
  console.log(`[test-prebuilt] ${msg}`);
}

function die(msg) {
  console.error(`[test-prebuilt] FAILED: ${msg}`);
  process.exit(1);
}

/** Newest modification time under `p` (ms), ignoring built binaries in npm/<platform>/. */
function newestMtime(p) {
  let st;
  try {
    st = fs.statSync(p);
  } catch {
    return 0;
  }
  if (!st.isDirectory()) return /\.(node|so|dylib|dll)$|\.so\./.test(p) ? 0 : st.mtimeMs;
  return Math.max(0, ...fs.readdirSync(p).map((f) => newestMtime(path.join(p, f))));
}

/**
 * The tarballs, rebuilt first when missing or older than the sources: the main and platform
 * packages, and the Vulkan module package when `vulkan` (default: whenever this machine can build
 * it, so that `npm run test:gpu` after `npm test` reuses this build instead of making another).
 */
function ensureTarballs({ vulkan = vulkanBuildEnv() !== null } = {}) {
  const { version } = JSON.parse(fs.readFileSync(path.join(repoRoot, 'package.json'), 'utf8'));
  const tarballs = {
    main: path.join(distDir, `llama-branch-${version}.tgz`),
    platform: path.join(distDir, `${platformPackageName(null)}-${version}.tgz`),
    ...(vulkan ? { vulkan: path.join(distDir, `${platformPackageName('vulkan')}-${version}.tgz`) } : {}),
  };
  const built = Math.min(...Object.values(tarballs).map((t) => (fs.existsSync(t) ? fs.statSync(t).mtimeMs : 0)));
  const inputs = Math.max(...BUILD_INPUTS.map((p) => newestMtime(path.join(repoRoot, p))));
  if (built > inputs) {
    log(
      `dist/ is up to date (${Object.values(tarballs)
        .map((t) => path.basename(t))
        .join(', ')})`,
    );
    return tarballs;
  }
  log(
    built === 0
      ? 'dist/ has no tarballs for this version: npm run build:prebuilt ...'
      : 'dist/ is older than the sources: npm run build:prebuilt ...',
  );
  const started = Date.now();
  const res = spawnSync(
    process.execPath,
    [path.join(repoRoot, 'scripts', 'build-prebuilt.js'), ...(vulkan ? ['--vulkan'] : [])],
    {
      cwd: repoRoot,
      stdio: 'inherit',
    },
  );
  if (res.status !== 0) die(`npm run build:prebuilt exited with ${res.status}`);
  log(`prebuild took ${formatDuration(Date.now() - started)}`);
  for (const t of Object.values(tarballs)) if (!fs.existsSync(t)) die(`prebuild did not produce ${t}`);
  return tarballs;
}

/**
 * An environment without a compiler: PATH is one folder with node, npm and sh only; HOME,
 * CARGO_HOME, RUSTUP_HOME and npm's cache and configuration are empty scratch folders
 * (scratchNpmEnv); no proxy, no registry.
 */
function noCompilerEnv(dir) {
  const bin = path.join(dir, 'bin');
  const home = path.join(dir, 'home');
  fs.mkdirSync(bin);
  fs.symlinkSync(process.execPath, path.join(bin, 'node'));
  // npm runs lifecycle scripts through `sh` found on PATH.
  fs.symlinkSync(fs.existsSync('/bin/sh') ? '/bin/sh' : '/usr/bin/sh', path.join(bin, 'sh'));
  fs.writeFileSync(path.join(bin, 'npm'), `#!/bin/sh\nexec "${process.execPath}" "${npmCliOrDie()}" "$@"\n`, {
    mode: 0o755,
  });
  const env = {};
  for (const [k, v] of Object.entries(process.env)) {
    // Keep the test's own settings; drop npm's per-run variables, llama-branch's build and
    // binary switches, cargo's and the compilers'.
    if (
      /^(npm_|LLAMA_BRANCH_|CARGO|RUSTUP|RUSTC|CC$|CXX$|CMAKE|CCACHE|LIBCLANG|BINDGEN|HTTPS?_PROXY|https?_proxy|NODE_OPTIONS)/.test(
        k,
      )
    )
      continue;
    env[k] = v;
  }
  return scratchNpmEnv(dir, {
    ...env,
    PATH: bin,
    HOME: home,
    CARGO_HOME: path.join(home, '.cargo'),
    RUSTUP_HOME: path.join(home, '.rustup'),
    CCACHE_DIR: path.join(home, '.ccache'),
  });
}

function npmCliOrDie() {
  return npmCli() || die('cannot find npm-cli.js (run this through npm, or put npm on PATH)');
}

/** The program run in the scratch project: load, report, generate greedily. */
const CONSUMER = `
  const llama = require('llama-branch');
  (async () => {
    const info = llama.systemInfo();
    const binary = Object.keys(require.cache).find((f) => f.endsWith('.node'));
    const ctx = await llama.createContext({ modelPath: process.argv[1], nCtx: 256, nSeqMax: 1 });
    const branch = llama.Branch.create(ctx, 0, { temperature: 0 });
    await branch.prefill(await ctx.tokenize('The capital of France is'));
    const first = branch.getLogits();
    const top5 = Array.from(first.keys()).sort((a, b) => first[b] - first[a]).slice(0, 5);
    const tokens = [];
    let text = '';
    for (let i = 0; i < 8; i++) {
      const out = branch.produce();
      tokens.push(out.token);
      text += out.text;
      await branch.commit(out.token);
    }
    ctx.dispose();
    console.log(JSON.stringify({ info, binary, tokens, top5, text }));
  })().catch((e) => { console.error(e.code, e.message); process.exit(1); });`;

function runNode(args, cwd, env) {
  return spawnSync(process.execPath, args, { cwd, env, encoding: 'utf8', timeout: 300000 });
}

function main() {
  const started = Date.now();
  const model = process.env.LLAMA_TEST_MODEL
    ? path.resolve(process.env.LLAMA_TEST_MODEL)
    : require('../../scripts/fetch-model').ensureModel();
  const tarballs = ensureTarballs();
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-prebuilt-'));
  try {
    const env = noCompilerEnv(dir);
    for (const tool of COMPILERS) {
      const probe = spawnSync(tool, ['--version'], { env, stdio: 'ignore' });
      if (!probe.error) die(`${tool} is reachable from the test's PATH`);
    }
    log(`no compiler reachable (${COMPILERS.join(', ')} hidden), only the loopback registry of the dependency closure`);

    // 2. Install both tarballs (and the dependency closure, packed from node_modules).
    const installed = scratchInstall({
      dir,
      tarballs: [tarballs.main, tarballs.platform],
      env,
      npm: [path.join(dir, 'bin', 'npm'), []],
      foregroundScripts: true,
    });
    const { project, output, ms: installMs } = installed;
    if (installed.status !== 0) die(`npm install exited with ${installed.status}:\n${output}`);
    if (!/using the prebuilt binary from llama-branch-/.test(output))
      die(`the install script did not report using the prebuilt binary:\n${output}`);
    if (/building native addon|cargo build/.test(output)) die(`the install script started a build:\n${output}`);
    const installedPkg = path.join(project, 'node_modules', 'llama-branch');
    if (fs.existsSync(path.join(installedPkg, 'build')))
      die('node_modules/llama-branch/build exists: something was compiled');
    if (installMs >= INSTALL_LIMIT_MS)
      die(`the install took ${formatDuration(installMs)} (limit ${INSTALL_LIMIT_MS / 1000} s)`);
    const optional =
      JSON.parse(fs.readFileSync(path.join(installedPkg, 'package.json'), 'utf8')).optionalDependencies || {};
    if (!optional[platformPackageName(null)])
      die(
        `the main package does not list ${platformPackageName(null)} in optionalDependencies: ${JSON.stringify(optional)}`,
      );
    if (optional[platformPackageName('vulkan')])
      die(`the main package lists ${platformPackageName('vulkan')}: CPU-only users would download the Vulkan module`);
    log(
      `installed both tarballs in ${formatDuration(installMs)} without compiling: ${output
        .split('\n')
        .find((l) => l.includes('using the prebuilt'))
        .trim()}`,
    );

    // 3. Use it.
    const ran = runNode(['-e', CONSUMER, model], project, env);
    if (ran.status !== 0) die(`the installed package did not run: ${ran.stderr || ran.stdout}`);
    const result = JSON.parse(ran.stdout.trim().split('\n').pop());
    const variant = /CPU_VARIANT = (\S+)/.exec(result.info);
    if (!variant) die(`systemInfo() names no CPU variant: ${result.info}`);
    const platformDir = path.join(project, 'node_modules', platformPackageName(null));
    if (result.binary !== fs.realpathSync(path.join(platformDir, addonFileName(platformKey()))))
      die(`the binary came from ${result.binary}, not the platform package`);
    if (!/[A-Za-z]{2,}.*\s+[A-Za-z]{2,}/.test(result.text))
      die(`greedy generation gave no text: ${JSON.stringify(result.text)}`);
    log(`systemInfo(): ${result.info.trim()}`);
    log(`CPU variant: ${variant[1]}; greedy text: ${JSON.stringify(result.text)}`);
    if (fs.existsSync(addonPath)) {
      const source = runNode(
        ['-e', CONSUMER.replace("require('llama-branch')", `require(${JSON.stringify(repoRoot)})`), model],
        repoRoot,
        { ...process.env, LLAMA_BRANCH_BINARY: '' },
      );
      if (source.status !== 0) die(`the source build did not run: ${source.stderr}`);
      const reference = JSON.parse(source.stdout.trim().split('\n').pop());
      // Different builds run different CPU kernels (llama.cpp is not kernel-invariant): each
      // first greedy token must be in the other build's top 5, not necessarily equal.
      if (!reference.top5.includes(result.tokens[0]) || !result.top5.includes(reference.tokens[0])) {
        die(
          `first greedy tokens disagree beyond the tolerance: prebuilt ${result.tokens[0]} (top 5 ${result.top5}), source build ${reference.tokens[0]} (top 5 ${reference.top5})`,
        );
      }
      const same = result.tokens.findIndex((t, i) => t !== reference.tokens[i]);
      log(
        `source build: ${JSON.stringify(reference.text)} (${same === -1 ? 'all 8 tokens equal' : `equal up to token ${same}`})`,
      );
    }

    // 4a. Backend modules missing: a coded error at require, not a crash.
    const stripped = path.join(dir, 'no-backends');
    fs.mkdirSync(stripped);
    for (const f of fs.readdirSync(platformDir)) {
      if (!f.startsWith('libggml-cpu-')) fs.copyFileSync(path.join(platformDir, f), path.join(stripped, f));
    }
    const missing = runNode(
      [
        '-e',
        "try { require('llama-branch'); console.log('loaded'); } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }",
      ],
      project,
      { ...env, LLAMA_BRANCH_BINARY: path.join(stripped, addonFileName(platformKey())) },
    );
    if (missing.status !== 0)
      die(
        `without backend modules the process died (status ${missing.status}, signal ${missing.signal}): ${missing.stderr}`,
      );
    const missingErr = JSON.parse(missing.stdout.trim().split('\n').pop());
    if (missingErr.code !== 'ERR_NATIVE_LOAD' || !/libggml-cpu-/.test(missingErr.message))
      die(`without backend modules: expected ERR_NATIVE_LOAD naming libggml-cpu-*.so, got ${missing.stdout}`);
    log('without its backend modules: ERR_NATIVE_LOAD at require');

    // 4b. A second prebuilt build in the same process (a copy posing as a CUDA build package):
    // the dynamic linker would hand it the first one's llama.cpp, so the loader refuses it.
    const fakeGpu = path.join(project, 'node_modules', platformPackageName('cuda'));
    fs.cpSync(platformDir, fakeGpu, { recursive: true });
    const second = runNode(
      [
        '-e',
        "const l = require('llama-branch'); try { l.loadBinary('cuda'); console.log('{}'); } catch (e) { console.log(JSON.stringify({ code: e.code, message: e.message })); }",
      ],
      project,
      env,
    );
    const secondErr = JSON.parse((second.stdout || '{}').trim().split('\n').pop());
    if (
      second.status !== 0 ||
      secondErr.code !== 'ERR_NATIVE_LOAD' ||
      !/another prebuilt build is already loaded/.test(secondErr.message)
    ) {
      die(
        `a second prebuilt build in one process: expected ERR_NATIVE_LOAD, got status ${second.status}: ${second.stdout} ${second.stderr}`,
      );
    }
    fs.rmSync(fakeGpu, { recursive: true });
    log('a second prebuilt build in the same process: ERR_NATIVE_LOAD');

    // 4c. LLAMA_BRANCH_BUILD_FROM_SOURCE=1 forces a source build (which needs cargo: fails here).
    const forced = spawnSync(path.join(dir, 'bin', 'npm'), ['rebuild', 'llama-branch', '--foreground-scripts'], {
      cwd: project,
      env: { ...env, LLAMA_BRANCH_BUILD_FROM_SOURCE: '1' },
      encoding: 'utf8',
    });
    const forcedOut = `${forced.stdout}\n${forced.stderr}`;
    if (forced.status === 0)
      die(`LLAMA_BRANCH_BUILD_FROM_SOURCE=1 npm rebuild succeeded without a compiler:\n${forcedOut}`);
    if (
      !/LLAMA_BRANCH_BUILD_FROM_SOURCE=1: building from source/.test(forcedOut) ||
      !/cargo\) was not found/.test(forcedOut)
    )
      die(`LLAMA_BRANCH_BUILD_FROM_SOURCE=1 did not try a source build:\n${forcedOut}`);
    const after = runNode(['-e', "console.log(require('llama-branch').systemInfo())"], project, env);
    if (after.status !== 0 || !/CPU_VARIANT/.test(after.stdout))
      die(`after the failed source build the prebuilt no longer loads: ${after.stderr}`);
    log(
      'LLAMA_BRANCH_BUILD_FROM_SOURCE=1: the install script builds (and without cargo fails with the rustup hint); the prebuilt still loads',
    );

    log(`ok in ${formatDuration(Date.now() - started)}`);
  } finally {
    if (process.env.KEEP_PACK_DIR === '1') log(`kept ${dir}`);
    else fs.rmSync(dir, { recursive: true, force: true });
  }
}

if (require.main === module) main();

module.exports = { ensureTarballs, noCompilerEnv, COMPILERS, INSTALL_LIMIT_MS };
