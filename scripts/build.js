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
 *      resource headers for bindgen). Nothing is installed here: one message gives the exact
 *      command (`npm run setup` installs them in a checkout, `.ci/run` in CI);
 *   2. `cargo build --release [--features ...]` with a shared CARGO_TARGET_DIR
 *      (default ~/.cache/llama-branch/target) so rebuilds in fresh clones are cheap;
 *   3. copy the cdylib to build/llama_branch.node (atomically, via rename) and record the
 *      features and CPU target it was built with in build/llama_branch.json (the loader uses
 *      it to tell a GPU build from a CPU one).
 * With the `vulkan` feature, step 1 also checks the Vulkan build tools and headers
 * (scripts/vulkan.js; `node scripts/vulkan.js` installs them).
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
const { spawnSync } = require('node:child_process');
const { prepareVulkanBuild } = require('./vulkan');
const {
  repoRoot,
  targetDir,
  featureList,
  featureArgs,
  cpuArgs,
  cpuChoice,
  cargoEnv,
  cleanStaleLlamaBuild,
  cdylibName,
  addonPath,
  hasApt,
  findCargo,
  spawnWithHeartbeat,
  logger,
  missingBuildTools,
  aptCommand,
  formatDuration,
} = require('./env');

const log = logger('llama-branch');

/**
 * Stops with one actionable message when the build lacks cargo or system packages. Never
 * installs anything: `npm run setup` (a checkout) and CI do that; here the exact command is
 * printed.
 */
function ensurePrerequisites() {
  if (!findCargo()) {
    log.fail(
      'the Rust toolchain (cargo) was not found. llama-branch compiles a native addon from source; install Rust with rustup:\n' +
        "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y\n" +
        '  then open a new shell (or run: . "$HOME/.cargo/env") and retry.',
    );
  }
  const missing = missingBuildTools();
  if (missing.length === 0) return;
  const list = missing.map((m) => `  - ${m.what}\n`).join('');
  let how = `  Install them with:\n    ${aptCommand(missing.map((m) => m.apt))}\n`;
  if (process.platform === 'darwin') how = '  Install them with:\n    xcode-select --install && brew install cmake\n';
  else if (!hasApt())
    how =
      '  Install cmake, a C++ compiler and libclang with your package manager (Fedora: sudo dnf install -y cmake gcc-c++ clang-devel),\n  or point LIBCLANG_PATH at the folder holding libclang.so\n';
  log.fail(`missing build prerequisites:\n${list}${how}  (in a checkout, \`npm run setup\` installs them for you)`);
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
  fs.writeFileSync(
    dest.replace(/\.node$/, '.json'),
    `${JSON.stringify({ features: featureList(), cpu: cpuChoice() }, null, 2)}\n`,
  );
}

/** Where to install the addon: build/llama_branch.node, or DIR/llama_branch.node with --out DIR. */
function destination(argv = process.argv.slice(2)) {
  const i = argv.indexOf('--out');
  if (i === -1) return addonPath;
  if (!argv[i + 1]) {
    log.fail('--out needs a folder');
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

async function main() {
  const dest = destination();
  if (process.env.LLAMA_BRANCH_SKIP_BUILD === '1' && fs.existsSync(dest)) {
    log(`LLAMA_BRANCH_SKIP_BUILD=1 and ${path.relative(repoRoot, dest)} exists; skipping build`);
    return;
  }

  if (process.env.LLAMA_BRANCH_BUILD_FROM_SOURCE === '1' || featureList().length > 0) {
    log(
      featureList().length > 0
        ? `features ${featureList().join(', ')}: building from source`
        : 'LLAMA_BRANCH_BUILD_FROM_SOURCE=1: building from source',
    );
  } else {
    const prebuilt = probePrebuilt();
    if (prebuilt.ok) {
      const variant = /CPU_VARIANT = (\S+)/.exec(prebuilt.info);
      log(
        `using the prebuilt binary from ${prebuilt.name}${variant ? ` (CPU variant ${variant[1]})` : ''}; nothing to compile`,
      );
      log(
        '(set LLAMA_BRANCH_BUILD_FROM_SOURCE=1 and run `npm rebuild llama-branch` to compile for this machine instead)',
      );
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
  const code = await spawnWithHeartbeat('cargo', args, { env: { ...cargoEnv(), ...backendEnv }, log });
  const elapsed = formatDuration(Date.now() - started);
  if (code !== 0) {
    log(`ERROR: cargo build failed (exit code ${code}) after ${elapsed}`);
    process.exit(code || 1);
  }

  const builtLib = path.join(target, 'release', cdylibName());
  if (!fs.existsSync(builtLib)) {
    log.fail(`cargo succeeded but ${builtLib} does not exist`);
  }
  installAddon(builtLib, dest);
  log(`built ${path.relative(repoRoot, dest)} in ${elapsed}`);
}

main().catch((e) => log.fail(e.stack || e.message));
