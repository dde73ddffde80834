#!/usr/bin/env node
'use strict';

/**
 * Builds the addon and installs it as build/llama_branch.node (`npm run build`, and the npm
 * `install` script, so no devDependencies here). When the prebuilt platform package is installed
 * and loads on this machine (checked in a child process, so that a binary this CPU cannot run
 * fails the check, not the install), there is nothing to build. Otherwise: check the toolchain
 * (never install it: print the exact command), `cargo build --release` in the shared target dir,
 * copy the cdylib into place atomically and record its features and CPU target in
 * build/llama_branch.json (the loader tells a GPU build from a CPU one by it).
 *
 *   --out DIR                          install into DIR instead of build/
 *   LLAMA_BRANCH_FEATURES              cargo features, e.g. vulkan, cuda, metal (implies a source build)
 *   LLAMA_BRANCH_CPU                   native (default), portable or a target-cpu name (scripts/env.js)
 *   LLAMA_BRANCH_BUILD_FROM_SOURCE=1   build even when a prebuilt binary would load
 *   LLAMA_BRANCH_SKIP_BUILD=1          do nothing if the addon already exists
 */

const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const env = require('./env');

const log = env.logger('llama-branch');

/** Stops with one actionable message when cargo or a system package is missing. */
function ensurePrerequisites() {
  if (!env.findCargo()) {
    log.fail(
      'the Rust toolchain (cargo) was not found. llama-branch compiles a native addon from source; install Rust with rustup:\n' +
        "    curl --proto '=https' --tlsv1.2 -sSf https://sh.rustup.rs | sh -s -- -y\n" +
        '  then open a new shell (or run: . "$HOME/.cargo/env") and retry.',
    );
  }
  const missing = env.missingBuildTools();
  if (missing.length === 0) return;
  let how = env.aptCommand(missing.map((m) => m.apt));
  if (process.platform === 'darwin') how = 'xcode-select --install && brew install cmake';
  else if (!env.hasApt()) how = 'your package manager (Fedora: sudo dnf install -y cmake gcc-c++ clang-devel)';
  log.fail(
    `missing build prerequisites:\n${missing.map((m) => `  - ${m.what}\n`).join('')}  Install them with:\n    ${how}\n` +
      '  (in a checkout, `npm run setup` installs them for you)',
  );
}

/** Whether the prebuilt platform package loads here: { ok, name, info } or { ok: false, reason }. */
function probePrebuilt() {
  const program = `
    try {
      const { binding, name } = require(${JSON.stringify(path.join(env.repoRoot, 'lib', 'loader.js'))}).loadPlatformPackage();
      process.stdout.write(JSON.stringify({ name, info: binding.systemInfo() }));
    } catch (e) {
      process.stderr.write(e.message);
      process.exit(1);
    }`;
  const res = spawnSync(process.execPath, ['-e', program], { encoding: 'utf8', timeout: 120000 });
  if (res.status === 0) {
    try {
      return { ok: true, ...JSON.parse(res.stdout) };
    } catch {
      return { ok: false, reason: `unexpected output: ${res.stdout.slice(0, 200)}` };
    }
  }
  const why = res.error?.message || (res.signal && `loading it killed the process with ${res.signal}`);
  return { ok: false, reason: why || (res.stderr || `exit code ${res.status}`).trim().split('\n')[0] };
}

/** Why to build from source, or null (logged) when the prebuilt binary loads here. */
function sourceBuildReason() {
  if (env.featureList().length > 0) return `features ${env.featureList().join(', ')}: building from source`;
  if (process.env.LLAMA_BRANCH_BUILD_FROM_SOURCE === '1')
    return 'LLAMA_BRANCH_BUILD_FROM_SOURCE=1: building from source';
  const prebuilt = probePrebuilt();
  if (!prebuilt.ok) return `no usable prebuilt binary (${prebuilt.reason}); building from source`;
  const variant = /CPU_VARIANT = (\S+)/.exec(prebuilt.info);
  log(
    `using the prebuilt binary from ${prebuilt.name}${variant ? ` (CPU variant ${variant[1]})` : ''}; nothing to compile`,
  );
  log('(set LLAMA_BRANCH_BUILD_FROM_SOURCE=1 and run `npm rebuild llama-branch` to compile for this machine instead)');
  return null;
}

/** Copies via a temp file + rename, so a process with the old addon loaded keeps a valid mapping. */
function install(builtLib, dest) {
  fs.mkdirSync(path.dirname(dest), { recursive: true });
  const tmp = `${dest}.${process.pid}.tmp`;
  try {
    fs.copyFileSync(builtLib, tmp);
    fs.renameSync(tmp, dest);
  } finally {
    fs.rmSync(tmp, { force: true });
  }
  const record = { features: env.featureList(), cpu: env.cpuChoice() };
  fs.writeFileSync(dest.replace(/\.node$/, '.json'), `${JSON.stringify(record, null, 2)}\n`);
}

async function main() {
  const out = process.argv.indexOf('--out');
  if (out !== -1 && !process.argv[out + 1]) log.fail('--out needs a folder');
  const dest = out === -1 ? env.addonPath : path.resolve(process.argv[out + 1], path.basename(env.addonPath));
  if (process.env.LLAMA_BRANCH_SKIP_BUILD === '1' && fs.existsSync(dest))
    return log(`LLAMA_BRANCH_SKIP_BUILD=1 and ${dest} exists; skipping build`);
  const reason = sourceBuildReason();
  if (!reason) return;
  log(reason);

  ensurePrerequisites();
  const backendEnv = env.featureList().includes('vulkan') ? require('./vulkan').prepareVulkanBuild() : {};
  const args = ['build', '--release', ...env.featureArgs(), ...env.cpuArgs()];
  log('building native addon (first build compiles llama.cpp: ~3-6 min on 2 cores, ~10 with Vulkan) ...');
  log(`cargo ${args.join(' ')}  (CARGO_TARGET_DIR=${env.targetDir()})`);
  const started = Date.now();
  const cargoEnv = { ...env.cargoEnv(), ...backendEnv };
  env.dropUnpatchedLlama(cargoEnv.CARGO_TARGET_DIR, cargoEnv);
  const code = await env.spawnWithHeartbeat('cargo', args, { env: cargoEnv, log });
  const elapsed = env.formatDuration(Date.now() - started);
  if (code !== 0) {
    log(`ERROR: cargo build failed (exit code ${code}) after ${elapsed}`);
    process.exit(code);
  }
  const builtLib = path.join(env.targetDir(), 'release', env.cdylibName());
  if (!fs.existsSync(builtLib)) log.fail(`cargo succeeded but ${builtLib} does not exist`);
  install(builtLib, dest);
  log(`built ${path.relative(env.repoRoot, dest)} in ${elapsed}`);
}

main().catch((e) => log.fail(e.stack || e.message));
