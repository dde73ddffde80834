'use strict';

/**
 * The one helper module of the scripts in this folder: where things are (repository, cargo
 * target dir, addon), the build's settings (LLAMA_BRANCH_FEATURES, LLAMA_BRANCH_CPU), finding
 * cargo and npm, running commands (with a heartbeat for long builds), the system packages a
 * source build needs and installing them with apt, and logging. No npm dependencies: build.js
 * runs as the `install` script, before devDependencies may exist.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');

/** Absolute path of the package root (the directory holding package.json). */
const repoRoot = path.resolve(__dirname, '..');

/**
 * Cargo target directory used by every script.
 *
 * Respects CARGO_TARGET_DIR when set. Otherwise defaults to a per-user cache
 * (`~/.cache/llama-branch/target`) instead of `<repo>/target`, so that fresh
 * clones and reinstalls on the same machine reuse the compiled llama.cpp
 * (the expensive part of the build) rather than recompiling it from scratch.
 */
function targetDir() {
  const fromEnv = process.env.CARGO_TARGET_DIR;
  if (fromEnv && fromEnv.trim() !== '') return path.resolve(repoRoot, fromEnv);
  // One folder per feature set that changes llama.cpp: switching between a CPU and a GPU build
  // then recompiles nothing. (`bench` only adds a Rust function: same folder.)
  const name = ['target', ...featureList().filter((f) => f !== 'bench')].join('-');
  const home = os.homedir();
  if (!home) return path.join(repoRoot, name);
  return path.join(home, '.cache', 'llama-branch', name);
}

/** Cargo features from LLAMA_BRANCH_FEATURES (comma or space separated), sorted. */
function featureList() {
  return (process.env.LLAMA_BRANCH_FEATURES || '')
    .split(/[\s,]+/)
    .filter(Boolean)
    .sort();
}

/**
 * Extra cargo arguments selecting optional backends, from the env var
 * LLAMA_BRANCH_FEATURES (e.g. "cuda" or "vulkan"; comma or space separated).
 *
 * Every cargo invocation (build and test) must use the same feature set:
 * a different set changes the llama-cpp-sys-2 fingerprint and recompiles
 * llama.cpp.
 */
function featureArgs() {
  const features = featureList();
  return features.length ? ['--features', features.join(',')] : [];
}

/**
 * The CPU the build targets, from LLAMA_BRANCH_CPU (every cargo call must use the same value:
 * a different one recompiles llama.cpp):
 *   native (default) this machine's whole instruction set, AVX-512 included where present, for
 *                    the Rust code and ggml (GGML_NATIVE). The addon may not run on an older CPU,
 *                    so do not ship such a build to other machines;
 *   portable         x86-64-v3 (AVX2, FMA, BMI2, F16C) on x86-64, the generic target elsewhere:
 *                    for prebuilt packages;
 *   <name>           any rustc target-cpu name, e.g. x86-64-v4 or znver4.
 * `.cargo/config.toml` holds the native default; any other choice replaces it with a
 * `target.'cfg(all())'.rustflags` entry on the cargo command line (which takes precedence over
 * build.rustflags). Never RUSTFLAGS: it would also be seen by every other cargo build.
 */
function cpuArgs() {
  const choice = cpuChoice();
  if (choice === 'native') return [];
  const cpu = choice === 'portable' ? (process.arch === 'x64' ? 'x86-64-v3' : 'generic') : choice;
  return targetCpuArgs(cpu);
}

/** LLAMA_BRANCH_CPU: 'native' (default), 'portable' or a target-cpu name; exits on anything else. */
function cpuChoice() {
  const choice = (process.env.LLAMA_BRANCH_CPU || 'native').trim() || 'native';
  if (!/^[A-Za-z0-9_.-]+$/.test(choice)) {
    console.error(`error: LLAMA_BRANCH_CPU must be native, portable or a target-cpu name, got "${choice}"`);
    process.exit(2);
  }
  return choice;
}

/** Cargo arguments compiling the Rust code, and through the sys crate ggml, for rustc target-cpu `cpu`. */
function targetCpuArgs(cpu) {
  return ['--config', `target.'cfg(all())'.rustflags=["-C", "target-cpu=${cpu}"]`];
}

/**
 * Environment for cargo child processes: the caller's environment plus the resolved
 * CARGO_TARGET_DIR and the folder for the native typings (the same value for every cargo call,
 * or cargo would rerun the build script each time). RUSTFLAGS is deliberately left untouched
 * (and never set here): it would replace the target-cpu flags from .cargo/config.toml and
 * force a full llama.cpp rebuild.
 */
