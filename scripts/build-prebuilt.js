#!/usr/bin/env node
'use strict';

/**
 * `npm run build:prebuilt [-- --vulkan]`: this platform's prebuilt (no cross builds), packed into dist/ with sizes:
 * the platform package (npm/<platform>/: the addon, llama.cpp's libraries and every backend module ggml built, one
 * CPU backend per instruction-set level chosen at run time; stripped), with --vulkan the Vulkan module's package,
 * and the main package, whose optionalDependencies name the platform packages. The addon targets the baseline
 * CPU of the architecture, in a cargo target dir of its own (LLAMA_BRANCH_PREBUILD_TARGET_DIR, default
 * `<dev target dir>-prebuilt`). A cold build (~14 CPU variants) takes ~20 minutes on 2 cores.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const {
  repoRoot,
  targetDir,
  targetCpuArgs,
  dropUnpatchedLlama,
  findCargo,
  formatDuration,
  spawnWithHeartbeat,
  npmCommand,
  logger,
} = require('./env');
const { platformKey, platformPackageName } = require('../lib/loader');

/** DT_NEEDED and DT_RPATH / DT_RUNPATH of a shared library, from binutils' `objdump -p` (g++ needs binutils too). */
function readDynamic(file) {
  const res = spawnSync('objdump', ['-p', file], { encoding: 'utf8', maxBuffer: 64 * 2 ** 20 });
  if (res.status !== 0) die(`objdump -p ${file} failed: ${res.error ? res.error.message : res.stderr}`);
  const entries = (tag) => [...res.stdout.matchAll(new RegExp(`^\\s+${tag}\\s+(\\S+)$`, 'gm'))].map((m) => m[1]);
  return { needed: entries('NEEDED'), rpath: entries('R(?:UN)?PATH')[0] ?? null };
}

/** Libraries every glibc Linux system has; a prebuilt may need nothing else from the system: users may lack it. */
const GLIBC_SYSTEM_LIBS = 'libc.so.6 libm.so.6 libdl.so.2 libpthread.so.0 librt.so.1 libstdc++.so.6 libgcc_s.so.1';

/**
 * The platforms this script can pack (ELF only; each on a machine of its own): the rustc target-cpu of the addon
 * (the oldest CPU it must run on) and the system libraries the shipped files may need.
 */
const TARGETS = {
  'linux-x64-gnu': { cpuBaseline: 'x86-64', systemLibs: [...GLIBC_SYSTEM_LIBS.split(' '), 'ld-linux-x86-64.so.2'] },
  'linux-arm64-gnu': { cpuBaseline: 'generic', systemLibs: [...GLIBC_SYSTEM_LIBS.split(' '), 'ld-linux-aarch64.so.1'] },
};

/**
 * Built but not shipped: sapphirerapids is the only variant with AMX, whose kernels killed the process at their
 * first tile instruction on a Sapphire Rapids VM (see .cargo/config.toml); that CPU gets zen4 or cooperlake.
 */
const UNSHIPPED_CPU_VARIANTS = /^libggml-cpu-sapphirerapids\./;

/** GPU backend modules packed on their own, by variant: file name pattern and the system library they add. */
const GPU_MODULES = { vulkan: { pattern: /^libggml-vulkan\./, systemLib: 'libvulkan.so.1' } };

const distDir = path.join(repoRoot, 'dist');
const mainManifest = () => JSON.parse(fs.readFileSync(path.join(repoRoot, 'package.json'), 'utf8'));
const addonFileName = (key) => `llama_branch.${key}.node`;
const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;
const log = logger('build-prebuilt');
const die = log.fail;

/** Cargo target directory of prebuilt builds: separate from the dev build's. */
function prebuildTargetDir() {
  const fromEnv = process.env.LLAMA_BRANCH_PREBUILD_TARGET_DIR;
  return fromEnv && fromEnv.trim() !== '' ? path.resolve(fromEnv) : `${targetDir()}-prebuilt`;
}

/**
 * `cargo build` with JSON messages on stdout (diagnostics still rendered on stderr); resolves { code, addon,
 * sysOutDir }: the cdylib built and the sys crate's OUT_DIR (llama.cpp's libraries and backend modules).
 */
