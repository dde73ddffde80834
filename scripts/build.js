#!/usr/bin/env node
'use strict';

/**
 * Build the native addon (release mode) and install it as build/llama_branch.node.
 *
 * Runs as the npm `install` script, so it must work on a fresh machine with
 * no devDependencies installed. Steps:
 *   0. if the prebuilt platform package (e.g. llama-branch-linux-x64-gnu, an optional
 *      dependency) is installed and loads on this machine, stop: nothing to compile. The check
 *      runs in a child process, so a binary this machine cannot run fails the check, not the
 *      install. LLAMA_BRANCH_BUILD_FROM_SOURCE=1 skips it and always builds;
 *   1. check prerequisites (cargo, cmake, C/C++ toolchain, libclang + clang
 *      resource headers for bindgen); as root on Debian/Ubuntu missing system
 *      packages are installed with apt-get, otherwise one clear message says
 *      what to install;
 *   2. `cargo build --release [--features ...]` with a shared CARGO_TARGET_DIR
 *      (default ~/.cache/llama-branch/target) so rebuilds in fresh clones are cheap;
 *   3. copy the cdylib to build/llama_branch.node (atomically, via rename) and record the
 *      features and CPU target it was built with in build/llama_branch.json (the loader uses
 *      it to tell a GPU build from a CPU one).
 * With the `vulkan` feature, step 1 also finds or installs the Vulkan build tools and headers
 * (scripts/vulkan.js).
 *
 * Arguments: --out DIR  install llama_branch.node (and .json) into DIR instead of build/ (the
 *                       GPU test keeps its Vulkan build beside the CPU one this way).
 *
 * Environment:
 *   CARGO_TARGET_DIR          cargo target directory (default ~/.cache/llama-branch/target, or
 *                             target-<features> for a build with features)
 *   LLAMA_BRANCH_FEATURES     cargo features to enable, e.g. "cuda", "vulkan", "metal"
 *   LLAMA_BRANCH_CPU          native (default: this machine's full instruction set) or portable
 *                             (x86-64-v3), or a rustc target-cpu name; see scripts/env.js
 *   LLAMA_BRANCH_SKIP_BUILD=1 do nothing if build/llama_branch.node already exists
 *   LLAMA_BRANCH_BUILD_FROM_SOURCE=1  build even when a prebuilt binary would load
 */

const fs = require('node:fs');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { prepareVulkanBuild } = require('./vulkan');
const {
  repoRoot,
  targetDir,
  featureList,
  featureArgs,
  cpuArgs,
  cargoEnv,
  cleanStaleLlamaBuild,
  cdylibName,
  addonPath,
  which,
  isRoot,
  hasApt,
  findCargo,
  run,
  formatDuration,
} = require('./env');

/** Debian/Ubuntu packages providing cmake, libclang and the clang resource headers. */
const APT_PACKAGES = ['cmake', 'libclang1-14', 'libclang-common-14-dev', 'ccache'];
/** Fallback when the versioned clang 14 packages do not exist (newer distributions). */
const APT_PACKAGES_FALLBACK = ['cmake', 'libclang-dev', 'ccache'];

function log(msg) {
  console.error(`[llama-branch] ${msg}`);
}

/** Names in `dir` matching `re` (empty if `dir` is unreadable). */
function listMatching(dir, re) {
  try {
    return fs.readdirSync(dir).filter((name) => re.test(name));
  } catch {
    return [];
  }
}

/** Library directories bindgen's clang-sys searches for libclang on Linux. */
function libclangSearchDirs() {
  const dirs = [];
  if (process.env.LIBCLANG_PATH) dirs.push(process.env.LIBCLANG_PATH);
  for (const llvm of listMatching('/usr/lib', /^llvm-\d+/)) dirs.push(`/usr/lib/${llvm}/lib`);
  for (const base of ['/usr/lib', '/lib']) {
    for (const multiarch of listMatching(base, /-linux-(gnu|musl)/)) dirs.push(`${base}/${multiarch}`);
  }
  dirs.push('/usr/lib64', '/usr/lib', '/usr/local/lib', '/usr/local/lib64');
  return dirs;
}

