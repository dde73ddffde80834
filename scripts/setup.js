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
const { installPython } = require('./python');

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
 * The Python test dependencies from PyPI, each pinned: `systemone-client` (test/systemone.test.js)
 * and OpenAI's `openai` 3.5x, whose `client.decisions.create` test/decisions.test.js calls (a few
 * seconds); SGLang's model gateway `sglang-router` (a Rust binary in a wheel), which
 * test/router.test.js puts in front of three replicas, and its successor `smg` (the Shepherd Model
 * Gateway), which test/smg.test.js puts in front of three gRPC workers; NVIDIA Dynamo's KV indexer
 * (`ai-dynamo-runtime`, with `pyzmq` and `msgspec`), which test/kv-events.test.js reads the KV
 * event stream with. Where the machine's Python is externally managed (Debian's), they go into a
 * venv under ~/.cache/llama-branch (scripts/python.js), which the tests then run. Never fatal
 * here: outside CI those tests say they are skipped, and why; in CI (CI set) the router and KV
 * event tests fail without them.
 */
function pythonClient() {
  console.log('\n==> python test dependencies (systemone, decisions, router, kv-events, images tests)');
  const python = installPython({ log, aptInstall });
  const pip = (...pkgs) =>
    python && run(python, ['-m', 'pip', 'install', '--disable-pip-version-check', '--no-input', ...pkgs]) === 0;
  if (!pip('systemone-client==0.1.0', 'openai>=3.57,<4'))
    log('python clients not installed: test/systemone.test.js and test/decisions.test.js skip their Python case');
  if (!pip('sglang-router==0.3.2')) log('sglang-router not installed: test/router.test.js cannot run');
  // SGLang's router line as it continues (the Shepherd Model Gateway): exact KV-event routing over gRPC.
  if (!pip('smg==1.13.0')) log('smg not installed: test/smg.test.js cannot run');
  // The writer of test/images.test.js's random-weight projector (test/helpers/make-mmproj.py).
  if (!pip('gguf==0.19.0')) log('gguf not installed: test/images.test.js cannot write its test projector');
  // NVIDIA Dynamo's KV indexer (a 75 MB wheel); ZeroMQ and msgspec (vLLM's event structs) to read the stream.
  if (!pip('ai-dynamo-runtime==1.6.1', 'pyzmq==27.3.0', 'msgspec==0.23.0'))
    log('the KV event consumer is not installed: test/kv-events.test.js cannot run');
}

console.log('\n==> system packages');
buildPackages();
// Also with --system (.ci/run's step), so that CI runs the tests that need them.
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
