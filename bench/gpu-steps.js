#!/usr/bin/env node
'use strict';

/**
 * The GPU in practice (issue 39), in one command: first-use stalls with and without the
 * warm-up, what the warm-up itself costs (cold, and again with the driver's pipeline cache on
 * disk), where a batched step's time goes at each N, and a server's throughput right after it
 * starts. Every phase runs in its own process (a fresh Vulkan instance), each with its own
 * driver pipeline-cache folder so that "cold" really is cold:
 *
 *   stalls-off     warm-up off, empty driver cache: each N's first step against its warm steps
 *   stalls-on      warm-up on, empty driver cache: the warm-up's time, then the same table
 *   stalls-again   warm-up on, the cache stalls-on left: the warm-up's time between runs
 *   stalls-long-plain / stalls-long   N forks of a 4,000-token prompt (attention over a longer
 *                  cache), after a warm-up without / with its long-cache decodes
 *   profile        LLAMA_BRANCH_PROFILE=1: per N, the native phases of produce and commit
 *                  (validate, llama_decode — graph build, GPU work, synchronisation and llama.cpp's
 *                  logits copy —, our row copy and surprisal, bookkeeping) against the step seen
 *                  from JS; what is left is the worker round trip and the JS around it
 *   perf           GGML_VK_PERF_LOGGER=1 at N = 1 and N = 64: ggml's per-op GPU times (raw log)
 *   serve-off/on   `llama-branch serve` with --no-warmup / with the warm-up (waiting for /health
 *                  200), then 16 and 64 concurrent completions at once, twice: first and warm
 *
 * Usage: node bench/gpu-steps.js [--package=DIR] [--gpu=vulkan] [--sizes=1,2,4,8,16,32,64,128,255]
 *          [--steps=6] [--phases=stalls-off,...] [--clients=16,64] [--out=DIR]
 * --package: an installed llama-branch (default: this checkout). Writes gpu-steps.json and
 * gpu-steps.md (the tables) to --out (default bench/results/), and perf-logger.txt.
 * On a machine without a GPU, GGML_VK_VISIBLE_DEVICES=0 selects lavapipe (slow: use small sizes).
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { args, modelPath, median } = require('./common');

const PACKAGE = path.resolve(String(args.package || path.join(__dirname, '..')));
const GPU = String(args.gpu || 'vulkan');
const SIZES = String(args.sizes || '1,2,4,8,16,32,64,128,255')
  .split(',')
  .map(Number);
const STEPS = Number(args.steps || 6);
const OUT = path.resolve(String(args.out || path.join(__dirname, 'results')));
const PHASES = String(
  args.phases || 'stalls-off,stalls-on,stalls-again,stalls-long-plain,stalls-long,profile,perf,serve-off,serve-on',
).split(',');
const PREFILLS = [48, 200, 500];
/** Tokens of the prompt every N forks from (a long one: attention over a longer cache). */
const ROOT_TOKENS = Number(args.root || 32);
/** `--lengths=none`: the warm-up skips its long-cache decodes. */
const WARMUP = args.lengths === 'none' ? { cacheLengths: [] } : true;
const CLIENTS = String(args.clients || '16,64')
  .split(',')
  .map(Number);
const log = (...a) => console.error('[bench:gpu-steps]', ...a);
const round = (x, d = 2) => Math.round(x * 10 ** d) / 10 ** d;

const TEXT =
  'The printing press changed how knowledge moved through Europe. Before it, books were copied by hand, ' +
  'slowly and at great cost; after it, a single workshop could produce hundreds of identical copies in ' +
  'the time a scribe needed for one. Ideas travelled faster, arguments could be checked against the same ' +
  'page in different cities, and the number of people who could read grew with the number of things to read. ';

// ------------------------------------------------------------------------------------------
// Children