/** Path of a libclang shared library on Linux, or null. (Not libclang-cpp: bindgen needs the C API.) */
function findLibclang() {
  const re = /^libclang(-[0-9.]+)?\.so(\.[0-9]+)*$/;
  for (const dir of libclangSearchDirs()) {
    const hit = listMatching(dir, re)[0];
    if (hit) return path.join(dir, hit);
  }
  // Last resort: the dynamic linker cache.
  const res = spawnSync('ldconfig', ['-p'], { encoding: 'utf8' });
  if (!res.error && res.status === 0) {
    const line = res.stdout.split('\n').find((l) => /\blibclang(-[0-9.]+)?\.so/.test(l));
    if (line) return line.split('=>').pop().trim();
  }
  return null;
}

/**
 * Directory holding clang's resource headers (stdbool.h, stddef.h, ...),
 * which bindgen needs to parse llama.h; or null.
 */
function findClangHeaders() {
  const roots = [];
  if (process.env.LIBCLANG_PATH) roots.push(path.join(process.env.LIBCLANG_PATH, 'clang'));
  for (const llvm of listMatching('/usr/lib', /^llvm-\d+/)) roots.push(`/usr/lib/${llvm}/lib/clang`);
  roots.push('/usr/lib/clang', '/usr/lib64/clang', '/usr/local/lib/clang');
  for (const root of roots) {
    for (const version of listMatching(root, /^\d/)) {
      const include = path.join(root, version, 'include');
      if (fs.existsSync(path.join(include, 'stdbool.h'))) return include;
    }
  }
  return null;
}

/**
 * Check system prerequisites. Returns a list of human-readable problems that
 * apt packages can fix (empty when all is well). Exits directly if cargo is
 * missing, since that is not an apt package we want to install.
 */
function checkSystem() {
  if (!findCargo()) {
    console.error(
      '\n[llama-branch] ERROR: the Rust toolchain (cargo) was not found.\n' +
        '  llama-branch compiles a native addon from source. Install Rust with rustup:\n' +
        "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y\n" +
        '  then open a new shell (or run: . "$HOME/.cargo/env") and retry.\n',
    );
    process.exit(1);
  }

  const missing = [];
  if (!which('cmake')) missing.push('cmake (builds llama.cpp)');
  if (process.platform === 'linux') {
    if (!which('make') && !which('ninja')) missing.push('make (cmake build tool)');
    if (!process.env.CXX && !which('c++') && !which('g++') && !which('clang++')) {
      missing.push('a C++ compiler (g++)');
    }
    if (!findLibclang()) missing.push('libclang (needed by bindgen)');
    if (!process.env.BINDGEN_EXTRA_CLANG_ARGS && !findClangHeaders()) {
      missing.push('clang resource headers, e.g. stdbool.h (needed by bindgen)');
    }
  }
  return missing;
}

/** Extra apt packages for missing basics that the fixed list does not cover. */
function extraAptPackages(missing) {
  const extra = [];
  if (missing.some((m) => m.startsWith('make'))) extra.push('make');
  if (missing.some((m) => m.startsWith('a C++ compiler'))) extra.push('g++');
  return extra;
}

/** True if apt knows a candidate version of `pkg` (after `apt-get update`). */
function aptHasPackage(pkg) {
  const res = spawnSync('apt-cache', ['policy', pkg], { encoding: 'utf8' });
  return !res.error && res.status === 0 && /Candidate:\s*(?!\(none\))\S+/.test(res.stdout);
}

