#!/usr/bin/env node
'use strict';

/**
 * cargo with the build's settings (`node scripts/cargo.js test --release --lib`): the shared target
 * dir of scripts/build.js, and for compiling subcommands LLAMA_BRANCH_FEATURES and LLAMA_BRANCH_CPU,
 * which must match the build's or llama.cpp is compiled again.
 */

const fs = require('node:fs');
const path = require('node:path');
const { featureArgs, cpuArgs, cargoEnv, dropUnpatchedLlama, findCargo, run } = require('./env');

const args = process.argv.slice(2);
if (args.length === 0) {
  console.error('usage: node scripts/cargo.js <cargo subcommand> [args...]');
  process.exit(2);
}
if (!findCargo()) {
  console.error('error: cargo not found; install Rust with rustup (https://rustup.rs)');
  process.exit(127);
}
const COMPILING = ['build', 'b', 'check', 'c', 'test', 't', 'bench', 'run', 'r', 'clippy', 'doc', 'd', 'rustc'];
const extra = COMPILING.includes(args[0]) ? [...featureArgs(), ...cpuArgs()] : [];
// Cargo's own options go before a `--` (what follows it is for the test binary).
const sep = args.includes('--') ? args.indexOf('--') : args.length;
const env = cargoEnv();
// napi-derive appends each `#[napi]` signature to the typedef folder as the crate compiles; only
// `build` writes what lib/native.d.ts is generated from. A clippy, check or test compile would
// append the signatures again (duplicate declarations): theirs go to a scratch folder.
if (!['build', 'b'].includes(args[0])) {
  env.NAPI_TYPE_DEF_TMP_FOLDER = path.join(env.CARGO_TARGET_DIR, 'napi-typedefs-scratch');
  fs.mkdirSync(env.NAPI_TYPE_DEF_TMP_FOLDER, { recursive: true });
}
if (extra.length) dropUnpatchedLlama(env.CARGO_TARGET_DIR, env);
process.exitCode = run('cargo', [...args.slice(0, sep), ...extra, ...args.slice(sep)], { env });
