#!/usr/bin/env node
'use strict';

/**
 * First-time setup (`npm run setup`):
 *   1. install dependencies with `npm install` (whose install hook builds the
 *      native addon), or just run the build if node_modules already exists;
 *   2. fetch and verify the default model;
 *   3. run the demo (examples/demo.js), if present.
 */

const fs = require('node:fs');
const path = require('node:path');
const { repoRoot, run } = require('./env');

const node = process.execPath;

function step(name, code) {
  if (code !== 0) {
    console.error(`\n[setup] FAILED: ${name} (exit code ${code})`);
    process.exit(code);
  }
}

function npmCommand() {
  // npm_execpath is set when running under `npm run`; reuse that exact npm.
  const npmCli = process.env.npm_execpath;
  if (npmCli && /npm-cli\.js$/.test(npmCli)) return { cmd: node, args: [npmCli] };
  return process.platform === 'win32'
    ? { cmd: 'npm.cmd', args: [], shell: true }
    : { cmd: 'npm', args: [] };
}

function main() {
  if (!fs.existsSync(path.join(repoRoot, 'node_modules'))) {
    console.log('\n==> npm install (also builds the native addon)');
    const npm = npmCommand();
    step('npm install', run(npm.cmd, [...npm.args, 'install'], { shell: npm.shell }));
  } else {
    console.log('\n==> build native addon');
    step('build', run(node, [path.join(repoRoot, 'scripts', 'build.js')]));
  }

  console.log('\n==> fetch model');
  step('fetch model', run(node, [path.join(repoRoot, 'scripts', 'fetch-model.js')]));

  const demo = path.join(repoRoot, 'examples', 'demo.js');
  if (!fs.existsSync(demo)) {
    console.log('\n[setup] done. (examples/demo.js is not present yet, so there is no demo to run.)');
    return;
  }
  console.log('\n==> demo (node examples/demo.js)');
  step('demo', run(node, [demo]));
  console.log('\n[setup] done. Next:');
  console.log('  npm test                                  # the whole test suite');
  console.log('  node examples/best-of-n.js                # best-of-N by perplexity (more in examples/README.md)');
}

main();