/** Install the build prerequisites with apt-get (as root). Exits on failure. */
function aptInstall(missing) {
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  log(`installing missing build prerequisites with apt-get: ${missing.join('; ')}`);
  if (run('apt-get', ['update'], { env }) !== 0) {
    log('warning: apt-get update failed; trying to install from the existing package lists');
  }
  const base = aptHasPackage('libclang1-14') ? APT_PACKAGES : APT_PACKAGES_FALLBACK;
  const packages = [...base, ...extraAptPackages(missing)];
  const code = run('apt-get', ['install', '-y', '--no-install-recommends', ...packages], { env });
  if (code !== 0) {
    log(`ERROR: apt-get install ${packages.join(' ')} failed (exit code ${code})`);
    process.exit(code);
  }
}

/** Print one actionable message for a non-root / non-Debian user and exit 1. */
function explainMissingAndExit(missing) {
  const extra = extraAptPackages(missing);
  const aptCmd = ['sudo apt-get install -y cmake libclang1-14 libclang-common-14-dev', ...extra].join(' ');
  let how;
  if (hasApt()) {
    how = `  Install them with:\n    ${aptCmd}\n`;
  } else if (process.platform === 'darwin') {
    how = '  Install them with:\n    xcode-select --install && brew install cmake\n';
  } else {
    how =
      '  Install cmake, a C++ compiler and libclang with your package manager, e.g.\n' +
      '    Debian/Ubuntu: ' + aptCmd + '\n' +
      '    Fedora:        sudo dnf install -y cmake gcc-c++ clang-devel\n' +
      '  (or point LIBCLANG_PATH at the directory containing libclang.so)\n';
  }
  console.error(
    '\n[llama-branch] ERROR: missing build prerequisites:\n' +
      missing.map((m) => `  - ${m}\n`).join('') +
      how,
  );
  process.exit(1);
}

function ensurePrerequisites() {
  let missing = checkSystem();
  if (missing.length === 0) return;
  if (!(isRoot() && hasApt())) explainMissingAndExit(missing);
  aptInstall(missing);
  missing = checkSystem();
  if (missing.length > 0) {
    log('ERROR: still missing after apt-get install:');
    explainMissingAndExit(missing);
  }
}

/** Copy the built library into build/ via a temp file + rename, so a process
 *  that has the previous addon loaded keeps a valid mapping. */
