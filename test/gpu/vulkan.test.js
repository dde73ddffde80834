'use strict';

// The GPU tier (`npm run test:gpu`): the prebuilt installed from its tarballs with the Vulkan
// module package (test/gpu/run.js installs them into a scratch project with no compiler,
// offline, and points LLAMA_BRANCH_PACKAGE at it), on whatever Vulkan device exists. On a machine
// without a GPU that is Mesa's software device, lavapipe, which ggml hides unless
// GGML_VK_VISIBLE_DEVICES names it (test/gpu/run.js sets it). lavapipe runs at about one token
// per second on the 270M model, so every generation here is a few tokens long.
//
// The CPU reference is the same prebuilt with `gpu: false` (one prebuilt per process): its CPU
// backend against the Vulkan module. Nothing here loads the repository's own build.

const assert = require('node:assert/strict');
const os = require('node:os');
const path = require('node:path');
const fs = require('node:fs');
const { spawnSync } = require('node:child_process');

const PACKAGE = process.env.LLAMA_BRANCH_PACKAGE;
if (!PACKAGE)
  throw new Error('LLAMA_BRANCH_PACKAGE must name the installed llama-branch (run through npm run test:gpu)');
const { Branch, BranchStore, createContext, listDevices, gpuModules, systemInfo } = require(PACKAGE);
const MODEL = process.env.LLAMA_TEST_MODEL;

const PROMPT = 'The capital of France is';
const STEPS = 8;

/** A context on the Vulkan device (every layer there unless `options` says otherwise). */
function vulkanContext(options = {}) {
  // The warm-up is tested on its own below; the other tests do not wait for one.
  return createContext({ modelPath: MODEL, nCtx: 512, nThreads: 2, gpu: 'vulkan', warmup: false, ...options });
}

function maxAbsDiff(a, b) {
  let d = 0;
  for (let i = 0; i < a.length; i++) d = Math.max(d, Math.abs(a[i] - b[i]));
  return d;
}

function topK(a, k) {
  return Array.from(a.keys())
    .sort((x, y) => a[y] - a[x])
    .slice(0, k);
}

function argmax(a) {
  return topK(a, 1)[0];
}

async function rejects(fn, code, messagePart) {
  let caught;
  try {
    await fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught, `expected an error with code ${code}, but the call succeeded`);
  assert.equal(caught.code, code, `wrong code; message: ${caught.message}`);
  if (messagePart) assert.match(caught.message, messagePart);
  return caught;
}

/** Greedy continuation of `prompt` on a fresh branch of `ctx`: the `n` tokens. */
async function greedy(ctx, prompt, n) {
  const b = Branch.create(ctx, 0, { temperature: 0 });
  try {
    await b.prefill(await ctx.tokenize(prompt));
    const out = [];
    for (let i = 0; i < n; i++) {
      const t = b.produce().token;
      out.push(t);
      await b.commit(t);
    }
    return out;
  } finally {
    await b.prune();
  }
}

/**
 * llama.cpp's own log of loading the model with `options` (on the Vulkan device unless they say
 * otherwise): a child process at log level info (the log goes to stderr of that process).
 */
function llamaLog(options) {
  const program = `
    const { createContext } = require(${JSON.stringify(PACKAGE)});
    createContext({ modelPath: ${JSON.stringify(MODEL)}, nCtx: 256, nThreads: 2, logLevel: 'info', gpu: 'vulkan', ...${JSON.stringify(options)} })
      .then((ctx) => ctx.dispose(), (e) => { console.error('FAILED', e.code, e.message); process.exit(1); });`;
  const res = spawnSync(process.execPath, ['-e', program], { encoding: 'utf8', timeout: 300000 });
  const log = `${res.stdout}${res.stderr}`;
  assert.equal(res.status, 0, log.slice(-2000));
  return log;
}

