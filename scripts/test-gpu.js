#!/usr/bin/env node
'use strict';

/**
 * The GPU tier (`npm run test:gpu`): builds the Vulkan variant of the addon beside the CPU one
 * and runs test/gpu/ on whatever Vulkan device this machine has.
 *
 *   1. a Vulkan driver: when none is installed, Mesa's (lavapipe, a software Vulkan device that
 *      runs on any CPU) is installed with apt as root (scripts/vulkan.js);
 *   2. the CPU build (scripts/build.js; cheap when up to date): the reference the device is
 *      compared with;
 *   3. the Vulkan build into build/vulkan/ (LLAMA_BRANCH_FEATURES=vulkan, its own cargo target
 *      dir ~/.cache/llama-branch/target-vulkan), after installing the Vulkan headers, loader and
 *      glslc with apt (scripts/vulkan.js; build.js itself installs nothing). Its duration is printed: the first one compiles llama.cpp and
 *      ggml's shaders (~10 minutes on 2 cores);
 *   4. the default model (scripts/fetch-model.js), then mocha on test/gpu/.
 *
 * GGML_VK_VISIBLE_DEVICES defaults to 0: ggml hides CPU-type Vulkan devices such as lavapipe
 * unless they are named. Set it to choose other devices.
 *
 * Exits with the failing step's code; never reports success without running the tests.
 */

const path = require('node:path');
const { repoRoot, run, formatDuration } = require('./env');
const { ensureVulkanDriver, installVulkanBuild } = require('./vulkan');

const node = process.execPath;

function step(name, fn) {
  console.error(`\n=== ${name}`);
  const started = Date.now();
  const code = fn();
  console.error(
    `=== ${name}: ${code === 0 ? 'ok' : `FAILED (exit ${code})`} in ${formatDuration(Date.now() - started)}`,
  );
  if (code !== 0) process.exit(code);
}

function main() {
  const env = { ...process.env };
  step('Vulkan driver', () => {
    if (ensureVulkanDriver()) return 0;
    console.error('no Vulkan driver: the GPU tier cannot run here (install a GPU driver or mesa-vulkan-drivers)');
    return 1;
  });
  step('CPU build (the reference)', () => run(node, [path.join(repoRoot, 'scripts', 'build.js')]));
  step('Vulkan build prerequisites', () => {
    installVulkanBuild();
    return 0;
  });
  step('Vulkan build into build/vulkan/', () =>
    run(node, [path.join(repoRoot, 'scripts', 'build.js'), '--out', path.join('build', 'vulkan')], {
      env: { ...env, LLAMA_BRANCH_FEATURES: 'vulkan' },
    }),
  );
  step('model', () => run(node, [path.join(repoRoot, 'scripts', 'fetch-model.js')]));
  if (!env.GGML_VK_VISIBLE_DEVICES) env.GGML_VK_VISIBLE_DEVICES = '0';
  console.error(`GGML_VK_VISIBLE_DEVICES=${env.GGML_VK_VISIBLE_DEVICES}`);
  const mocha = path.join(repoRoot, 'node_modules', 'mocha', 'bin', 'mocha.js');
  step('GPU tests (test/gpu)', () =>
    run(node, [mocha, '--no-config', '--timeout', '600000', '--node-option', 'expose-gc', path.join('test', 'gpu')], {
      env,
      // lavapipe is slow; a hang still fails instead of sticking.
      timeout: 40 * 60 * 1000,
    }),
  );
}

main();