/** One context: optional warm-up, then per N the first step against the warm ones, and prefills. */
async function stallsChild(warmup) {
  const llama = require(PACKAGE);
  const maxN = Math.max(...SIZES);
  const started = performance.now();
  const ctx = await llama.createContext({
    modelPath: modelPath(),
    nCtx: 16384,
    nSeqMax: Math.min(256, maxN + 1),
    gpu: GPU === 'cpu' ? false : GPU,
    warmup,
  });
  const loadMs = performance.now() - started;
  const warm = await ctx.ready;
  const text = await ctx.tokenize(TEXT.repeat(Math.ceil(ROOT_TOKENS / 80) + 8));
  const store = new llama.BranchStore(ctx);
  const prefills = [];
  for (const length of PREFILLS) {
    const times = [];
    for (let i = 0; i < 2; i++) {
      const b = llama.Branch.create(ctx, 0, { temperature: 0 });
      const t = performance.now();
      await b.prefill(text.slice(0, length));
      times.push(performance.now() - t);
      await b.prune();
    }
    prefills.push({ tokens: length, firstMs: round(times[0]), againMs: round(times[1]) });
  }
  const root = llama.Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(text.slice(0, ROOT_TOKENS));
  const steps = [];
  for (const n of SIZES) {
    const kids = [];
    for (let i = 0; i < n; i++) kids.push(await root.fork());
    const times = [];
    const produceMs = [];
    for (let s = 0; s < STEPS; s++) {
      const t = performance.now();
      const produced = store.produce(kids);
      produceMs.push(performance.now() - t);
      await store.commit(kids.map((k, i) => [k, produced[i].token]));
      times.push(performance.now() - t);
    }
    for (const k of kids) await k.prune();
    const warmMs = median(times.slice(1));
    steps.push({
      n,
      firstMs: round(times[0]),
      warmMs: round(warmMs),
      ratio: round(times[0] / warmMs),
      produceMs: round(median(produceMs.slice(1))),
      tokS: round((n * 1000) / warmMs, 0),
    });
  }
  const result = {
    loadMs: round(loadMs, 0),
    warmup: { state: warm.state, ms: warm.ms, total: warm.total },
    offload: ctx.offload,
    prefills,
    steps,
  };
  ctx.dispose();
  return result;
}

// ------------------------------------------------------------------------------------------
// Parent