async function cargoBuild(args, env) {
  const built = { addon: null, sysOutDir: null };
  const onStdout = (line) => {
    let msg;
    try {
      msg = JSON.parse(line);
    } catch {
      return;
    }
    if (msg.reason === 'build-script-executed' && /[/#]llama-cpp-sys-2[@#]/.test(msg.package_id))
      built.sysOutDir = msg.out_dir;
    if (msg.reason === 'compiler-artifact' && msg.target?.name === 'llama_branch' && msg.target.kind.includes('cdylib'))
      built.addon = msg.filenames.find((f) => f.endsWith('.so')) || built.addon;
  };
  const cargoArgs = [...args, '--message-format=json-render-diagnostics'];
  const code = await spawnWithHeartbeat('cargo', cargoArgs, { env, log, every: 60000, onStdout });
  return { code, ...built };
}

/**
 * What the platform package holds besides the addon: every backend module in the sys crate's backends folder (not
 * a fixed list: RPC or GPU modules come along when a build adds them) and, following DT_NEEDED, every library they
 * or the addon need that llama.cpp's build produced. Returns the files [{ name, from }] and the libraries left to
 * the system.
 */
function runtimeFiles(addon, sysOutDir, skip) {
  const backendsDir = path.join(sysOutDir, 'backends');
  const libDirs = ['lib', 'lib64', path.join('build', 'common'), path.join('build', 'bin')]
    .map((d) => path.join(sysOutDir, d))
    .filter((d) => fs.existsSync(d));
  const modules = fs.existsSync(backendsDir)
    ? fs
        .readdirSync(backendsDir)
        .filter((f) => f.endsWith('.so') && fs.statSync(path.join(backendsDir, f)).isFile() && !skip(f))
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
      files.set(needed, fs.realpathSync(path.join(dir, needed)));
      queue.push(files.get(needed));
    }
  }
  return { files: [...files].map(([name, from]) => ({ name, from })), system: [...system].sort() };
}

/** The newest GLIBC and GLIBCXX symbol versions `files` need: what a user's system must have. */
function newestSymbolVersions(files) {
  const newest = {};
  const dynamicSymbols = files.map(
    (f) => spawnSync('objdump', ['-T', f], { encoding: 'utf8', maxBuffer: 2 ** 26 }).stdout,
  );
  for (const [, lib, version] of dynamicSymbols.join('\n').matchAll(/\b(GLIBC|GLIBCXX)_([0-9.]+)\b/g)) {
    if (!newest[lib] || version.localeCompare(newest[lib], 'en', { numeric: true }) > 0) newest[lib] = version;
  }
  return Object.entries(newest)
    .map(([lib, version]) => `${lib}_${version}`)
    .join(', ');
}

/**
 * The sys crate's build script hard-links llama.cpp's libraries into target/release{,/deps,/examples}, symlinks
 * included (libllama.so -> libllama.so.0, not linked there), and skips names that exist(), which is false for a
 * dangling symlink: its next run (after a changed GGML_* variable) then fails with "File exists".
 */
function removeDanglingLibLinks(target) {
  for (const dir of ['release', 'release/deps', 'release/examples'].map((d) => path.join(target, d))) {
    const names = fs.existsSync(dir) ? fs.readdirSync(dir) : [];
    for (const file of names.filter((n) => /^lib.*\.so(\.|$)/.test(n)).map((n) => path.join(dir, n))) {
      if (fs.lstatSync(file).isSymbolicLink() && !fs.existsSync(file)) fs.rmSync(file);
    }
  }
}

/**
 * Replaces the binaries of npm/<folder>/ with `files` ([{ name, from }]), stripped, and checks the manifest kept
 * there: `packageName`, a main among `mains`, the main package's version (synced). Returns the folder and sizes.
 */
