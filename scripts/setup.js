#!/usr/bin/env node
'use strict';

/**
 * First-time setup of a checkout (`npm run setup`, the README's first command):
 *   1. the system packages a source build needs (cmake, a C++ compiler, libclang, ccache) and
 *      Debian's chromium for the browser tests (`npm run test:ui`), with
 *      apt as root or through sudo when missing: the one place besides CI that installs them
 *      (the npm `install` script never does; it prints the command instead);
 *   2. `npm install` (whose install script builds the native addon), or only the build when
 *      node_modules exists;
 *   3. the default model, fetched and verified;
 *   4. the demo (examples/demo.js).
 * `node scripts/setup.js --system` does step 1 only (`.ci/run` runs it before `npm ci`).
 */

const fs = require('node:fs');
const path = require('node:path');
const {
  repoRoot,
  run,
  which,
  logger,
  missingBuildTools,
  aptCommand,
  aptInstall,
  npmCommand,
  browserPath,
} = require('./env');

const node = process.execPath;
const log = logger('setup');

function step(name, code) {
  if (code !== 0) log.fail(`${name} (exit code ${code})`);
}

function systemPackages() {
  buildPackages();
  // Optional, installed on their own so a failure leaves the build tools alone: the browser
  // `npm run test:ui` drives (the page of `llama-branch serve`) and a font for its screenshots.
  if (browserPath()) return;
  aptInstall(['chromium', 'fonts-dejavu-core'], log);
  if (!browserPath()) log('no Chromium: `npm run test:ui` (the browser tests of the live page) will be skipped');
}

function buildPackages() {
  const packages = missingBuildTools().map((m) => m.apt);
  if (!which('ccache')) packages.push('ccache'); // optional: makes rebuilds of llama.cpp cheap
  if (packages.length === 0) return log('build packages: all present');
  if (aptInstall(packages, log) && missingBuildTools().length === 0) return;
  const still = missingBuildTools();
  if (still.length === 0) return log('ccache could not be installed; builds work without it, only slower to repeat');
  log.fail(
    `missing build prerequisites: ${still.map((m) => m.what).join('; ')}\n  install them with: ${aptCommand(still.map((m) => m.apt))}`,
  );
}

function main() {
  console.log('\n==> system packages');
  systemPackages();
  if (process.argv.includes('--system')) return;

  if (!fs.existsSync(path.join(repoRoot, 'node_modules'))) {
    console.log('\n==> npm install (also builds the native addon)');
    const [cmd, args] = npmCommand();
    step('npm install', run(cmd, [...args, 'install']));
  } else {
    console.log('\n==> build native addon');
    step('build', run(node, [path.join(repoRoot, 'scripts', 'build.js')]));
  }

  console.log('\n==> fetch model');
  step('fetch model', run(node, [path.join(repoRoot, 'scripts', 'fetch-model.js')]));

  console.log('\n==> demo (node examples/demo.js)');
  step('demo', run(node, [path.join(repoRoot, 'examples', 'demo.js')]));
  console.log('\n[setup] done. Next:');
  console.log('  npm test                                  # the whole test suite');
  console.log('  node examples/best-of-n.js                # best-of-N by perplexity (more in examples/README.md)');
}

main();