function cargoEnv() {
  const env = { ...process.env, CARGO_TARGET_DIR: targetDir(), NAPI_TYPE_DEF_TMP_FOLDER: typeDefFolder() };
  fs.mkdirSync(env.NAPI_TYPE_DEF_TMP_FOLDER, { recursive: true });
  const cpuFile = nativeCpuFile(env.CARGO_TARGET_DIR);
  if (cpuFile) env.CCACHE_EXTRAFILES = [env.CCACHE_EXTRAFILES, cpuFile].filter(Boolean).join(path.delimiter);
  return env;
}

/**
 * For a native build, a file naming this CPU's instruction-set flags, which ccache adds to its
 * hash: `-march=native` looks the same on every host, so a cache shared between machines could
 * otherwise hand objects built for another CPU (ccache issue #824). Null when not needed.
 */
function nativeCpuFile(target) {
  if (cpuChoice() !== 'native' || process.platform !== 'linux') return null;
  try {
    const flags = fs
      .readFileSync('/proc/cpuinfo', 'utf8')
      .split('\n')
      .find((l) => /^(flags|Features)\s*:/.test(l));
    if (!flags) return null;
    const file = path.join(target, 'native-cpu-flags.txt');
    const content = `${os.arch()} ${flags.split(':')[1].trim()}\n`;
    let current = null;
    try {
      current = fs.readFileSync(file, 'utf8');
    } catch {
      // first build in this target dir
    }
    if (current !== content) {
      fs.mkdirSync(target, { recursive: true });
      fs.writeFileSync(file, content);
    }
    return file;
  } catch {
    return null;
  }
}

/**
 * llama.cpp build directories in this target dir configured before GGML_RPC=ON became part of
 * every build (.cargo/config.toml). The sys crate runs CMake's configure step only once per build
 * directory, so a new GGML_* setting never reaches an existing one; build.rs refuses such a build.
 * Returns true when `cargo clean -p llama-cpp-sys-2` is needed (once; ccache makes it cheap).
 */
function staleLlamaBuild(target = targetDir()) {
  for (const profile of ['release', 'debug']) {
    const dir = path.join(target, profile, 'build');
    let names = [];
    try {
      names = fs.readdirSync(dir).filter((n) => n.startsWith('llama-cpp-sys-2-'));
    } catch {
      continue;
    }
    for (const name of names) {
      const cache = path.join(dir, name, 'out', 'build', 'CMakeCache.txt');
      let text;
      try {
        text = fs.readFileSync(cache, 'utf8');
      } catch {
        continue;
      }
      if (!/^GGML_RPC:[A-Z]*=ON$/m.test(text)) return true;
    }
  }
  return false;
}

/**
 * Cleans a stale llama.cpp build (see staleLlamaBuild) before a compiling cargo call, in `target`
 * with `env` (default: the dev target dir and cargoEnv()).
 */
function cleanStaleLlamaBuild(target = targetDir(), env = undefined) {
  if (!staleLlamaBuild(target)) return;
  console.error(
    `[llama-branch] llama.cpp in ${target} was built without GGML_RPC; cleaning it once (cargo clean -p llama-cpp-sys-2)`,
  );
  const cleanEnv = env || cargoEnv();
  for (const profile of [['--release'], []]) {
    run('cargo', ['clean', ...profile, '-p', 'llama-cpp-sys-2'], { env: { ...cleanEnv, CARGO_TARGET_DIR: target } });
  }
}

/**
 * File name cargo gives the cdylib on the current platform.
 */
function cdylibName() {
  switch (process.platform) {
    case 'win32':
      return 'llama_branch.dll';
    case 'darwin':
      return 'libllama_branch.dylib';
    default:
      return 'libllama_branch.so';
  }
}

/**
 * Where napi-derive records the TypeScript signatures of the #[napi] items while the crate
 * compiles (NAPI_TYPE_DEF_TMP_FOLDER, set by build.js): one folder per checkout, since the
 * cargo target dir is shared between checkouts. scripts/native-typings.js reads it.
 */
function typeDefFolder() {
  const key = require('node:crypto').createHash('sha256').update(repoRoot).digest('hex').slice(0, 12);
  return path.join(targetDir(), 'napi-typedefs', key);
}

function typeDefFile() {
  return path.join(typeDefFolder(), 'llama-branch');
}

/** Where build.js puts the loadable addon. */
const addonPath = path.join(repoRoot, 'build', 'llama_branch.node');

/**
 * Locate an executable on PATH (like `which`). Returns its absolute path or
 * null. Handles PATHEXT on Windows.
 */
function which(cmd) {
  const dirs = (process.env.PATH || '').split(path.delimiter).filter(Boolean);
  const exts = process.platform === 'win32' ? ['', ...(process.env.PATHEXT || '.EXE;.CMD;.BAT;.COM').split(';')] : [''];
  for (const dir of dirs) {
    for (const ext of exts) {
      const candidate = path.join(dir, cmd + ext);
      try {
        const st = fs.statSync(candidate);
        if (!st.isFile()) continue;
        if (process.platform !== 'win32') fs.accessSync(candidate, fs.constants.X_OK);
        return candidate;
      } catch {
        // not here; keep looking
      }
    }
  }
  return null;
}