describe('GPU tier: Vulkan device', function () {
  this.timeout(600000);
  let device;
  let gpu;
  let cpu;
  const contexts = [];

  before(async () => {
    const gpus = listDevices().filter((d) => d.type === 'gpu');
    assert.ok(
      gpus.length > 0,
      `the prebuilt sees no GPU device (is GGML_VK_VISIBLE_DEVICES set for a CPU-type device such as lavapipe?): ${JSON.stringify(listDevices())} ${JSON.stringify(gpuModules())}`,
    );
    device = gpus[0];
    console.log(
      `      (device ${device.name}: ${device.description}, ${(device.memoryTotal / 2 ** 30).toFixed(1)} GiB)`,
    );
  });

  after(() => {
    for (const ctx of contexts) ctx.dispose();
  });

  it('the prebuilt loaded the Vulkan module package and lists its device with its memory', () => {
    assert.match(device.name, /^Vulkan\d+$/);
    assert.ok(
      device.memoryTotal > 0 && device.memoryFree > 0 && device.memoryFree <= device.memoryTotal,
      JSON.stringify(device),
    );
    const [vulkan] = gpuModules();
    assert.equal(vulkan.variant, 'vulkan');
    assert.equal(vulkan.loaded, true, JSON.stringify(vulkan));
    assert.ok(vulkan.devices >= 1);
    assert.equal(vulkan.error, null);
    assert.match(vulkan.file, /node_modules[\\/]llama-branch-linux-x64-gnu-vulkan[\\/]libggml-vulkan\.so$/);
    assert.match(systemInfo(), /CPU_VARIANT = \S+/);
    assert.match(systemInfo(), /GPU_MODULES = vulkan: \d+ device/);
  });

  it('offloads every layer by default (ctx.offload and llama.cpp’s own log agree)', async () => {
    gpu = await vulkanContext({ nSeqMax: 8 });
    contexts.push(gpu);
    const { layers, totalLayers, devices } = gpu.offload;
    assert.ok(totalLayers > 1);
    assert.equal(layers, totalLayers);
    assert.deepEqual(devices, [device.name]);
    // llama.cpp's log is the independent witness: every layer offloaded, the KV cache on the device.
    const log = llamaLog({});
    assert.match(log, new RegExp(`offloaded ${totalLayers}/${totalLayers} layers to GPU`), log.slice(-2000));
    assert.match(log, new RegExp(`${device.name} KV buffer size`), log.slice(-2000));
  });

  it('greedy tokens and logits agree with the CPU (gpu: false) within the tolerance', async () => {
    // Different kernels (Vulkan shaders vs the CPU's repacked Q4_K) give slightly different
    // logits. Tolerance, teacher-forced on the CPU's greedy tokens for STEPS steps: each
    // side's argmax is in the other's top 5 at every step, the argmaxes agree at >= 6 of 8
    // steps, and no logit differs by 3 or more. On the device alone generation is
    // deterministic (two greedy runs give the same tokens).
    cpu = await createContext({ modelPath: MODEL, nCtx: 512, nThreads: 2, gpu: false });
    contexts.push(cpu);
    assert.deepEqual(cpu.offload.devices, [], 'gpu: false keeps every layer on the CPU');
    const auto = await createContext({ modelPath: MODEL, nCtx: 256, nThreads: 2, warmup: false });
    contexts.push(auto);
    assert.deepEqual(auto.offload.devices, [device.name], "gpu: 'auto' (the default) chose the Vulkan device");
    const ref = Branch.create(cpu, 0, { temperature: 0 });
    const dev = Branch.create(gpu, 0, { temperature: 0 });
    const prompt = await cpu.tokenize(PROMPT);
    assert.deepEqual(await gpu.tokenize(PROMPT), prompt);
    await ref.prefill(prompt);
    await dev.prefill(prompt);
    let agree = 0;
    let maxDiff = 0;
    const steps = [];
    for (let i = 0; i < STEPS; i++) {
      const lc = ref.getLogits();
      const lg = dev.getLogits();
      maxDiff = Math.max(maxDiff, maxAbsDiff(lc, lg));
      const [tc, tg] = [topK(lc, 5), topK(lg, 5)];
      steps.push(`${tc[0]}/${tg[0]}`);
      assert.ok(tc.includes(tg[0]) && tg.includes(tc[0]), `step ${i}: CPU top 5 ${tc}, Vulkan top 5 ${tg}`);
      if (tc[0] === tg[0]) agree++;
      await ref.commit(tc[0]);
      await dev.commit(tc[0]);
    }
    await ref.prune();
    await dev.prune();
    console.log(`      (argmax CPU/Vulkan per step: ${steps.join(' ')}; max |Δlogit| ${maxDiff.toFixed(3)})`);
    assert.ok(agree >= 6, `argmax agreed at ${agree}/${STEPS} steps`);
    assert.ok(maxDiff < 3, `max |logit difference| ${maxDiff}`);
    const first = await greedy(gpu, PROMPT, 4);
    assert.deepEqual(await greedy(gpu, PROMPT, 4), first);
  });

  it('fork + store.commit + store.prefill with the KV cache on the device', async () => {
    const store = new BranchStore(gpu);
    const root = Branch.create(gpu, 0, { temperature: 0 });
    const prompt = await gpu.tokenize('List of fruits:');
    await root.prefill(prompt);
    const kids = Array.from({ length: 4 }, () => root.fork());
    const firstTokens = topK(root.getLogits(), 4);
    await store.commit(kids.map((b, j) => [b, firstTokens[j]]));
    const more = await gpu.tokenize(' and then', false);
    await store.prefill(kids.map((b) => [b, more]));
    const start = prompt.length;
    for (const k of kids) assert.equal(k.position, start + 1 + more.length);
    // Each fork saw the shared prefix: its next-token logits match a branch that decoded the
    // same tokens from scratch on the device (same device: a different batch shape, so top-5
    // agreement rather than equality).
    for (const [j, k] of kids.entries()) {
      const fresh = Branch.create(gpu, 0, { temperature: 0 });
      await fresh.prefill([...prompt, firstTokens[j], ...more]);
      const [a, b] = [topK(k.getLogits(), 5), topK(fresh.getLogits(), 5)];
      assert.ok(a.includes(b[0]) && b.includes(a[0]), `branch ${j}: fork top 5 ${a}, from scratch ${b}`);
      await fresh.prune();
    }
    const distinct = new Set(kids.map((k) => argmax(k.getLogits())));
    assert.ok(
      distinct.size > 1 || new Set(kids.map((k) => k.getLogits().slice(0, 64).join())).size > 1,
      'the forks diverged',
    );
    // retainOnly keeps one branch, frees the rest on the device, and the winner goes on.
    const winner = kids[1];
    await store.retainOnly(winner);
    assert.equal(winner.disposed, false);
    for (const k of [root, kids[0], kids[2], kids[3]]) assert.equal(k.disposed, true);
    const pos = winner.position;
    await winner.commit(winner.produce().token);
    assert.equal(winner.position, pos + 1);
    await winner.prune();
  });

  it('KV state save and load on the device restores the same logits', async () => {
    const tokens = await gpu.tokenize('Once upon a time');
    await gpu.decode(tokens, 0, 5);
    const state = await gpu.kvCacheSave(5);
    assert.ok(state.length > 0);
    await gpu.kvCacheLoad(6, state);
    const next = tokens[tokens.length - 1];
    // The same token at the same position on both sequences, one decode each: identical inputs
    // and batch shape on one device, so the logits match.
    await gpu.decode([next], tokens.length, 5);
    const original = Float32Array.from(gpu.getLogits());
    await gpu.decode([next], tokens.length, 6);
    const restored = Float32Array.from(gpu.getLogits());
    const diff = maxAbsDiff(original, restored);
    assert.ok(diff < 1e-3, `max |Δlogit| between the saved and the restored sequence: ${diff}`);
    // A file round trip too.
    const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-gpu-')), 'seq.state');
    try {
      await gpu.kvCacheWriteFile(5, file, [...tokens, next]);
      const back = await gpu.kvCacheReadFile(7, file);
      assert.deepEqual(back.tokens, [...tokens, next]);
    } finally {
      fs.rmSync(path.dirname(file), { recursive: true, force: true });
    }
    for (const seq of [5, 6, 7]) await gpu.kvCacheRemove(seq, -1, -1);
  });

  it('partial offload: nGpuLayers puts only that many layers on the device', async () => {
    const half = await vulkanContext({ nGpuLayers: 5, nCtx: 256 });
    contexts.push(half);
    assert.equal(half.offload.layers, 5);
    assert.deepEqual(half.offload.devices, [device.name]);
    const none = await vulkanContext({ nGpuLayers: 0, nCtx: 256 });
    contexts.push(none);
    assert.deepEqual(none.offload.devices, []);
    // What llama.cpp itself did with those options (not only our echo of them).
    const total = half.offload.totalLayers;
    let log = llamaLog({ nGpuLayers: 5 });
    assert.match(log, new RegExp(`offloaded 5/${total} layers to GPU`), log.slice(-2000));
    log = llamaLog({ nGpuLayers: 0 });
    assert.match(log, new RegExp(`offloaded 0/${total} layers to GPU`), log.slice(-2000));
    const a = await greedy(half, PROMPT, 2);
    const b = await greedy(none, PROMPT, 2);
    assert.equal(a.length, 2);
    assert.equal(b.length, 2);
  });

  /**
   * Per batch size N (forks of one prompt, one store.commit per step): the first step's
   * milliseconds over the second's.
   */
  async function firstOverWarm(ctx, sizes) {
    const store = new BranchStore(ctx);
    const root = Branch.create(ctx, 0, { temperature: 0 });
    await root.prefill(await ctx.tokenize(PROMPT));
    const ratios = {};
    for (const n of sizes) {
      const kids = [];
      for (let i = 0; i < n; i++) kids.push(await root.fork());
      const ms = [];
      for (let s = 0; s < 2; s++) {
        const t = performance.now();
        const produced = store.produce(kids);
        await store.commit(kids.map((k, i) => [k, produced[i].token]));
        ms.push(performance.now() - t);
      }
      ratios[n] = Math.round((ms[0] / ms[1]) * 100) / 100;
      for (const k of kids) await k.prune();
    }
    await root.prune();
    return ratios;
  }

  it('after the warm-up, the first step at a new batch size costs at most 3 × a warm one', async () => {
    // A size the warm-up's ladder does not name exactly (11) as well as ones it does (3, 6).
    const sizes = [3, 6, 11];
    const warmed = await vulkanContext({ nCtx: 256, nSeqMax: 12, warmup: { maxTokens: 12, cacheLengths: [] } });
    contexts.push(warmed);
    const status = await warmed.ready;
    assert.equal(status.state, 'ready', JSON.stringify(status));
    assert.deepEqual(
      status.sizes.map((s) => s.tokens),
      [1, 2, 3, 4, 5, 6, 7, 8, 9, 12],
    );
    assert.ok(
      status.sizes.every((s) => s.ms > 0),
      JSON.stringify(status.sizes),
    );
    const after = await firstOverWarm(warmed, sizes);
    warmed.dispose();
    // The same on a context without warm-up, for the record (on lavapipe a compile costs less
    // than on a real GPU relative to its slow steps; bench/gpu-steps.js measures a real one).
    const cold = await vulkanContext({ nCtx: 256, nSeqMax: 12 });
    contexts.push(cold);
    const without = await firstOverWarm(cold, [11]);
    cold.dispose();
    console.log(
      `      (first step / warm step by N: warmed ${JSON.stringify(after)}, without warm-up ${JSON.stringify(without)}; warm-up ${status.ms} ms)`,
    );
    for (const n of sizes) assert.ok(after[n] <= 3, `N = ${n}: the first step took ${after[n]} × a warm one`);
  });

  it('bad device options are coded errors before anything loads', async () => {
    const total = gpu.offload.totalLayers;
    await rejects(() => vulkanContext({ devices: ['Vulkan99'] }), 'ERR_DEVICE', /unknown device/);
    await rejects(() => vulkanContext({ devices: ['CPU'] }), 'ERR_DEVICE', /CPU/);
    await rejects(() => vulkanContext({ devices: [device.name, device.name] }), 'ERR_DEVICE', /twice/);
    await rejects(() => vulkanContext({ nGpuLayers: total + 1 }), 'ERR_DEVICE', /nGpuLayers/);
    await rejects(() => vulkanContext({ tensorSplit: [1, 1] }), 'ERR_DEVICE', /tensorSplit has 2 entries but 1 device/);
    await rejects(() => vulkanContext({ mainGpu: 1 }), 'ERR_DEVICE', /mainGpu/);
    await rejects(() => vulkanContext({ splitMode: 'diagonal' }), 'ERR_INVALID_ARG', /splitMode/);
    // The device still works after the refusals.
    assert.equal((await greedy(gpu, 'Hello', 2)).length, 2);
  });
});
