#!/usr/bin/env node
'use strict';

/**
 * `npm run build:prebuilt`: builds the prebuilt binary for this machine's platform and packs the two
 * tarballs an app installs without a compiler:
 *
 *   dist/llama-branch-<platform>-<version>.tgz   the platform package (npm/<platform>/): the
 *       addon, llama.cpp's shared libraries and every backend module ggml built (one CPU backend
 *       per instruction-set level, loaded at run time for the CPU at hand), all stripped;
 *   dist/llama-branch-<version>.tgz              the main package, whose optionalDependencies
 *       list every platform package packed into dist/ for this version.
 *
 * The build: `cargo build --release --features dynamic-backends` with a baseline target-cpu
 * (x86-64 for linux-x64-gnu: the Rust code and llama.cpp's non-CPU-backend code must run on any
 * CPU of the architecture; the speed comes from the CPU backend variants). It uses its own cargo
 * target directory, `<dev target dir>-prebuilt` (default ~/.cache/llama-branch/target-prebuilt;
 * LLAMA_BRANCH_PREBUILD_TARGET_DIR overrides it), so it never replaces the dev build's llama.cpp.
 * A cold build compiles llama.cpp with ~14 CPU variants: ~20 minutes on 2 cores (ccache helps
 * the next cold build). Only the platform of this machine can be built (no cross builds).
 *
 * Prints the size of each shipped file and of both tarballs.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const {
  repoRoot,
  targetDir,
  targetCpuArgs,
  findCargo,
  which,
  formatDuration,
  cleanStaleLlamaBuild,
  spawnWithHeartbeat,
  npmCommand,
  logger,
} = require('./env');
const { readDynamic } = require('./elf');
const { platformKey, platformPackageName } = require('../lib/loader');

/** Libraries every glibc Linux system has; a prebuilt may need nothing else from the system. */
const GLIBC_SYSTEM_LIBS = [
  'libc.so.6',
  'libm.so.6',
  'libdl.so.2',
  'libpthread.so.0',
  'librt.so.1',
  'libstdc++.so.6',
  'libgcc_s.so.1',
];

/**
 * The platforms of the napi-rs convention. Each gets a folder npm/<key>/ with its package.json;
 * `cpuBaseline` is the rustc target-cpu of the prebuilt (the oldest CPU it must run on: ggml's
 * CPU backend variants add the faster instruction sets at run time); `libExt` the extension of
 * its shared libraries; `systemLibs` what the shipped files may need from the system (anything
 * else fails the prebuild: a user's machine may lack it). Only linux-x64-gnu is built so far;
 * packing the others needs a machine of that platform and the shared-library collection for its
 * binary format (ELF only so far).
 */
const TARGETS = {
  'linux-x64-gnu': {
    os: 'linux',
    cpu: 'x64',
    libc: 'glibc',
    cpuBaseline: 'x86-64',
    libExt: '.so',
    systemLibs: [...GLIBC_SYSTEM_LIBS, 'ld-linux-x86-64.so.2'],
  },
  'linux-arm64-gnu': {
    os: 'linux',
    cpu: 'arm64',
    libc: 'glibc',
    cpuBaseline: 'generic',
    libExt: '.so',
    systemLibs: [...GLIBC_SYSTEM_LIBS, 'ld-linux-aarch64.so.1'],
  },
  'darwin-arm64': { os: 'darwin', cpu: 'arm64', cpuBaseline: 'apple-m1', libExt: '.dylib' },
  'win32-x64-msvc': { os: 'win32', cpu: 'x64', cpuBaseline: 'x86-64', libExt: '.dll' },
};

const distDir = path.join(repoRoot, 'dist');
const mainManifest = () => JSON.parse(fs.readFileSync(path.join(repoRoot, 'package.json'), 'utf8'));

const log = logger('build-prebuilt');
const die = log.fail;

/** Cargo target directory of prebuilt builds: separate from the dev build's. */
function prebuildTargetDir() {
  const fromEnv = process.env.LLAMA_BRANCH_PREBUILD_TARGET_DIR;
  return fromEnv && fromEnv.trim() !== '' ? path.resolve(fromEnv) : `${targetDir()}-prebuilt`;
}

/** File name of the addon inside platform package `key`. */
const addonFileName = (key) => `llama_branch.${key}.node`;

const sizeOf = (file) => fs.statSync(file).size;
const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