/** True when running as root (who may install system packages). */
function isRoot() {
  return typeof process.getuid === 'function' && process.getuid() === 0;
}

/** True on a Debian-family Linux with apt-get. */
function hasApt() {
  return process.platform === 'linux' && which('apt-get') !== null && fs.existsSync('/etc/debian_version');
}

/**
 * Locate cargo. rustup installs into ~/.cargo/bin, which is often not on PATH
 * in non-login shells (CI, npm hooks); in that case it is added to PATH for
 * this process and its children.
 */
function findCargo() {
  const onPath = which('cargo');
  if (onPath) return onPath;
  const cargoHome = process.env.CARGO_HOME || path.join(os.homedir(), '.cargo');
  const candidate = path.join(cargoHome, 'bin', process.platform === 'win32' ? 'cargo.exe' : 'cargo');
  if (fs.existsSync(candidate)) {
    process.env.PATH = `${path.dirname(candidate)}${path.delimiter}${process.env.PATH || ''}`;
    return candidate;
  }
  return null;
}

/**
 * Run a command with inherited stdio and return its exit code.
 * A failure to start (e.g. ENOENT) or death by signal yields a non-zero code
 * and a message on stderr instead of an exception.
 *
 * @param {string} cmd
 * @param {string[]} args
 * @param {import('node:child_process').SpawnSyncOptions} [opts]
 * @returns {number}
 */
function run(cmd, args, opts = {}) {
  const res = spawnSync(cmd, args, { stdio: 'inherit', cwd: repoRoot, ...opts });
  if (res.error) {
    console.error(`error: could not run ${cmd}: ${res.error.message}`);
    return 127;
  }
  if (res.signal) {
    console.error(`error: ${cmd} was killed by ${res.signal}`);
    const signo = os.constants.signals[res.signal];
    return signo ? 128 + signo : 1;
  }
  return res.status === null ? 1 : res.status;
}

/**
 * Runs `cmd` and resolves its exit code. Without a terminal (CI, npm install logs) a long build
 * shows no progress for minutes, so `log` gets a heartbeat line every `every` ms. `onStdout`, when
 * given, receives stdout line by line instead of the terminal.
 */
function spawnWithHeartbeat(cmd, args, { env = process.env, log, every = 30000, onStdout = null } = {}) {
  return new Promise((resolve) => {
    const started = Date.now();
    const child = spawn(cmd, args, { cwd: repoRoot, env, stdio: ['ignore', onStdout ? 'pipe' : 'inherit', 'inherit'] });
    const heartbeat = process.stderr.isTTY
      ? null
      : setInterval(() => log(`still building (${formatDuration(Date.now() - started)} so far) ...`), every);
    if (onStdout) {
      let pending = '';
      child.stdout.setEncoding('utf8');
      child.stdout.on('data', (chunk) => {
        const lines = (pending + chunk).split('\n');
        pending = lines.pop();
        lines.forEach(onStdout);
      });
    }
    const finish = (code) => {
      if (heartbeat) clearInterval(heartbeat);
      resolve(code);
    };
    child.on('error', (e) => {
      log(`could not run ${cmd}: ${e.message}`);
      finish(127);
    });
    child.on('close', (code, signal) => finish(signal ? 1 : code));
  });
}

/**
 * npm's own npm-cli.js: the npm running this script (npm_execpath), else the one on PATH. Run
 * with this node (`npmCommand`), it works where npm itself is not on PATH.
 */
