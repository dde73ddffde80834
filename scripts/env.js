'use strict';

/**
 * The one helper module of scripts/: where things are, the build's settings
 * (LLAMA_BRANCH_FEATURES, LLAMA_BRANCH_CPU), finding cargo and npm, running commands (with a
 * heartbeat for long builds), the system packages a source build needs, apt, and logging. No npm
 * dependencies: build.js runs as the `install` script, before devDependencies may exist.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');

const repoRoot = path.resolve(__dirname, '..');
/** Where build.js puts the loadable addon. */
const addonPath = path.join(repoRoot, 'build', 'llama_branch.node');

/** Cargo features from LLAMA_BRANCH_FEATURES (comma or space separated), sorted. */
function featureList() {
  return (process.env.LLAMA_BRANCH_FEATURES || '')
    .split(/[\s,]+/)
    .filter(Boolean)
    .sort();
}

/**
 * The cargo target dir: CARGO_TARGET_DIR, else one per feature set under ~/.cache/llama-branch, so
 * that fresh clones reuse the compiled llama.cpp and switching CPU/GPU builds recompiles nothing.
 */
function targetDir() {
  if (process.env.CARGO_TARGET_DIR?.trim()) return path.resolve(repoRoot, process.env.CARGO_TARGET_DIR);
  const name = ['target', ...featureList().filter((f) => f !== 'bench')].join('-'); // bench adds Rust only
  return os.homedir() ? path.join(os.homedir(), '.cache', 'llama-branch', name) : path.join(repoRoot, name);
}

/** `--features ...`; every cargo call must pass the same set, or llama.cpp is recompiled. */
function featureArgs() {
  return featureList().length ? ['--features', featureList().join(',')] : [];
}

/** LLAMA_BRANCH_CPU: native (default), portable or a rustc target-cpu name; exits on anything else. */
function cpuChoice() {
  const choice = (process.env.LLAMA_BRANCH_CPU || '').trim() || 'native';
  if (!/^[A-Za-z0-9_.-]+$/.test(choice)) {
    console.error(`error: LLAMA_BRANCH_CPU must be native, portable or a target-cpu name, got "${choice}"`);
    process.exit(2);
  }
  return choice;
}

/** Cargo arguments compiling the Rust code, and through the sys crate ggml, for rustc target-cpu `cpu`. */
function targetCpuArgs(cpu) {
  // On the command line, this beats .cargo/config.toml's native default; never RUSTFLAGS, which
  // every other cargo build would see too.
  return ['--config', `target.'cfg(all())'.rustflags=["-C", "target-cpu=${cpu}"]`];
}

/** native: this machine's whole instruction set (not for shipping); portable: x86-64-v3 (AVX2) on x64. */
function cpuArgs() {
  const choice = cpuChoice();
  if (choice === 'native') return [];
  return targetCpuArgs(choice !== 'portable' ? choice : process.arch === 'x64' ? 'x86-64-v3' : 'generic');
}

/**
 * Where napi-derive records the `#[napi]` signatures: one folder per checkout (the target dir is
 * shared) and feature set (a `bench` build shares the target dir but adds a method).
 */
function typeDefFolder() {
  const key = require('node:crypto').createHash('sha256').update(repoRoot).digest('hex').slice(0, 12);
  return path.join(targetDir(), 'napi-typedefs', [key, ...featureList()].join('-'));
}

/** The environment of cargo calls: the target dir and typedef folder resolved (the same for every call). */
function cargoEnv() {
  const env = { ...process.env, CARGO_TARGET_DIR: targetDir(), NAPI_TYPE_DEF_TMP_FOLDER: typeDefFolder() };
  fs.mkdirSync(env.NAPI_TYPE_DEF_TMP_FOLDER, { recursive: true });
  const cpuFile = nativeCpuFile(env.CARGO_TARGET_DIR);
  if (cpuFile) env.CCACHE_EXTRAFILES = [env.CCACHE_EXTRAFILES, cpuFile].filter(Boolean).join(path.delimiter);
  return env;
}

/**
 * A file naming this CPU's flags, for ccache's hash: `-march=native` reads the same on every host,
 * so a shared cache could hand out objects built for another CPU (ccache issue #824).
 */