function installAddon(builtLib, dest) {
  fs.mkdirSync(path.dirname(dest), { recursive: true });
  const tmp = `${dest}.${process.pid}.tmp`;
  try {
    fs.copyFileSync(builtLib, tmp);
    fs.renameSync(tmp, dest);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
  const cpu = (process.env.LLAMA_BRANCH_CPU || 'native').trim() || 'native';
  fs.writeFileSync(dest.replace(/\.node$/, '.json'), `${JSON.stringify({ features: featureList(), cpu }, null, 2)}\n`);
}

/** Where to install the addon: build/llama_branch.node, or DIR/llama_branch.node with --out DIR. */
function destination(argv = process.argv.slice(2)) {
  const i = argv.indexOf('--out');
  if (i === -1) return addonPath;
  if (!argv[i + 1]) {
    log('ERROR: --out needs a folder');
    process.exit(2);
  }
  return path.resolve(repoRoot, argv[i + 1], path.basename(addonPath));
}

/**
 * Whether the prebuilt platform package loads here: { ok: true, name, info } or { ok: false,
 * reason }. Loaded in a child process (lib/loader.js, then systemInfo()), so that a crash of a
 * binary this machine cannot run only fails the check.
 */
function probePrebuilt() {
  const program = `
    const loader = require(${JSON.stringify(path.join(repoRoot, 'lib', 'loader.js'))});
    try {
      const { binding, name } = loader.loadPlatformPackage();
      process.stdout.write(JSON.stringify({ name, info: binding.systemInfo() }));
    } catch (e) {
      process.stderr.write(e.message);
      process.exit(1);
    }`;
  const res = spawnSync(process.execPath, ['-e', program], { encoding: 'utf8', timeout: 120000 });
  if (res.error) return { ok: false, reason: res.error.message };
  if (res.signal) return { ok: false, reason: `loading it killed the process with ${res.signal}` };
  if (res.status !== 0) return { ok: false, reason: (res.stderr || `exit code ${res.status}`).trim().split('\n')[0] };
  try {
    return { ok: true, ...JSON.parse(res.stdout) };
  } catch {
    return { ok: false, reason: `unexpected output: ${res.stdout.slice(0, 200)}` };
  }
}

/**
 * Runs cargo with inherited stdio; resolves its exit code. Without a terminal (CI, npm install
 * logs) cargo shows no progress bar and llama.cpp's cmake build is silent for minutes, so a
 * heartbeat line says the build is still running.
 */
function runCargo(args, env) {
  return new Promise((resolve) => {
    const started = Date.now();
    const child = spawn('cargo', args, { stdio: 'inherit', cwd: repoRoot, env });
    const heartbeat = process.stderr.isTTY
      ? null
      : setInterval(() => log(`still building (${formatDuration(Date.now() - started)} so far) ...`), 30000);
    const finish = (code) => {
      if (heartbeat) clearInterval(heartbeat);
      resolve(code);
    };
    child.on('error', (e) => {
      log(`ERROR: could not run cargo: ${e.message}`);
      finish(127);
    });
    child.on('close', (code, signal) => finish(signal ? 1 : code));
  });
}

async function main() {
  const dest = destination();
  if (process.env.LLAMA_BRANCH_SKIP_BUILD === '1' && fs.existsSync(dest)) {
    log(`LLAMA_BRANCH_SKIP_BUILD=1 and ${path.relative(repoRoot, dest)} exists; skipping build`);
    return;
  }

  if (process.env.LLAMA_BRANCH_BUILD_FROM_SOURCE === '1' || featureList().length > 0) {
    log(featureList().length > 0 ? `features ${featureList().join(', ')}: building from source` : 'LLAMA_BRANCH_BUILD_FROM_SOURCE=1: building from source');
  } else {
    const prebuilt = probePrebuilt();
    if (prebuilt.ok) {
      const variant = /CPU_VARIANT = (\S+)/.exec(prebuilt.info);
      log(`using the prebuilt binary from ${prebuilt.name}${variant ? ` (CPU variant ${variant[1]})` : ''}; nothing to compile`);
      log('(set LLAMA_BRANCH_BUILD_FROM_SOURCE=1 and run `npm rebuild llama-branch` to compile for this machine instead)');
      return;
    }
    log(`no usable prebuilt binary (${prebuilt.reason}); building from source`);
  }

  ensurePrerequisites();
  const backendEnv = featureList().includes('vulkan') ? prepareVulkanBuild() : {};

  cleanStaleLlamaBuild();
  const target = targetDir();
  const args = ['build', '--release', ...featureArgs(), ...cpuArgs()];
  log('building native addon (first build compiles llama.cpp: ~3-6 min on 2 cores, ~10 with Vulkan) ...');
  log(`cargo ${args.join(' ')}  (CARGO_TARGET_DIR=${target})`);
  const started = Date.now();
  const code = await runCargo(args, { ...cargoEnv(), ...backendEnv });
  const elapsed = formatDuration(Date.now() - started);
  if (code !== 0) {
    log(`ERROR: cargo build failed (exit code ${code}) after ${elapsed}`);
    process.exit(code);
  }

  const builtLib = path.join(target, 'release', cdylibName());
  if (!fs.existsSync(builtLib)) {
    log(`ERROR: cargo succeeded but ${builtLib} does not exist`);
    process.exit(1);
  }
  installAddon(builtLib, dest);
  log(`built ${path.relative(repoRoot, dest)} in ${elapsed}`);
}

main().catch((e) => {
  log(`ERROR: ${e.stack || e.message}`);
  process.exit(1);
});
