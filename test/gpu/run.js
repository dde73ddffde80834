#!/usr/bin/env node
'use strict';

/**
 * The GPU tier (`npm run test:gpu`): the prebuilt with its Vulkan module package, installed the
 * way a user installs it — from the tarballs, into a scratch project, with no compiler on PATH
 * and no network — and run on whatever Vulkan device this machine has.
 *
 *   1. a Vulkan driver: when none is installed, Mesa's (lavapipe, a software Vulkan device that
 *      runs on any CPU) is installed with apt as root (scripts/vulkan.js);
 *   2. the tarballs of `npm run build:prebuilt -- --vulkan` (main, platform and Vulkan module
 *      packages): reused when `npm test` already built them (it does whenever the Vulkan build
 *      prerequisites are installed, as `.ci/run` arranges), else built now after installing
 *      those prerequisites with apt; the build's duration is printed;
 *   3. the three tarballs installed into a scratch project (test/install/scratch.js: no registry
 *      but a loopback one, an empty npm cache, the dependency closure packed from node_modules; install time and the
 *      Vulkan package's size printed);
 *   4. the default model, then mocha on test/gpu/ against the installed package
 *      (LLAMA_BRANCH_PACKAGE);
 *   5. the fallback: with the Vulkan loader broken (a libvulkan.so.1 that is not a library first
 *      on LD_LIBRARY_PATH), with no driver (VK_ICD_FILENAMES naming none) and with the module
 *      removed from its package, `gpu: 'auto'` runs on the CPU, `gpuModules()` and
 *      `llama-branch devices` give the reason, and `gpu: 'vulkan'` is ERR_DEVICE with it — never
 *      a crash.
 *
 * GGML_VK_VISIBLE_DEVICES defaults to 0: ggml hides CPU-type Vulkan devices such as lavapipe
 * unless they are named. Set it to choose other devices.
 *
 * Exits with the failing step's code; never reports success without running the tests.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { repoRoot, run, formatDuration } = require('../../scripts/env');
const { ensureVulkanDriver, installVulkanBuild } = require('../../scripts/vulkan');
const { ensureTarballs, noCompilerEnv, COMPILERS } = require('../install/prebuilt');
const { scratchInstall } = require('../install/scratch');
const { platformPackageName } = require('../../lib/loader');

const node = process.execPath;

function step(name, fn) {
  console.error(`\n=== ${name}`);
  const started = Date.now();
  let code;
  try {
    code = fn();
  } catch (e) {
    console.error(e.stack || e.message);
    code = 1;
  }
  console.error(
    `=== ${name}: ${code === 0 ? 'ok' : `FAILED (exit ${code})`} in ${formatDuration(Date.now() - started)}`,
  );
  if (code !== 0) process.exit(code);
}

const mib = (bytes) => `${(bytes / 2 ** 20).toFixed(1)} MiB`;

/** What a program in the scratch project printed last, as JSON (it prints one object). */
function runIn(project, env, program) {
  const res = spawnSync(node, ['-e', program], { cwd: project, env, encoding: 'utf8', timeout: 300000 });
  if (res.status !== 0)
    throw new Error(`exit ${res.status} (signal ${res.signal}): ${res.stderr.slice(-2000)} ${res.stdout.slice(-500)}`);
  return JSON.parse(res.stdout.trim().split('\n').pop());
}

/** The fallback probe: what `gpu: 'auto'` and `gpu: 'vulkan'` do, and why the module is off. */
const FALLBACK = (model) => `
  const llama = require('llama-branch');
  const warnings = [];
  process.on('warning', (w) => warnings.push(w.code));
  (async () => {
    const ctx = await llama.createContext({ modelPath: ${JSON.stringify(model)}, nCtx: 256, nThreads: 2 });
    const auto = ctx.offload;
    const b = llama.Branch.create(ctx, 0, { temperature: 0 });
    await b.prefill(await ctx.tokenize('Hello'));
    const token = b.produce().token;
    ctx.dispose();
    let vulkan = null;
    try {
      (await llama.createContext({ modelPath: ${JSON.stringify(model)}, nCtx: 256, gpu: 'vulkan' })).dispose();
    } catch (e) {
      vulkan = { code: e.code, message: e.message };
    }
    await new Promise((resolve) => setImmediate(resolve)); // warnings are emitted on the next tick
    console.log(JSON.stringify({ auto, token, vulkan, warnings, modules: llama.gpuModules(), info: llama.systemInfo() }));
  })().catch((e) => { console.error(e.code, e.message); process.exit(1); });`;

