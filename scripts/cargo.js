#!/usr/bin/env node
'use strict';

/**
 * Run cargo with the project's conventions applied:
 *   - CARGO_TARGET_DIR defaults to the shared cache used by scripts/build.js,
 *     so e.g. `cargo test` reuses the llama.cpp already compiled by the build
 *     instead of compiling it again into ./target;
 *   - LLAMA_BRANCH_FEATURES is appended as `--features ...` and LLAMA_BRANCH_CPU as a
 *     target-cpu override (both must match the build's, or llama.cpp is recompiled).
 *
 * Usage: node scripts/cargo.js <cargo args...>   e.g. node scripts/cargo.js test --release --lib
 */

const { featureArgs, cpuArgs, cargoEnv, cleanStaleLlamaBuild, findCargo, run } = require('./env');

const args = process.argv.slice(2);
if (args.length === 0) {
  console.error('usage: node scripts/cargo.js <cargo subcommand> [args...]');
  process.exit(2);
}

// Subcommands that compile the crate and therefore accept --features.
const COMPILING = new Set([
  'build',
  'b',
  'check',
  'c',
  'test',
  't',
  'bench',
  'run',
  'r',
  'clippy',
  'doc',
  'd',
  'rustc',
]);
const features = COMPILING.has(args[0]) ? [...featureArgs(), ...cpuArgs()] : [];

// Cargo options must precede a `--` separator (arguments after it go to the test binary).
const sep = args.indexOf('--');
const cargoArgs = sep === -1 ? [...args, ...features] : [...args.slice(0, sep), ...features, ...args.slice(sep)];

if (!findCargo()) {
  console.error('error: cargo not found; install Rust with rustup (https://rustup.rs)');
  process.exit(127);
}
if (COMPILING.has(args[0])) cleanStaleLlamaBuild();
process.exitCode = run('cargo', cargoArgs, { env: cargoEnv() });