/**
 * Runs cargo build with JSON messages on stdout (diagnostics still rendered on stderr) and
 * resolves { code, addon, sysOutDir }: the cdylib it produced and the sys crate's OUT_DIR
 * (llama.cpp's libraries and backend modules).
 */
async function cargoBuild(args, env) {
  let addon = null;
  let sysOutDir = null;
  const onStdout = (line) => {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      return;
    }
    if (msg.reason === 'build-script-executed' && /[/#]llama-cpp-sys-2[@#]/.test(msg.package_id))
      sysOutDir = msg.out_dir;
    if (
      msg.reason === 'compiler-artifact' &&
      msg.target &&
      msg.target.kind.includes('cdylib') &&
      msg.target.name === 'llama_branch'
    ) {
      addon = msg.filenames.find((f) => /\.(so|dylib|dll)$/.test(f)) || addon;
    }
  };
  const code = await spawnWithHeartbeat('cargo', [...args, '--message-format=json-render-diagnostics'], {
    env,
    log,
    every: 60000,
    onStdout,
  });
  return { code, addon, sysOutDir };
}

/**
 * What the platform package must hold besides the addon (ELF platforms): every backend module
 * in the sys crate's backends folder (CPU variants now; RPC or GPU modules when a build adds
 * them), and every library that the addon or a module needs and llama.cpp's build produced
 * (libllama, libggml, libggml-base, libllama-common ...), found through DT_NEEDED. Libraries
 * not found there come from the system (libc, libstdc++). Returns [{ name, from }] and the
 * system libraries needed.
 */
function runtimeFiles(addon, sysOutDir, libExt, skip = () => false) {
  const backendsDir = path.join(sysOutDir, 'backends');
  const libDirs = ['lib', 'lib64', path.join('build', 'common'), path.join('build', 'bin')]
    .map((d) => path.join(sysOutDir, d))
    .filter((d) => fs.existsSync(d));
  const modules = fs.existsSync(backendsDir)
    ? fs
        .readdirSync(backendsDir)
        .filter((f) => f.endsWith(libExt) && fs.statSync(path.join(backendsDir, f)).isFile() && !skip(f))
    : [];
  if (modules.length === 0) die(`no backend modules in ${backendsDir}: was the dynamic-backends feature built?`);
  const files = new Map(modules.map((m) => [m, path.join(backendsDir, m)]));
  const system = new Set();
  const queue = [addon, ...files.values()];
  while (queue.length) {
    for (const needed of readDynamic(queue.shift()).needed) {
      if (files.has(needed) || system.has(needed)) continue;
      const dir = libDirs.find((d) => fs.existsSync(path.join(d, needed)));
      if (!dir) {
        system.add(needed);
        continue;
      }
      const from = fs.realpathSync(path.join(dir, needed));
      files.set(needed, from);
      queue.push(from);
    }
  }
  return { files: [...files].map(([name, from]) => ({ name, from })), system: [...system].sort() };
}

/** Orders dotted version strings numerically ("2.34" > "2.4"). */
function compareVersions(a, b) {
  const [x, y] = [a.split('.').map(Number), b.split('.').map(Number)];
  for (let i = 0; i < Math.max(x.length, y.length); i++) {
    if ((x[i] || 0) !== (y[i] || 0)) return (x[i] || 0) - (y[i] || 0);
  }
  return 0;
}

/**
 * The newest glibc and libstdc++ symbol versions the shipped files need (what a user's system
 * must provide), from `objdump -T`; null when objdump is missing.
 */
function requiredSymbolVersions(files) {
  if (!which('objdump')) return null;
  const newest = {};
  for (const file of files) {
    const res = spawnSync('objdump', ['-T', file], { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
    for (const [, lib, version] of (res.stdout || '').matchAll(/\b(GLIBC|GLIBCXX)_([0-9.]+)\b/g)) {
      if (!newest[lib] || compareVersions(version, newest[lib]) > 0) newest[lib] = version;
    }
  }
  return Object.entries(newest)
    .map(([lib, v]) => `${lib}_${v}`)
    .join(', ');
}

/** strip --strip-unneeded, in place; false when no strip tool is available. */
function strip(file) {
  if (!which('strip')) return false;
  const res = spawnSync('strip', ['--strip-unneeded', file], { encoding: 'utf8' });
  if (res.status !== 0) die(`strip --strip-unneeded ${file} failed: ${res.stderr}`);
  return true;
}

/**
 * The sys crate's build script hard-links llama.cpp's shared libraries into target/release and
 * target/release/deps, symlinks included (libllama.so -> libllama.so.0, which is not linked
 * there), and skips names that `exists()`, which is false for a dangling symlink: every later
 * run of that build script (after a changed GGML_* variable or `cargo clean -p llama-cpp-sys-2`)
 * then fails with "File exists". Removing the dangling links first avoids that.
 */
function removeDanglingLibLinks(target) {
  for (const dir of ['release', path.join('release', 'deps'), path.join('release', 'examples')].map((d) =>
    path.join(target, d),
  )) {
    let names;
    try {
      names = fs.readdirSync(dir);
    } catch {
      continue;
    }
    for (const name of names.filter((n) => /^lib.*\.(so|dylib)(\.|$)/.test(n))) {
      const file = path.join(dir, name);
      if (fs.lstatSync(file).isSymbolicLink() && !fs.existsSync(file)) fs.rmSync(file);
    }
  }
}

/** Fills npm/<key>/ with the addon and its runtime files; returns the shipped files. */
function stagePlatformPackage(key, addon, runtime) {
  const dir = path.join(repoRoot, 'npm', key);
  const manifestFile = path.join(dir, 'package.json');
  if (!fs.existsSync(manifestFile))
    die(`${manifestFile} is missing (the platform package's manifest is kept in the repository)`);
  for (const f of fs.readdirSync(dir)) {
    if (/\.(node|so|dylib|dll)$|\.so\./.test(f)) fs.rmSync(path.join(dir, f));
  }
  const shipped = [{ name: addonFileName(key), from: addon }, ...runtime.files];
  let stripped = true;
  for (const { name, from } of shipped) {
    const to = path.join(dir, name);
    fs.copyFileSync(from, to);
    fs.chmodSync(to, 0o755);
    stripped = strip(to) && stripped;
  }
  if (!stripped) log('warning: no `strip` on PATH; the shared libraries ship with their symbol tables');
  const node = readDynamic(path.join(dir, addonFileName(key)));
  if (node.rpath !== '$ORIGIN')
    die(
      `${addonFileName(key)} has RPATH ${node.rpath}, expected $ORIGIN (build.rs sets it for the dynamic-backends feature)`,
    );

  // The platform package's version follows the main package's.
  const { version } = mainManifest();
  const manifest = JSON.parse(fs.readFileSync(manifestFile, 'utf8'));
  if (manifest.name !== platformPackageName(null, key))
    die(`${manifestFile}: name must be ${platformPackageName(null, key)}`);
  if (manifest.main !== addonFileName(key)) die(`${manifestFile}: main must be ${addonFileName(key)}`);
  if (manifest.version !== version) {
    manifest.version = version;
    fs.writeFileSync(manifestFile, `${JSON.stringify(manifest, null, 2)}\n`);
    log(`${path.relative(repoRoot, manifestFile)}: version set to ${version}`);
  }
  return shipped.map(({ name }) => ({ name, size: sizeOf(path.join(dir, name)) }));
}

/**
 * CPU variants built but not shipped. sapphirerapids is the only one with AMX, whose kernels killed
 * the process at their first tile instruction on a Sapphire Rapids VM (as in source builds, see
 * .cargo/config.toml); without it ggml picks the best remaining variant (zen4 or cooperlake there:
 * AVX-512 with VNNI and BF16).
 */
const UNSHIPPED_CPU_VARIANTS = /^libggml-cpu-sapphirerapids\./;

/** GPU backend modules packed on their own, by variant: file name pattern and the system library they add. */
const GPU_MODULES = { vulkan: { pattern: /^libggml-vulkan\./, systemLib: 'libvulkan.so.1' } };

/**
 * Fills npm/<key>-<variant>/ with the GPU backend module(s) of the build: everything they need
 * must be in the platform package or the system (plus the GPU's own loader library). Returns
 * the shipped files.
 */
function stageModulePackage(key, variant, backendsDir, platformFiles, systemLibs) {
  const { pattern, systemLib } = GPU_MODULES[variant];
  const dir = path.join(repoRoot, 'npm', `${key}-${variant}`);
  const manifestFile = path.join(dir, 'package.json');
  if (!fs.existsSync(manifestFile)) die(`${manifestFile} is missing (kept in the repository)`);
  for (const f of fs.readdirSync(dir)) if (/\.(so|dylib|dll)$/.test(f)) fs.rmSync(path.join(dir, f));
  const modules = fs.readdirSync(backendsDir).filter((f) => pattern.test(f));
  if (modules.length === 0) die(`no ${variant} module in ${backendsDir}: was the ${variant} feature built?`);
  const shipped = new Set(platformFiles.map((f) => f.name));
  for (const m of modules) {
    const from = path.join(backendsDir, m);
    const missing = readDynamic(from).needed.filter(
      (n) => !shipped.has(n) && !systemLibs.includes(n) && n !== systemLib,
    );
    if (missing.length)
      die(`${m} needs ${missing.join(', ')}, which neither the platform package nor the system provides`);
    const to = path.join(dir, m);
    fs.copyFileSync(from, to);
    fs.chmodSync(to, 0o755);
    strip(to);
  }
  const { version } = mainManifest();
  const manifest = JSON.parse(fs.readFileSync(manifestFile, 'utf8'));
  if (manifest.name !== platformPackageName(variant, key))
    die(`${manifestFile}: name must be ${platformPackageName(variant, key)}`);
  if (!modules.includes(manifest.main)) die(`${manifestFile}: main must be one of ${modules.join(', ')}`);
  if (manifest.version !== version) {
    manifest.version = version;
    fs.writeFileSync(manifestFile, `${JSON.stringify(manifest, null, 2)}\n`);
  }
  return { dir, files: modules.map((name) => ({ name, size: sizeOf(path.join(dir, name)) })) };
}

/** `npm pack` of `dir` into dist/; returns npm's description of the tarball. */
function npmPack(dir, extraArgs = []) {
  const [cmd, pre] = npmCommand();
  const res = spawnSync(cmd, [...pre, 'pack', '--json', '--pack-destination', distDir, ...extraArgs], {
    cwd: dir,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (res.status !== 0) die(`npm pack in ${dir} exited with ${res.status}`);
  return JSON.parse(res.stdout.slice(res.stdout.indexOf('[')))[0];
}

/**
 * Packs the main package with `optionalDependencies` naming every platform package packed into
 * dist/ for this version (the napi-rs convention; the repository's own package.json does not
 * list them, so that `npm ci` in a checkout does not look for unpublished packages). The files
 * are those `npm pack` would ship from the checkout, copied to a scratch folder first.
 */
function packMain() {
  const manifest = mainManifest();
  const optional = {};
  for (const key of Object.keys(TARGETS)) {
    const name = platformPackageName(null, key);
    if (fs.existsSync(path.join(distDir, `${name}-${manifest.version}.tgz`))) optional[name] = manifest.version;
  }
  const [cmd, pre] = npmCommand();
  const listed = spawnSync(cmd, [...pre, 'pack', '--dry-run', '--json'], {
    cwd: repoRoot,
    encoding: 'utf8',
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  if (listed.status !== 0) die(`npm pack --dry-run exited with ${listed.status}`);
  const files = JSON.parse(listed.stdout.slice(listed.stdout.indexOf('[')))[0].files.map((f) => f.path);
  const stage = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-main-'));
  try {
    for (const f of files) {
      fs.mkdirSync(path.dirname(path.join(stage, f)), { recursive: true });
      fs.copyFileSync(path.join(repoRoot, f), path.join(stage, f));
    }
    fs.writeFileSync(
      path.join(stage, 'package.json'),
      `${JSON.stringify({ ...manifest, optionalDependencies: optional }, null, 2)}\n`,
    );
    return { info: npmPack(stage), optional };
  } finally {
    fs.rmSync(stage, { recursive: true, force: true });
  }
}

async function main() {
  const key = platformKey();
  const target = TARGETS[key];
  if (!target) die(`no prebuilt target is defined for ${key}; known: ${Object.keys(TARGETS).join(', ')}`);
  if (target.libExt !== '.so')
    die(`packing ${key} needs the shared-library collection for its binary format; only ELF (Linux) is implemented`);
  if (!findCargo()) die('cargo not found; install Rust with rustup (https://rustup.rs)');

  const started = Date.now();
  // The sys crate forwards CMAKE_* variables to llama.cpp's cmake. Without OpenSSL, common's
  // HTTP client has no HTTPS (the addon never downloads), and libllama-common does not need
  // libssl.so.3 / libcrypto.so.3, which many systems and slim containers lack. Whether the
  // build machine has OpenSSL's headers must not change what the package needs.
  // Not cargoEnv(): its ccache key file is for native builds only.
  const env = { ...process.env, CARGO_TARGET_DIR: prebuildTargetDir(), CMAKE_DISABLE_FIND_PACKAGE_OpenSSL: 'ON' };
  // --vulkan: ggml's Vulkan backend as one more module (libggml-vulkan.so), packed on its own.
  const vulkan = process.argv.includes('--vulkan');
  if (vulkan) Object.assign(env, require('./vulkan').prepareVulkanBuild());
  const features = vulkan ? 'dynamic-backends,vulkan' : 'dynamic-backends';
  const args = ['build', '--release', '--features', features, ...targetCpuArgs(target.cpuBaseline)];
  log(`cargo ${args.join(' ')}  (CARGO_TARGET_DIR=${env.CARGO_TARGET_DIR}; a cold build takes ~20 min on 2 cores)`);
  removeDanglingLibLinks(env.CARGO_TARGET_DIR);
  cleanStaleLlamaBuild(env.CARGO_TARGET_DIR, env);
  const built = await cargoBuild(args, env);
  const buildTime = formatDuration(Date.now() - started);
  if (built.code !== 0) die(`cargo build failed (exit code ${built.code}) after ${buildTime}`);
  if (!built.addon || !built.sysOutDir) die('cargo did not report the addon or the llama-cpp-sys-2 build directory');
  log(`built in ${buildTime}`);

  const gpuVariants = vulkan ? ['vulkan'] : [];
  const isGpuModule = (f) => gpuVariants.some((v) => GPU_MODULES[v].pattern.test(f));
  const runtime = runtimeFiles(
    built.addon,
    built.sysOutDir,
    target.libExt,
    (f) => isGpuModule(f) || UNSHIPPED_CPU_VARIANTS.test(f),
  );
  const unexpected = runtime.system.filter((lib) => !target.systemLibs.includes(lib));
  if (unexpected.length) {
    die(
      `the prebuilt would need ${unexpected.join(', ')} from the system, which users may not have. ` +
        `Build without them, or add them to systemLibs of ${key} in scripts/build-prebuilt.js if every target system has them. ` +
        '(CMAKE_* settings are not tracked by the sys crate: after changing one, `cargo clean -p llama-cpp-sys-2` in the prebuild target directory.)',
    );
  }
  const shipped = stagePlatformPackage(key, built.addon, runtime);
  fs.mkdirSync(distDir, { recursive: true });
  const platformInfo = npmPack(path.join(repoRoot, 'npm', key));
  const { info: mainInfo, optional } = packMain();
  const modulePackages = gpuVariants.map((variant) => {
    const staged = stageModulePackage(
      key,
      variant,
      path.join(built.sysOutDir, 'backends'),
      runtime.files,
      target.systemLibs,
    );
    return { variant, ...staged, info: npmPack(staged.dir) };
  });

  const width = Math.max(...shipped.map((f) => f.name.length));
  console.log(`\n${platformPackageName(null, key)} ships (stripped):`);
  for (const f of shipped) console.log(`  ${f.name.padEnd(width)}  ${mib(f.size).padStart(9)}`);
  console.log(`  ${'total'.padEnd(width)}  ${mib(shipped.reduce((a, f) => a + f.size, 0)).padStart(9)}`);
  console.log(`  needs from the system: ${runtime.system.join(', ')}`);
  const versions = requiredSymbolVersions(shipped.map((f) => path.join(repoRoot, 'npm', key, f.name)));
  if (versions) console.log(`  newest symbol versions needed: ${versions}`);
  for (const m of modulePackages) {
    console.log(`\n${platformPackageName(m.variant, key)} ships (stripped; optional, installed by hand):`);
    for (const f of m.files) console.log(`  ${f.name.padEnd(width)}  ${mib(f.size).padStart(9)}`);
    console.log(`  needs from the system: ${GPU_MODULES[m.variant].systemLib} and a ${m.variant} driver`);
  }
  console.log('\ntarballs:');
  for (const info of [mainInfo, platformInfo, ...modulePackages.map((m) => m.info)]) {
    console.log(
      `  dist/${info.filename}  ${mib(info.size)} packed, ${mib(info.unpackedSize)} unpacked, ${info.entryCount} files`,
    );
  }
  console.log(`  optionalDependencies of ${mainInfo.name}: ${JSON.stringify(optional)}`);
  console.log(`\nprebuild done in ${formatDuration(Date.now() - started)} (cargo ${buildTime})`);
}

if (require.main === module) {
  main().catch((e) => die(e.stack || e.message));
}

module.exports = { TARGETS, GPU_MODULES, prebuildTargetDir, addonFileName, distDir };