function main() {
  const env = { ...process.env };
  step('Vulkan driver', () => {
    if (ensureVulkanDriver()) return 0;
    console.error('no Vulkan driver: the GPU tier cannot run here (install a GPU driver or mesa-vulkan-drivers)');
    return 1;
  });
  let tarballs;
  step('prebuilt tarballs with the Vulkan module (npm run build:prebuilt -- --vulkan)', () => {
    installVulkanBuild();
    tarballs = ensureTarballs({ vulkan: true });
    for (const [kind, file] of Object.entries(tarballs))
      console.error(`${kind.padEnd(8)} ${path.basename(file)}  ${mib(fs.statSync(file).size)} packed`);
    return 0;
  });
  const model = env.LLAMA_TEST_MODEL ? path.resolve(env.LLAMA_TEST_MODEL) : null;
  step('model', () => (model ? 0 : run(node, [path.join(repoRoot, 'scripts', 'fetch-model.js')])));
  const modelPath = model || require('../../scripts/fetch-model').ensureModel();

  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-gpu-'));
  const project = path.join(dir, 'project');
  const scratch = noCompilerEnv(dir);
  if (!env.GGML_VK_VISIBLE_DEVICES) env.GGML_VK_VISIBLE_DEVICES = '0';
  const userEnv = { ...scratch, GGML_VK_VISIBLE_DEVICES: env.GGML_VK_VISIBLE_DEVICES };
  try {
    step('install the three tarballs from the loopback registry, no compiler on PATH', () => {
      for (const tool of COMPILERS) {
        if (!spawnSync(tool, ['--version'], { env: scratch, stdio: 'ignore' }).error)
          throw new Error(`${tool} is reachable from the scratch PATH`);
      }
      const res = scratchInstall({
        dir,
        tarballs: [tarballs.main, tarballs.platform, tarballs.vulkan],
        env: scratch,
        npm: [path.join(dir, 'bin', 'npm'), []],
      });
      if (res.status !== 0) throw new Error(`npm install exited with ${res.status}: ${res.output}`);
      const vulkanDir = path.join(project, 'node_modules', platformPackageName('vulkan'));
      const size = fs.readdirSync(vulkanDir).reduce((sum, f) => sum + fs.statSync(path.join(vulkanDir, f)).size, 0);
      console.error(`installed in ${formatDuration(res.ms)}; ${platformPackageName('vulkan')}: ${mib(size)} unpacked`);
      return 0;
    });
    step('llama-branch devices (in the scratch project)', () => {
      const bin = path.join(project, 'node_modules', 'llama-branch', 'bin', 'llama-branch.js');
      return run(node, [bin, 'devices'], { env: userEnv, cwd: project });
    });
    console.error(`GGML_VK_VISIBLE_DEVICES=${env.GGML_VK_VISIBLE_DEVICES}`);
    const mocha = path.join(repoRoot, 'node_modules', 'mocha', 'bin', 'mocha.js');
    step('GPU tests (test/gpu/*.test.js) on the installed prebuilt', () =>
      run(
        node,
        [
          mocha,
          '--no-config',
          '--forbid-only',
          '--forbid-pending',
          '--timeout',
          '600000',
          path.join(repoRoot, 'test', 'gpu', '*.test.js'),
        ],
        {
          env: {
            ...env,
            // An empty shader cache: the warm-up test compares first and warm steps, and Mesa's
            // cache of an earlier run would hide every compile.
            MESA_SHADER_CACHE_DIR: fs.mkdtempSync(path.join(dir, 'mesa-cache-')),
            LLAMA_BRANCH_PACKAGE: path.join(project, 'node_modules', 'llama-branch'),
            LLAMA_TEST_MODEL: modelPath,
          },
          // lavapipe is slow; a hang still fails instead of sticking.
          timeout: 40 * 60 * 1000,
        },
      ),
    );
    step('fallback to the CPU, with the reason', () => fallbacks(dir, project, userEnv, modelPath));
  } finally {
    if (process.env.KEEP_PACK_DIR === '1') console.error(`kept ${dir}`);
    else fs.rmSync(dir, { recursive: true, force: true });
  }
}

/** Step 5: three ways for the Vulkan module to be unusable; each falls back to the CPU with its reason. */
function fallbacks(dir, project, userEnv, model) {
  const broken = path.join(dir, 'broken-loader');
  fs.mkdirSync(broken);
  fs.writeFileSync(path.join(broken, 'libvulkan.so.1'), 'not a shared library\n');
  const cases = [
    { name: 'no usable libvulkan.so.1', env: { LD_LIBRARY_PATH: broken }, reason: /libvulkan\.so\.1/ },
    {
      name: 'no Vulkan driver',
      env: { VK_ICD_FILENAMES: path.join(dir, 'none.json'), VK_DRIVER_FILES: path.join(dir, 'none.json') },
      reason: /did not initialise|no GPU|found no/,
    },
    { name: 'the module removed', remove: true, reason: /missing from the package/ },
  ];
  const moduleFile = path.join(project, 'node_modules', platformPackageName('vulkan'), 'libggml-vulkan.so');
  for (const c of cases) {
    const saved = c.remove ? fs.readFileSync(moduleFile) : null;
    if (c.remove) fs.rmSync(moduleFile);
    try {
      const out = runIn(project, { ...userEnv, ...(c.env || {}) }, FALLBACK(model));
      const [status] = out.modules;
      if (out.auto.devices.length !== 0) throw new Error(`${c.name}: gpu 'auto' used ${out.auto.devices}`);
      if (status.loaded && status.devices > 0) throw new Error(`${c.name}: the module reports loaded`);
      if (!c.reason.test(status.error)) throw new Error(`${c.name}: reason ${JSON.stringify(status.error)}`);
      if (!out.vulkan || out.vulkan.code !== 'ERR_DEVICE' || !out.vulkan.message.includes(status.error))
        throw new Error(`${c.name}: gpu 'vulkan' gave ${JSON.stringify(out.vulkan)}`);
      if (!/GPU_MODULES = vulkan: off/.test(out.info)) throw new Error(`${c.name}: systemInfo() ${out.info}`);
      if (!out.warnings.includes('LLAMA_BRANCH_GPU_FALLBACK'))
        throw new Error(`${c.name}: gpu 'auto' fell back without its warning (${out.warnings})`);
      console.error(`${c.name}: CPU (token ${out.token}); reason: ${status.error}`);
    } finally {
      if (saved) fs.writeFileSync(moduleFile, saved);
    }
  }
  return 0;
}

if (require.main === module) main();