function nativeCpuFile(target) {
  if (cpuChoice() !== 'native' || process.platform !== 'linux') return null;
  try {
    const flags = /^(?:flags|Features)\s*:(.*)$/m.exec(fs.readFileSync('/proc/cpuinfo', 'utf8'))[1].trim();
    fs.mkdirSync(target, { recursive: true });
    fs.writeFileSync(path.join(target, 'native-cpu-flags.txt'), `${os.arch()} ${flags}\n`);
    return path.join(target, 'native-cpu-flags.txt');
  } catch {
    return null;
  }
}

/**
 * Removes llama.cpp's build from the cargo target dir `target` when it was configured without
 * llama-branch's ggml patch (.cargo/config.toml: CMAKE_PROJECT_ggml_INCLUDE, docs/determinism.md).
 * The sys crate reruns its build script only when a GGML_* variable that its last run saw
 * changes, so a target dir built before the patch existed keeps the unpatched llama.cpp (and
 * build.rs then refuses it). Reads the CMake caches only: nothing happens on a current build.
 *
 * A patched build whose cache names another checkout's patch (a target dir shared by several
 * checkouts or worktrees) is pointed at this checkout's file instead: the sys crate configures
 * CMake only once (`always_configure(false)`), so the path of the first checkout that built it
 * would otherwise stay, and a rebuild would take that checkout's patch, or fail once it is gone.
 * CMake reconfigures by itself when its cache changes; the patched ops.cpp is rewritten (and
 * recompiled) only if the two patches differ.
 */
function dropUnpatchedLlama(target, env) {
  const buildDir = path.join(target, 'release', 'build');
  const ours = path.join(__dirname, '..', 'patches', 'ggml', 'deterministic.cmake');
  let stale = false;
  try {
    for (const name of fs.readdirSync(buildDir)) {
      if (!name.startsWith('llama-cpp-sys-2-')) continue;
      const cache = path.join(buildDir, name, 'out', 'build', 'CMakeCache.txt');
      if (!fs.existsSync(cache)) continue;
      const text = fs.readFileSync(cache, 'utf8');
      const line = /^(CMAKE_PROJECT_ggml_INCLUDE\b[^=]*=)(.*deterministic\.cmake)$/m.exec(text);
      if (!line) {
        stale = true;
      } else if (line[2] !== ours) {
        fs.writeFileSync(
          cache,
          text.replace(line[0], () => line[1] + ours),
        );
      }
    }
  } catch {
    return; // no build yet
  }
  if (!stale) return;
  console.error(`[llama-branch] ${target} holds a llama.cpp built without the ggml patch: cleaning it (rebuilt next)`);
  run('cargo', ['clean', '--release', '-p', 'llama-cpp-sys-2'], { env: { ...env, CARGO_TARGET_DIR: target } });
}

/** File name cargo gives the cdylib on this platform. */
function cdylibName() {
  return { win32: 'llama_branch.dll', darwin: 'libllama_branch.dylib' }[process.platform] || 'libllama_branch.so';
}

/** Absolute path of an executable on PATH, or null. */
function which(cmd) {
  const exts = process.platform === 'win32' ? ['', ...(process.env.PATHEXT || '.EXE;.CMD;.BAT;.COM').split(';')] : [''];
  for (const dir of (process.env.PATH || '').split(path.delimiter).filter(Boolean)) {
    for (const ext of exts) {
      const file = path.join(dir, cmd + ext);
      try {
        fs.accessSync(file, fs.constants.X_OK);
        if (fs.statSync(file).isFile()) return file;
      } catch {
        // not here
      }
    }
  }
  return null;
}

const isRoot = () => process.getuid?.() === 0;
/** Debian or a derivative, with apt-get. */
const hasApt = () => process.platform === 'linux' && fs.existsSync('/etc/debian_version') && which('apt-get') !== null;

/** Cargo on PATH, else rustup's ~/.cargo/bin (often missing from PATH in CI and npm hooks: added). */
function findCargo() {
  if (which('cargo')) return which('cargo');
  const bin = path.join(process.env.CARGO_HOME || path.join(os.homedir(), '.cargo'), 'bin');
  if (!fs.existsSync(path.join(bin, process.platform === 'win32' ? 'cargo.exe' : 'cargo'))) return null;
  process.env.PATH = `${bin}${path.delimiter}${process.env.PATH || ''}`;
  return which('cargo');
}