/** Runs this script as a child with `flags`, `env` added; resolves with its JSON and stderr. */
function child(flags, env) {
  return new Promise((resolve, reject) => {
    const p = spawn(process.execPath, [__filename, ...flags], {
      env: { ...process.env, ...env },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    p.stdout.on('data', (d) => (out += d));
    p.stderr.on('data', (d) => (err += d));
    p.on('close', (code) => {
      if (code !== 0) return reject(new Error(`child ${flags.join(' ')} exited ${code}\n${err.slice(-4000)}`));
      resolve({ json: JSON.parse(out.trim().split('\n').pop()), stderr: err });
    });
  });
}

/** The driver's pipeline cache folders (NVIDIA's and Mesa's), fresh or reused by name. */
function cacheEnv(name) {
  const dir = path.join(os.tmpdir(), 'llama-branch-gpu-cache', name);
  fs.mkdirSync(dir, { recursive: true });
  return { __GL_SHADER_DISK_CACHE_PATH: dir, __GL_SHADER_DISK_CACHE_SKIP_CLEANUP: '1', MESA_SHADER_CACHE_DIR: dir };
}

/** Medians of the profile lines of one op (`produce` / `commit`) per n: total and each phase. */
function parseProfile(stderr) {
  const byKey = new Map();
  for (const line of stderr.split('\n')) {
    const m = /\[llama-branch profile\] (\w+) n=(\d+) total ([\d.]+) ms: (.*)$/.exec(line);
    if (!m) continue;
    const key = `${m[1]} ${m[2]}`;
    const phases = { total: Number(m[3]) };
    for (const part of m[4].split(', ')) {
      const at = part.lastIndexOf(' ');
      phases[part.slice(0, at)] = Number(part.slice(at + 1));
    }
    if (!byKey.has(key)) byKey.set(key, []);
    byKey.get(key).push(phases);
  }
  const out = {};
  for (const [key, list] of byKey) {
    const rest = list.slice(1); // the first of each n may compile
    const names = new Set(rest.flatMap((p) => Object.keys(p)));
    out[key] = Object.fromEntries([...names].map((k) => [k, round(median(rest.map((p) => p[k] || 0)), 3)]));
  }
  return out;
}

/** `llama-branch serve` of PACKAGE; resolves with its URL, the process and when it printed it. */
function startServer(extra, env) {
  const bin = path.join(PACKAGE, 'bin', 'llama-branch.js');
  const argv = [bin, 'serve', '--model', modelPath(), '--port', '0', '--gpu', GPU, '--parallel', '64'];
  argv.push('--n-seq-max', '256', '--ctx-size', '32768', '--no-ui', ...extra);
  const started = performance.now();
  const p = spawn(process.execPath, argv, { env: { ...process.env, ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
  return new Promise((resolve, reject) => {
    let err = '';
    const onData = (d) => {
      err += d;
      const m = /listening on (http:\/\/\S+)/.exec(err);
      if (m) {
        p.stderr.off('data', onData);
        p.stderr.on('data', () => {});
        resolve({ url: m[1], proc: p, listeningMs: performance.now() - started, started });
      }
    };
    p.stderr.on('data', onData);
    p.stdout.on('data', onData);
    p.on('exit', (code) => reject(new Error(`serve exited ${code}: ${err.slice(-3000)}`)));
  });
}

/** `clients` completions at once: completion tokens per second of the whole wave. */
async function wave(url, clients) {
  const t = performance.now();
  const results = await Promise.all(
    Array.from({ length: clients }, (_, i) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: `Story ${i}: ${TEXT}`, max_tokens: 64, temperature: 0 }),
      }).then((r) => r.json()),
    ),
  );
  const s = (performance.now() - t) / 1000;
  const tokens = results.reduce((sum, r) => sum + ((r.usage && r.usage.completion_tokens) || 0), 0);
  return { clients, tokens, seconds: round(s, 2), tokS: round(tokens / s, 0) };
}

async function serveRun(warm) {
  const env = cacheEnv(warm ? 'serve-on' : 'serve-off');
  const server = await startServer(warm ? [] : ['--no-warmup'], env);
  try {
    let readyMs = server.listeningMs;
    if (warm) {
      for (;;) {
        const r = await fetch(`${server.url}/health`);
        if (r.status === 200) break;
        await new Promise((res) => setTimeout(res, 100));
      }
      readyMs = performance.now() - server.started;
    }
    const waves = [];
    for (const round2 of ['first', 'again']) {
      for (const clients of CLIENTS) waves.push({ round: round2, ...(await wave(server.url, clients)) });
    }
    return { warmup: warm, listeningMs: round(server.listeningMs, 0), readyMs: round(readyMs, 0), waves };
  } finally {
    server.proc.kill('SIGTERM');
  }
}

function tables(r) {
  const lines = [];
  const stalls = [
    ['stalls-off', 'warm-up off'],
    ['stalls-on', 'warm-up on'],
    ['stalls-long-plain', '4,000-token prompt, warm-up without long-cache decodes'],
    ['stalls-long', '4,000-token prompt, default warm-up'],
  ].filter(([k]) => r[k] && r[k].steps);
  if (stalls.length) {
    lines.push('| N | ' + stalls.map(([, l]) => `first step ms (${l}) | warm ms | first/warm`).join(' | ') + ' |');
    lines.push('|--:|' + stalls.map(() => '--:|--:|--:').join('|') + '|');
    for (let i = 0; i < SIZES.length; i++) {
      const cells = stalls.map(([k]) => {
        const s = r[k].steps[i];
        return `${s.firstMs} | ${s.warmMs} | ${s.ratio}`;
      });
      lines.push(`| ${SIZES[i]} | ${cells.join(' | ')} |`);
    }
    lines.push('');
    lines.push('| prefill tokens | ' + stalls.map(([, l]) => `first ms (${l}) | again ms`).join(' | ') + ' |');
    lines.push('|--:|' + stalls.map(() => '--:|--:').join('|') + '|');
    for (let i = 0; i < PREFILLS.length; i++) {
      const cells = stalls.map(([k]) => `${r[k].prefills[i].firstMs} | ${r[k].prefills[i].againMs}`);
      lines.push(`| ${PREFILLS[i]} | ${cells.join(' | ')} |`);
    }
    lines.push('');
    for (const k of ['stalls-off', 'stalls-on', 'stalls-again', 'stalls-long-plain', 'stalls-long']) {
      if (r[k] && r[k].warmup)
        lines.push(
          `- ${k}: createContext ${r[k].loadMs} ms, warm-up ${r[k].warmup.state} ${r[k].warmup.ms} ms (${r[k].warmup.total} sizes), devices ${r[k].offload.devices.join(', ') || 'none'}`,
        );
    }
    lines.push('');
  }
  if (r.profile && r.profile.steps) {
    lines.push(
      '| N | step ms (JS) | produce (native) | commit (native) | validate | llama_decode (queue the graph) | device wait + logits to host | copy rows + surprisal | bookkeeping | JS + worker round trip |',
    );
    lines.push('|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|');
    for (const s of r.profile.steps) {
      const p = r.profile.native[`produce ${s.n}`] || {};
      const c = r.profile.native[`commit ${s.n}`] || {};
      const rest = s.warmMs - (p.total || 0) - (c.total || 0);
      lines.push(
        `| ${s.n} | ${s.warmMs} | ${p.total ?? '-'} | ${c.total ?? '-'} | ${c.validate ?? '-'} | ${c.llama_decode ?? '-'} | ${c['device wait + logits to host'] ?? '-'} | ${c['copy rows + surprisal'] ?? '-'} | ${c['accept + bookkeeping'] ?? '-'} | ${round(rest, 3)} |`,
      );
    }
    lines.push('');
  }
  for (const k of ['serve-off', 'serve-on']) {
    if (!r[k] || !r[k].waves) continue;
    lines.push(`- ${k}: listening after ${r[k].listeningMs} ms, ready (/health 200) after ${r[k].readyMs} ms`);
    for (const w of r[k].waves)
      lines.push(`  - ${w.round}: ${w.clients} clients at once: ${w.tokS} tok/s (${w.tokens} tokens, ${w.seconds} s)`);
  }
  return lines.join('\n');
}

async function main() {
  if (args.child === 'stalls') {
    const warmup = args.warmup === '1' ? WARMUP : false;
    console.log(JSON.stringify(await stallsChild(warmup)));
    return;
  }
  fs.mkdirSync(OUT, { recursive: true });
  const results = { date: new Date().toISOString(), host: `${os.cpus().length} CPUs`, gpu: GPU, sizes: SIZES };
  const save = () => {
    fs.writeFileSync(path.join(OUT, 'gpu-steps.json'), JSON.stringify(results, null, 2));
    fs.writeFileSync(path.join(OUT, 'gpu-steps.md'), tables(results) + '\n');
  };
  const stallFlags = (w) => [
    '--child=stalls',
    `--warmup=${w}`,
    ...process.argv.slice(2).filter((a) => !a.startsWith('--phases')),
  ];
  for (const phase of PHASES) {
    const t = performance.now();
    log(`${phase} ...`);
    try {
      if (phase === 'stalls-off') results[phase] = (await child(stallFlags(0), cacheEnv('off'))).json;
      else if (phase === 'stalls-on') results[phase] = (await child(stallFlags(1), cacheEnv('on'))).json;
      else if (phase === 'stalls-again') results[phase] = (await child(stallFlags(1), cacheEnv('on'))).json;
      else if (phase === 'stalls-long-plain')
        results[phase] = (
          await child([...stallFlags(1), '--root=4000', '--lengths=none'], cacheEnv('long-plain'))
        ).json;
      else if (phase === 'stalls-long')
        results[phase] = (await child([...stallFlags(1), '--root=4000'], cacheEnv('long'))).json;
      else if (phase === 'profile') {
        const { json, stderr } = await child(stallFlags(1), { ...cacheEnv('on'), LLAMA_BRANCH_PROFILE: '1' });
        results.profile = { steps: json.steps, native: parseProfile(stderr) };
      } else if (phase === 'perf') {
        const flags = [...stallFlags(1), '--sizes=1,64', '--steps=8'];
        const { stderr } = await child(flags, { ...cacheEnv('on'), GGML_VK_PERF_LOGGER: '1' });
        fs.writeFileSync(path.join(OUT, 'perf-logger.txt'), stderr);
      } else if (phase === 'serve-off') results[phase] = await serveRun(false);
      else if (phase === 'serve-on') results[phase] = await serveRun(true);
      else throw new Error(`unknown phase ${phase}`);
    } catch (e) {
      results[phase] = { error: e.message.slice(0, 2000) };
      log(`${phase} FAILED: ${e.message.slice(0, 2000)}`);
    }
    log(`${phase} done in ${((performance.now() - t) / 1000).toFixed(1)} s`);
    save();
  }
  console.log(tables(results));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