function npmCli() {
  if (process.env.npm_execpath && /npm-cli\.js$/.test(process.env.npm_execpath)) return process.env.npm_execpath;
  const res = spawnSync(process.platform === 'win32' ? 'npm.cmd' : 'npm', ['root', '-g'], {
    encoding: 'utf8',
    shell: process.platform === 'win32',
  });
  const cli = path.join(String(res.stdout).trim(), 'npm', 'bin', 'npm-cli.js');
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

// --- System packages of a source build -------------------------------------------------------

/** Names in `dir` matching `re` (empty if `dir` is unreadable). */
function listMatching(dir, re) {
  try {
    return fs.readdirSync(dir).filter((name) => re.test(name));
  } catch {
    return [];
  }
}

/** Path of a libclang shared library on Linux (the C API bindgen needs), or null. */
function findLibclang() {
  const dirs = process.env.LIBCLANG_PATH ? [process.env.LIBCLANG_PATH] : [];
  for (const llvm of listMatching('/usr/lib', /^llvm-\d+/)) dirs.push(`/usr/lib/${llvm}/lib`);
  for (const base of ['/usr/lib', '/lib'])
    for (const multiarch of listMatching(base, /-linux-(gnu|musl)/)) dirs.push(`${base}/${multiarch}`);
  dirs.push('/usr/lib64', '/usr/lib', '/usr/local/lib', '/usr/local/lib64');
  const re = /^libclang(-[0-9.]+)?\.so(\.[0-9]+)*$/;
  for (const dir of dirs) {
    const hit = listMatching(dir, re)[0];
    if (hit) return path.join(dir, hit);
  }
  const res = spawnSync('ldconfig', ['-p'], { encoding: 'utf8' }); // last resort: the linker cache
  const line =
    !res.error && res.status === 0 && res.stdout.split('\n').find((l) => /\blibclang(-[0-9.]+)?\.so/.test(l));
  return line ? line.split('=>').pop().trim() : null;
}

/** Folder of clang's resource headers (stdbool.h, ...), which bindgen needs to parse llama.h; or null. */
function findClangHeaders() {
  const roots = process.env.LIBCLANG_PATH ? [path.join(process.env.LIBCLANG_PATH, 'clang')] : [];
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
 * What a source build lacks on this system: `[{ what, apt }]` (a readable name and the Debian
 * package providing it). Cargo itself is not an apt package: see `findCargo`.
 */
function missingBuildTools() {
  const missing = [];
  if (!which('cmake')) missing.push({ what: 'cmake (builds llama.cpp)', apt: 'cmake' });
  if (process.platform !== 'linux') return missing;
  if (!which('make') && !which('ninja')) missing.push({ what: 'make (cmake build tool)', apt: 'make' });
  if (!process.env.CXX && !which('c++') && !which('g++') && !which('clang++'))
    missing.push({ what: 'a C++ compiler (g++)', apt: 'g++' });
  if (!findLibclang()) missing.push({ what: 'libclang (needed by bindgen)', apt: 'libclang-dev' });
  if (!process.env.BINDGEN_EXTRA_CLANG_ARGS && !findClangHeaders())
    missing.push({ what: 'clang resource headers, e.g. stdbool.h (needed by bindgen)', apt: 'libclang-dev' });
  return missing;
}

/** The apt-get command installing `packages`, as a user would type it. */
function aptCommand(packages) {
  return `${isRoot() ? '' : 'sudo '}apt-get install -y --no-install-recommends ${[...new Set(packages)].join(' ')}`;
}

/**
 * Installs `packages` with apt-get, as root or through `sudo -n` (never asking for a password);
 * false when that is not possible here or apt fails. Only setup and CI scripts call this: the
 * npm `install` script never installs system packages.
 */
function aptInstall(packages, log) {
  const sudo = isRoot() ? [] : which('sudo') ? ['sudo', '-n'] : null;
  if (!hasApt() || !sudo) return false;
  const unique = [...new Set(packages)];
  const env = { ...process.env, DEBIAN_FRONTEND: 'noninteractive' };
  const apt = (args) =>
    sudo.length ? run(sudo[0], [...sudo.slice(1), 'apt-get', ...args], { env }) : run('apt-get', args, { env });
  log(`installing with apt-get: ${unique.join(' ')}`);
  if (apt(['update']) !== 0) log('warning: apt-get update failed; trying the existing package lists');
  return apt(['install', '-y', '--no-install-recommends', ...unique]) === 0;
}

/**
 * The Chromium the browser tests drive (`npm run test:ui`): LLAMA_BRANCH_BROWSER, else Debian's
 * chromium (or another system Chromium/Chrome); null when none is installed.
 */
function browserPath() {
  const candidates = [
    process.env.LLAMA_BRANCH_BROWSER,
    '/usr/bin/chromium',
    '/usr/bin/chromium-browser',
    '/usr/bin/google-chrome',
  ];
  return candidates.find((p) => p && fs.existsSync(p)) || null;
}

/** Human-readable duration, e.g. "4m 12s" or "850 ms". */
function formatDuration(ms) {
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const totalSeconds = ms / 1000;
  if (totalSeconds < 60) return `${totalSeconds.toFixed(1)}s`;
  const minutes = Math.floor(totalSeconds / 60);
  const seconds = Math.round(totalSeconds - minutes * 60);
  return `${minutes}m ${String(seconds).padStart(2, '0')}s`;
}

module.exports = {
  repoRoot,
  browserPath,
  targetDir,
  featureList,
  featureArgs,
  cpuArgs,
  targetCpuArgs,
  cpuChoice,
  cargoEnv,
  staleLlamaBuild,
  cleanStaleLlamaBuild,
  typeDefFolder,
  typeDefFile,
  cdylibName,
  addonPath,
  which,
  isRoot,
  hasApt,
  findCargo,
  run,
  spawnWithHeartbeat,
  npmCli,
  npmCommand,
  logger,
  missingBuildTools,
  aptCommand,
  aptInstall,
  formatDuration,
};