/** Runs a command with inherited stdio; its exit code (127 when it cannot start, 128+n on signal n). */
function run(cmd, args, opts = {}) {
  const res = spawnSync(cmd, args, { stdio: 'inherit', cwd: repoRoot, ...opts });
  if (res.error) {
    console.error(`error: could not run ${cmd}: ${res.error.message}`);
    return 127;
  }
  if (!res.signal) return res.status ?? 1;
  console.error(`error: ${cmd} was killed by ${res.signal}`);
  return 128 + (os.constants.signals[res.signal] || 0);
}

/**
 * Resolves `cmd`'s exit code. Without a terminal (CI, npm install logs) a long build is silent for
 * minutes, so `log` gets a heartbeat every `every` ms. `onStdout` takes stdout line by line.
 */
function spawnWithHeartbeat(cmd, args, { env = process.env, log, every = 30000, onStdout = null } = {}) {
  return new Promise((resolve) => {
    const started = Date.now();
    const child = spawn(cmd, args, { cwd: repoRoot, env, stdio: ['ignore', onStdout ? 'pipe' : 'inherit', 'inherit'] });
    const beat = () => log(`still building (${formatDuration(Date.now() - started)} so far) ...`);
    const heartbeat = process.stderr.isTTY ? null : setInterval(beat, every);
    let pending = '';
    child.stdout?.setEncoding('utf8').on('data', (chunk) => {
      const lines = (pending + chunk).split('\n');
      pending = lines.pop();
      lines.forEach(onStdout);
    });
    const finish = (code) => {
      clearInterval(heartbeat);
      resolve(code);
    };
    child.on('error', (e) => {
      log(`could not run ${cmd}: ${e.message}`);
      finish(127);
    });
    child.on('close', (code, signal) => finish(signal ? 1 : code));
  });
}

/** npm's npm-cli.js (the npm running us, else the one on PATH): run with this node, it needs no PATH. */
function npmCli() {
  if (/npm-cli\.js$/.test(process.env.npm_execpath || '')) return process.env.npm_execpath;
  const root = spawnSync('npm', ['root', '-g'], { encoding: 'utf8', shell: process.platform === 'win32' });
  const cli = path.join(String(root.stdout).trim(), 'npm', 'bin', 'npm-cli.js');
  return fs.existsSync(cli) ? cli : null;
}

/** `[command, leading args]` that run npm. */
function npmCommand() {
  const cli = npmCli();
  return cli ? [process.execPath, [cli]] : ['npm', []];
}

/** A logger writing `[tag] message` to stderr; `.fail(message)` logs and exits 1. */
function logger(tag) {
  const log = (msg) => console.error(`[${tag}] ${msg}`);
  log.fail = (msg) => {
    console.error(`[${tag}] ERROR: ${msg}`);
    process.exit(1);
  };
  return log;
}

/** Human-readable duration, e.g. "4m 12s" or "850 ms". */
function formatDuration(ms) {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  if (ms < 60000) return `${(ms / 1000).toFixed(1)}s`;
  return `${Math.floor(ms / 60000)}m ${String(Math.floor((ms % 60000) / 1000)).padStart(2, '0')}s`;
}

// The system packages of a source build.
const SYSTEM_LIB_DIRS = ['/usr/lib64', '/usr/lib', '/usr/local/lib', '/usr/local/lib64'];
/** Names in folder `dir` matching `re`; none when it is not a readable folder (LIBCLANG_PATH may name a file). */
function listMatching(dir, re) {
  try {
    return fs.readdirSync(dir).filter((n) => re.test(n));
  } catch {
    return [];
  }
}
const llvmDirs = (sub) => listMatching('/usr/lib', /^llvm-\d+/).map((d) => `/usr/lib/${d}/${sub}`);