function stagePackage(folder, packageName, files, mains) {
  const dir = path.join(repoRoot, 'npm', folder);
  const manifestFile = path.join(dir, 'package.json');
  if (!fs.existsSync(manifestFile)) die(`${manifestFile} is missing (the manifest is kept in the repository)`);
  for (const f of fs.readdirSync(dir)) if (/\.(node|so)$|\.so\./.test(f)) fs.rmSync(path.join(dir, f));
  for (const { name, from } of files) {
    const to = path.join(dir, name);
    fs.copyFileSync(from, to);
    fs.chmodSync(to, 0o755);
    // binutils' strip, like objdump above: a C++ toolchain has it.
    const res = spawnSync('strip', ['--strip-unneeded', to], { encoding: 'utf8' });
    if (res.status !== 0) die(`strip --strip-unneeded ${to} failed: ${res.error ? res.error.message : res.stderr}`);
  }
  const manifest = JSON.parse(fs.readFileSync(manifestFile, 'utf8'));
  if (manifest.name !== packageName) die(`${manifestFile}: name must be ${packageName}`);
  if (!mains.includes(manifest.main)) die(`${manifestFile}: main must be ${mains.join(' or ')}`);
  const { version } = mainManifest();
  if (manifest.version !== version) {
    fs.writeFileSync(manifestFile, `${JSON.stringify({ ...manifest, version }, null, 2)}\n`);
    log(`${path.relative(repoRoot, manifestFile)}: version set to ${version}`);
  }
  return { dir, files: files.map(({ name }) => ({ name, size: fs.statSync(path.join(dir, name)).size })) };
}

/** Runs `npm <args> --json` in `dir`; returns npm's description of the (first) package. */
function npmJson(dir, args) {
  const [cmd, pre] = npmCommand();
  const res = spawnSync(cmd, [...pre, ...args, '--json'], { cwd: dir, encoding: 'utf8', stdio: 'pipe' });
  if (res.status !== 0) die(`npm ${args.join(' ')} in ${dir} exited with ${res.status}: ${res.stderr}`);
  return JSON.parse(res.stdout.slice(res.stdout.indexOf('[')))[0];
}

const npmPack = (dir) => npmJson(dir, ['pack', '--pack-destination', distDir]);

/**
 * Packs the main package with optionalDependencies naming every platform package packed into dist/ for this
 * version (the napi-rs convention). The repository's package.json does not list them, so that `npm ci` in a
 * checkout does not look for unpublished packages: the files `npm pack` would ship go to a scratch folder first.
 */
function packMain() {
  const manifest = mainManifest();
  const optional = {};
  for (const name of Object.keys(TARGETS).map((key) => platformPackageName(null, key))) {
    if (fs.existsSync(path.join(distDir, `${name}-${manifest.version}.tgz`))) optional[name] = manifest.version;
  }
  const files = npmJson(repoRoot, ['pack', '--dry-run']).files.map((f) => f.path);
  const stage = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-main-'));
  try {
    for (const f of files) {
      fs.mkdirSync(path.dirname(path.join(stage, f)), { recursive: true });
      fs.copyFileSync(path.join(repoRoot, f), path.join(stage, f));
    }
    const packed = { ...manifest, optionalDependencies: optional };
    fs.writeFileSync(path.join(stage, 'package.json'), `${JSON.stringify(packed, null, 2)}\n`);
    return { info: npmPack(stage), optional };
  } finally {
    fs.rmSync(stage, { recursive: true, force: true });
  }
}

