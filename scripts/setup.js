#!/usr/bin/env node
'use strict';

/**
 * `npm run setup`, the README's first command: the system packages a source build needs and Chromium
 * for the browser tests (apt, as root or through sudo: the npm `install` script only prints the
 * command; `--system` stops here, as `.ci/run` uses it), `npm install` (or only the build when
 * node_modules exists), the default model, and the demo.
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

const log = logger('setup');

function step(title, cmd, args) {
  console.log(`\n==> ${title}`);
  const code = run(cmd, args);
  if (code !== 0) log.fail(`${title} (exit code ${code})`);
}

function buildPackages() {
  const packages = [...missingBuildTools().map((m) => m.apt), ...(which('ccache') ? [] : ['ccache'])];
  if (packages.length === 0) return log('build packages: all present');
  aptInstall(packages, log);
  const still = missingBuildTools();
  if (still.length > 0)
    log.fail(
      `missing build prerequisites: ${still.map((m) => m.what).join('; ')}\n  install them with: ${aptCommand(still.map((m) => m.apt))}`,
    );
  if (!which('ccache')) log('ccache could not be installed; builds work without it, only slower to repeat');
}

/**
 * The Python clients the server tests drive it with (test dependencies from PyPI, a few seconds):
 * `systemone-client` (test/systemone.test.js) and OpenAI's `openai` 3.5x, whose
 * `client.decisions.create` test/decisions.test.js calls. Never fatal: offline or without pip
 * those tests say their Python case is skipped, and why.
 */
function pythonClient() {
  console.log('\n==> python clients: systemone-client, openai (for test/systemone.test.js, test/decisions.test.js)');
  const python = ['python3', 'python'].find((py) => which(py));
  const packages = ['systemone-client==0.1.0', 'openai>=3.57,<4'];
  const args = ['-m', 'pip', 'install', '--disable-pip-version-check', '--no-input', ...packages];
  if (!python || run(python, args) !== 0)
    log('python clients not installed: test/systemone.test.js and test/decisions.test.js skip their Python case');
}

console.log('\n==> system packages');
buildPackages();
// Also with --system (.ci/run's step), so that CI runs the test's Python client case.
pythonClient();
// On their own, so that a failure leaves the build tools alone: the browser of `npm run test:ui`
// and a font for its screenshots.
if (!browserPath() && !(aptInstall(['chromium', 'fonts-dejavu-core'], log) && browserPath()))
  log('no Chromium: `npm run test:ui` (the browser tests of the live page) cannot run');

if (!process.argv.includes('--system')) {
  const script = (...p) => path.join(repoRoot, ...p);
  const [npm, npmArgs] = npmCommand();
  if (!fs.existsSync(script('node_modules')))
    step('npm install (also builds the native addon)', npm, [...npmArgs, 'install']);
  else step('build native addon', process.execPath, [script('scripts', 'build.js')]);
  step('fetch model', process.execPath, [script('scripts', 'fetch-model.js')]);
  step('demo (node examples/demo.js)', process.execPath, [script('examples', 'demo.js')]);
  console.log('\n[setup] done. Next:');
  console.log('  npm test                                  # the whole test suite');
  console.log('  node examples/best-of-n.js                # best-of-N by perplexity (more in examples/README.md)');
}