/** A libclang shared library (bindgen's C API), or null. */
function findLibclang() {
  const chosen = process.env.LIBCLANG_PATH; // a folder, or the library file itself
  if (chosen && fs.existsSync(chosen) && fs.statSync(chosen).isFile()) return chosen;
  const multiarch = ['/usr/lib', '/lib'].flatMap((b) => listMatching(b, /-linux-(gnu|musl)/).map((d) => `${b}/${d}`));
  const dirs = [chosen, ...llvmDirs('lib'), ...multiarch, ...SYSTEM_LIB_DIRS];
  for (const dir of dirs.filter(Boolean)) {
    const hit = listMatching(dir, /^libclang(-[0-9.]+)?\.so(\.[0-9]+)*$/)[0];
    if (hit) return path.join(dir, hit);
  }
  const cache = spawnSync('ldconfig', ['-p'], { encoding: 'utf8' }).stdout || ''; // last resort: the linker's cache
  const line = cache.split('\n').find((l) => /\blibclang(-[0-9.]+)?\.so/.test(l));
  return line ? line.split('=>').pop().trim() : null;
}

/** Whether clang's resource headers (stdbool.h ...), which bindgen needs to parse llama.h, exist. */
function hasClangHeaders() {
  const roots = [process.env.LIBCLANG_PATH && path.join(process.env.LIBCLANG_PATH, 'clang'), ...llvmDirs('lib/clang')];
  return [...roots, '/usr/lib/clang', '/usr/lib64/clang', '/usr/local/lib/clang']
    .filter(Boolean)
    .some((root) => listMatching(root, /^\d/).some((v) => fs.existsSync(path.join(root, v, 'include', 'stdbool.h'))));
}

/** What a source build lacks here: `[{ what, apt }]` (cargo is not an apt package: see findCargo). */
function missingBuildTools() {
  const missing = [];
  if (!which('cmake')) missing.push({ what: 'cmake (builds llama.cpp)', apt: 'cmake' });
  if (process.platform !== 'linux') return missing;
  if (!which('make') && !which('ninja')) missing.push({ what: 'make (cmake build tool)', apt: 'make' });
  if (!process.env.CXX && !['c++', 'g++', 'clang++'].some(which)) missing.push({ what: 'a C++ compiler', apt: 'g++' });
  if (!findLibclang()) missing.push({ what: 'libclang (needed by bindgen)', apt: 'libclang-dev' });
  if (!process.env.BINDGEN_EXTRA_CLANG_ARGS && !hasClangHeaders())
    missing.push({ what: "clang's resource headers, e.g. stdbool.h (needed by bindgen)", apt: 'libclang-dev' });
  return missing;
}

/** The apt-get command installing `packages`, as a user would type it. */
function aptCommand(packages) {
  return `${isRoot() ? '' : 'sudo '}apt-get install -y --no-install-recommends ${[...new Set(packages)].join(' ')}`;
}

/**
 * Installs `packages` with apt-get as root or through `sudo -n` (never asks for a password); false
 * when that is not possible or apt fails. Only setup and CI call this, never the install script.
 */
function aptInstall(packages, log) {
  const sudo = isRoot() ? [] : which('sudo') ? ['sudo', '-n'] : null;
  if (!hasApt() || !sudo) return false;
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const [cmd, ...prefix] = [...sudo, 'apt-get'];
  const apt = (args) => run(cmd, [...prefix, ...args], { env });
  log(`installing with apt-get: ${[...new Set(packages)].join(' ')}`);
  if (apt(['update']) !== 0) log('warning: apt-get update failed; trying the existing package lists');
  return apt(['install', '-y', '--no-install-recommends', ...new Set(packages)]) === 0;
}

/** The Chromium of `npm run test:ui`: LLAMA_BRANCH_BROWSER, else a system Chromium or Chrome; or null. */
function browserPath() {
  const candidates = [process.env.LLAMA_BRANCH_BROWSER, '/usr/bin/chromium', '/usr/bin/chromium-browser'];
  return [...candidates, '/usr/bin/google-chrome'].find((p) => p && fs.existsSync(p)) || null;
}

module.exports = {
  repoRoot,
  addonPath,
  featureList,
  targetDir,
  featureArgs,
  cpuChoice,
  targetCpuArgs,
  cpuArgs,
  typeDefFolder,
  cargoEnv,
  dropUnpatchedLlama,
  cdylibName,
  which,
  isRoot,
  hasApt,
  findCargo,
  run,
  spawnWithHeartbeat,
  npmCli,
  npmCommand,
  logger,
  formatDuration,
  missingBuildTools,
  aptCommand,
  aptInstall,
  browserPath,
};
