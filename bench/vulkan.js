#!/usr/bin/env node
'use strict';

/**
 * The Vulkan prebuilt against the source Vulkan build, in one run (issue 27): greedy decoding
 * of one branch with every layer on the first Vulkan device, tokens/s of the decode loop (model
 * load and prompt excluded), each build in its own child process (a prebuilt and a source
 * build do not share a process), alternated over --reps rounds; medians and their ratio.
 *
 *   prebuilt  dist/'s three tarballs (npm run build:prebuilt -- --vulkan) installed (loopback registry) into
 *             a scratch project with an empty npm cache (test/install/scratch.js): the CPU
 *             prebuilt plus llama-branch-<platform>-vulkan
 *   source    build/vulkan/ (LLAMA_BRANCH_FEATURES=vulkan npm run build -- --out build/vulkan)
 *
 * On a machine without a GPU the device is lavapipe (set GGML_VK_VISIBLE_DEVICES=0, as the GPU
 * tier does): slow, so the default is 16 tokens.
 *
 * Usage: node bench/vulkan.js [--reps=3] [--tokens=16]   (or npm run bench -- --vulkan)
 * Writes bench/results/vulkan-<timestamp>.json and prints the numbers.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const { args, modelPath, median } = require('./common');
const { scratchInstall } = require('../test/install/scratch');

const REPS = Number(args.reps || 3);
const TOKENS = Number(args.tokens || 16);
const ROOT = path.join(__dirname, '..');
const log = (...a) => console.error('[bench:vulkan]', ...a);

/** One measurement in a child: tokens/s of `TOKENS` greedy steps on the Vulkan device. */
const PROGRAM = (load, model) => `
  const llama = ${load};
  (async () => {
    const ctx = await llama.createContext({ modelPath: ${JSON.stringify(model)}, nCtx: 512, nThreads: 2, gpu: 'vulkan' }, ${'$'}{LOAD_OPTIONS});
    const b = llama.Branch.create(ctx, 0, { temperature: 0 });
    await b.prefill(await ctx.tokenize('The history of the printing press'));
    await b.commit(b.produce().token); // first step: shader warm-up
    const t0 = performance.now();
    for (let i = 0; i < ${TOKENS}; i++) await b.commit(b.produce().token);
    const s = (performance.now() - t0) / 1000;
    console.log(JSON.stringify({ tokS: ${TOKENS} / s, devices: ctx.offload.devices }));
    ctx.dispose();
  })().catch((e) => { console.error(e.code, e.message); process.exit(1); });`;

function measure(program, cwd) {
  const res = spawnSync(process.execPath, ['-e', program], { cwd, encoding: 'utf8', timeout: 900000 });
  if (res.status !== 0) throw new Error(`${res.stderr}\n${res.stdout}`);
  return JSON.parse(res.stdout.trim().split('\n').pop());
}

async function main() {
  if (!process.env.GGML_VK_VISIBLE_DEVICES) process.env.GGML_VK_VISIBLE_DEVICES = '0';
  const model = modelPath();
  const { version } = require('../package.json');
  const { platformPackageName } = require('../lib/loader');
  const dist = path.join(ROOT, 'dist');
  const tarballs = [
    `llama-branch-${version}.tgz`,
    `${platformPackageName(null)}-${version}.tgz`,
    `${platformPackageName('vulkan')}-${version}.tgz`,
  ].map((t) => path.join(dist, t));
  for (const t of tarballs)
    if (!fs.existsSync(t)) throw new Error(`${t} is missing: npm run build:prebuilt -- --vulkan`);
  if (!fs.existsSync(path.join(ROOT, 'build', 'vulkan', 'llama_branch.node')))
    throw new Error('build/vulkan/ is missing: LLAMA_BRANCH_FEATURES=vulkan npm run build -- --out build/vulkan');
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-bench-vk-'));
  try {
    const installed = scratchInstall({ dir, tarballs });
    if (installed.status !== 0) throw new Error(installed.output);
    const project = installed.project;
    const series = {
      prebuilt: PROGRAM("require('llama-branch')", model).replace('${LOAD_OPTIONS}', 'undefined'),
      source: PROGRAM(`require(${JSON.stringify(ROOT)})`, model).replace('${LOAD_OPTIONS}', "{ gpuVariant: 'vulkan' }"),
    };
    const results = { prebuilt: [], source: [] };
    for (let r = 0; r < REPS; r++) {
      for (const name of r % 2 === 0 ? ['prebuilt', 'source'] : ['source', 'prebuilt']) {
        const m = measure(series[name], name === 'prebuilt' ? project : ROOT);
        results[name].push(m.tokS);
        log(`round ${r + 1} ${name}: ${m.tokS.toFixed(3)} tok/s on ${m.devices.join(', ')}`);
      }
    }
    const out = {
      date: new Date().toISOString(),
      tokens: TOKENS,
      reps: REPS,
      device: process.env.GGML_VK_VISIBLE_DEVICES,
      prebuiltTokS: median(results.prebuilt),
      sourceTokS: median(results.source),
      ratio: median(results.prebuilt) / median(results.source),
      rounds: results,
    };
    console.log(
      `Vulkan, ${TOKENS} greedy tokens, median of ${REPS}: prebuilt ${out.prebuiltTokS.toFixed(3)} tok/s, source build ${out.sourceTokS.toFixed(3)} tok/s, prebuilt/source ${out.ratio.toFixed(3)}`,
    );
    const file = path.join(__dirname, 'results', `vulkan-${Date.now()}.json`);
    fs.writeFileSync(file, `${JSON.stringify(out, null, 2)}\n`);
    log(`wrote ${path.relative(ROOT, file)}`);
  } finally {
    fs.rmSync(dir, { recursive: true, force: true });
  }
}

module.exports = { main };
if (require.main === module)
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