async function main() {
  const key = platformKey();
  const target = TARGETS[key];
  if (!target) die(`no prebuilt target is defined for ${key}; known: ${Object.keys(TARGETS).join(', ')}`);
  if (!findCargo()) die('cargo not found; install Rust with rustup (https://rustup.rs)');

  const started = Date.now();
  // The sys crate forwards CMAKE_* to llama.cpp's cmake. Without OpenSSL, libllama-common needs no libssl.so.3 /
  // libcrypto.so.3 (slim systems lack them; the addon never downloads), whatever the build machine has.
  // Not cargoEnv(): its ccache key file is for native builds only.
  const env = { ...process.env, CARGO_TARGET_DIR: prebuildTargetDir(), CMAKE_DISABLE_FIND_PACKAGE_OpenSSL: 'ON' };
  const gpuVariants = process.argv.includes('--vulkan') ? ['vulkan'] : [];
  if (gpuVariants.includes('vulkan')) Object.assign(env, require('./vulkan').prepareVulkanBuild());
  const features = ['dynamic-backends', ...gpuVariants].join(',');
  const args = ['build', '--release', '--features', features, ...targetCpuArgs(target.cpuBaseline)];
  log(`cargo ${args.join(' ')}  (CARGO_TARGET_DIR=${env.CARGO_TARGET_DIR}; a cold build takes ~20 min on 2 cores)`);
  removeDanglingLibLinks(env.CARGO_TARGET_DIR);
  dropUnpatchedLlama(env.CARGO_TARGET_DIR, env);
  const built = await cargoBuild(args, env);
  const buildTime = formatDuration(Date.now() - started);
  if (built.code !== 0) die(`cargo build failed (exit code ${built.code}) after ${buildTime}`);
  if (!built.addon || !built.sysOutDir) die('cargo did not report the addon or the llama-cpp-sys-2 build directory');
  log(`built in ${buildTime}`);

  const backendsDir = path.join(built.sysOutDir, 'backends');
  const isGpuModule = (f) => gpuVariants.some((v) => GPU_MODULES[v].pattern.test(f));
  const runtime = runtimeFiles(built.addon, built.sysOutDir, (f) => isGpuModule(f) || UNSHIPPED_CPU_VARIANTS.test(f));
  const unexpected = runtime.system.filter((lib) => !target.systemLibs.includes(lib));
  if (unexpected.length) {
    die(
      `the prebuilt would need ${unexpected.join(', ')} from the system, which users may lack. Build without ` +
        `them, or add them to systemLibs of ${key} in scripts/build-prebuilt.js if every target system has them. ` +
        '(The sys crate does not track CMAKE_* settings: after changing one, `cargo clean -p llama-cpp-sys-2` ' +
        'in the prebuild target directory.)',
    );
  }
  const addon = { name: addonFileName(key), from: built.addon };
  const platform = stagePackage(key, platformPackageName(null, key), [addon, ...runtime.files], [addon.name]);
  const { rpath } = readDynamic(path.join(platform.dir, addon.name));
  if (rpath !== '$ORIGIN')
    die(`${addon.name} has RPATH ${rpath}, expected $ORIGIN (build.rs sets it for dynamic-backends)`);

  // A GPU module may need only what the platform package or the system provides, plus the GPU's loader library.
  const provided = new Set([...runtime.files.map((f) => f.name), ...target.systemLibs]);
  const modulePackages = gpuVariants.map((variant) => {
    const { pattern, systemLib } = GPU_MODULES[variant];
    const modules = fs.readdirSync(backendsDir).filter((f) => pattern.test(f));
    if (modules.length === 0) die(`no ${variant} module in ${backendsDir}: was the ${variant} feature built?`);
    for (const m of modules) {
      const missing = readDynamic(path.join(backendsDir, m)).needed.filter((n) => !provided.has(n) && n !== systemLib);
      if (missing.length)
        die(`${m} needs ${missing.join(', ')}, which neither the platform package nor the system has`);
    }
    const files = modules.map((name) => ({ name, from: path.join(backendsDir, name) }));
    return { variant, ...stagePackage(`${key}-${variant}`, platformPackageName(variant, key), files, modules) };
  });

  fs.mkdirSync(distDir, { recursive: true });
  const platformInfo = npmPack(platform.dir);
  const { info: mainInfo, optional } = packMain();
  const moduleInfos = modulePackages.map((m) => npmPack(m.dir));

  const width = Math.max(...platform.files.map((f) => f.name.length));
  const list = (files) => files.forEach((f) => console.log(`  ${f.name.padEnd(width)}  ${mib(f.size).padStart(9)}`));
  console.log(`\n${platformPackageName(null, key)} ships (stripped):`);
  list([...platform.files, { name: 'total', size: platform.files.reduce((sum, f) => sum + f.size, 0) }]);
  console.log(`  needs from the system: ${runtime.system.join(', ')}`);
  const versions = newestSymbolVersions(platform.files.map((f) => path.join(platform.dir, f.name)));
  console.log(`  newest symbol versions needed: ${versions}`);
  for (const m of modulePackages) {
    console.log(`\n${platformPackageName(m.variant, key)} ships (stripped; optional, installed by hand):`);
    list(m.files);
    console.log(`  needs from the system: ${GPU_MODULES[m.variant].systemLib} and a ${m.variant} driver`);
  }
  console.log('\ntarballs:');
  for (const t of [mainInfo, platformInfo, ...moduleInfos]) {
    console.log(`  dist/${t.filename}  ${mib(t.size)} packed, ${mib(t.unpackedSize)} unpacked, ${t.entryCount} files`);
  }
  console.log(`  optionalDependencies of ${mainInfo.name}: ${JSON.stringify(optional)}`);
  console.log(`\nprebuild done in ${formatDuration(Date.now() - started)} (cargo ${buildTime})`);
}

if (require.main === module) {
  main().catch((e) => die(e.stack || e.message));
}

module.exports = { addonFileName, distDir };
