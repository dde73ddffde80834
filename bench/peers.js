#!/usr/bin/env node
'use strict';

/**
 * The peers' published packages against ours (issues 39 and 41), on the same model and threads,
 * interleaved in one run so that load on the machine hits every side alike:
 *   library   batched branches at N = 1, 4, 16, 32 (a 128-token prompt shared by N branches,
 *             greedy steps, every branch one row of the same decode), one stream (64 greedy
 *             tokens), and prefill of the 128-token prompt: ours, lloyal.node and node-llama-cpp,
 *             each in a child process of its own per round (their llama.cpp copies cannot share a
 *             process), the three in a rotating order per round
 *   server    `llama-branch serve` against llama.cpp's own server (the `xllamacpp` wheel) at 1 and
 *             8 concurrent streaming /v1/completions clients, 64 tokens each: tokens/s and TTFT
 *   decide    typed decisions over a ~1,500-token state: ours (`scheduler.decide`, bench/decide.js's
 *             cases) against node-llama-cpp's `LlamaDecisionContext.decide()`; and 8 questions as
 *             8 concurrent `logprobs` + `max_tokens: 1` requests to llama.cpp's server against the
 *             same 8 questions as one `POST /v1/systemone` to ours, fresh and repeated state
 * The peers are installed into a scratch folder (not project dependencies): node-llama-cpp
 * 3.22.1 with @node-llama-cpp/linux-x64, @lloyal-labs/lloyal.node-linux-x64 from npm (lloyal.node's
 * JavaScript layer is not on npm: its native binding is driven directly, the calls its `Branch` and
 * `BranchStore` make), and the pinned `xllamacpp` wheel from PyPI (scripts/python.js `xllamacpp`).
 *
 * Usage: npm run bench:peers [-- --quick] [--parts=library,server,decide] [--rounds=5]
 *        [--reps=3] [--scratch=<dir>] [--threads=2] [--no-write]
 * Writes bench/results/peers-<timestamp>.json and the "Peers" section of bench/RESULTS.md (not with
 * --quick, --parts, --rounds, --reps or --steps, whose numbers are partial; `--from=a.json,b.json`
 * writes the section from runs made part by part).
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn, spawnSync } = require('node:child_process');
const { pathToFileURL } = require('node:url');
const {
  args,
  modelPath,
  median,
  percentile,
  freePort,
  startProcess,
  stopProcess,
  startLlamaCppServer,
} = require('./common');
const { markdownTable, replaceSection } = require('./common');
const { xllamacpp } = require('../scripts/python');

const QUICK = Boolean(args.quick);
const PARTS = new Set(String(args.parts || 'library,server,decide').split(','));
const ROUNDS = Number(args.rounds || (QUICK ? 1 : 5));
const REPS = Number(args.reps || (QUICK ? 1 : 3));
const THREADS = Number(args.threads || 2);
const NS = [1, 4, 16, 32];
const STEPS = Number(args.steps || (QUICK ? 8 : 32));
const STREAM_TOKENS = QUICK ? 16 : 64;
const CLIENTS = [1, 8];
const SERVER_TOKENS = 64;
const SCRATCH = path.resolve(String(args.scratch || path.join(os.tmpdir(), 'llama-branch-peers')));
const PEERS = {
  nllc: { npm: ['node-llama-cpp@3.22.1', '@node-llama-cpp/linux-x64@3.22.1'], label: 'node-llama-cpp 3.22.1' },
  lloyal: { npm: ['@lloyal-labs/lloyal.node-linux-x64'], label: 'lloyal.node (linux-x64 binding)' },
  xllamacpp: { label: "llama.cpp's server (xllamacpp)" },
};
const LLOYAL_BINARY = path.join(SCRATCH, 'node_modules/@lloyal-labs/lloyal.node-linux-x64/bin/lloyal.node');

const now = () => performance.now();
const log = (...a) => console.error('[bench:peers]', ...a);

// ---------------------------------------------------------------------------------------------
// Installing the peers

function run(cmd, argv, options) {
  log(`$ ${cmd} ${argv.join(' ')}`);
  const res = spawnSync(cmd, argv, { stdio: ['ignore', 'inherit', 'inherit'], ...options });
  if (res.status !== 0) throw new Error(`${cmd} ${argv.join(' ')} failed (exit ${res.status})`);
}

/** Installs the peers into SCRATCH unless they are there; returns their versions. */
function installPeers() {
  fs.mkdirSync(SCRATCH, { recursive: true });
  const pkg = path.join(SCRATCH, 'package.json');
  if (!fs.existsSync(pkg)) fs.writeFileSync(pkg, '{ "name": "llama-branch-peers", "private": true }\n');
  const version = (name) => {
    const file = path.join(SCRATCH, 'node_modules', name, 'package.json');
    return fs.existsSync(file) ? JSON.parse(fs.readFileSync(file, 'utf8')).version : null;
  };
  if (
    version('node-llama-cpp') !== '3.22.1' ||
    !version('@node-llama-cpp/linux-x64') ||
    !fs.existsSync(LLOYAL_BINARY)
  ) {
    // --ignore-scripts: node-llama-cpp's postinstall would look for a GPU build; the prebuilt
    // CPU binaries come in @node-llama-cpp/linux-x64. --omit=optional leaves out the CUDA and
    // Vulkan packages it lists.
    run(
      'npm',
      [
        'install',
        '--no-save',
        '--no-package-lock',
        '--no-audit',
        '--no-fund',
        '--ignore-scripts',
        '--omit=optional',
        ...PEERS.nllc.npm,
        ...PEERS.lloyal.npm,
      ],
      { cwd: SCRATCH },
    );
  }
  return {
    'node-llama-cpp': version('node-llama-cpp'),
    '@node-llama-cpp/linux-x64': version('@node-llama-cpp/linux-x64'),
    '@lloyal-labs/lloyal.node-linux-x64': version('@lloyal-labs/lloyal.node-linux-x64'),
    xllamacpp: xllamacpp().version,
  };
}

// ---------------------------------------------------------------------------------------------
// The library workloads. Each implementation lives in a child process of its own (their llama.cpp
// copies cannot share one) that loads once and then runs what the parent asks over IPC
// (`{ op: 'batched', n }`, `{ op: 'stream' }`, `{ op: 'prefill' }` → `{ ms }`), so that the three
// take turns workload by workload. All get the same token ids (the parent's tokenization).

/** Ours: bench/run.js's loop (store.produce + one store.commit per step). */
async function oursWorker(job) {
  const { createContext, Branch, BranchStore } = require('..');
  const bench = require('./run');
  const ctx = await createContext({ modelPath: job.model, nCtx: 4096, nSeqMax: 33, nThreads: THREADS });
  const store = new BranchStore(ctx);
  const { prompt } = job;
  return {
    batched: (n) => bench.ours(ctx, store, prompt, n),
    async stream() {
      const one = Branch.create(ctx, 0, { temperature: 0 });
      await one.prefill(prompt);
      const t = now();
      for (let i = 0; i < STREAM_TOKENS; i++) await one.commit(one.produce().token);
      const ms = now() - t;
      await one.prune();
      return ms;
    },
    async prefill() {
      const b = Branch.create(ctx, 0, { temperature: 0 });
      const t = now();
      await b.prefill(prompt);
      const ms = now() - t;
      await b.prune();
      return ms;
    },
  };
}

/**
 * lloyal.node: its published npm package is the native binding alone, so this drives the calls
 * its `Branch` / `BranchStore` make: `_branchPrefill`, `_branchFork`, `_branchSample` and one
 * `_storeCommit` of every branch per step (accept, then one decode of all rows).
 */
async function lloyalWorker(job) {
  const binding = require(LLOYAL_BINARY);
  const ctx = await binding.createContext({ modelPath: job.model, nCtx: 4096, nSeqMax: 33, nThreads: THREADS });
  const { prompt, first } = job;
  return {
    async batched(n) {
      const root = ctx._branchCreate(0, { temperature: 0 });
      await ctx._branchPrefill(root, prompt);
      const branches = [root];
      for (let i = 1; i < n; i++) branches.push(ctx._branchFork(root));
      await ctx._storeCommit(branches, first.slice(0, n));
      const t = now();
      for (let s = 0; s < STEPS; s++) {
        const tokens = branches.map((b) => ctx._branchSample(b));
        await ctx._storeCommit(branches, tokens);
      }
      const ms = now() - t;
      ctx._branchPruneSubtree(root);
      return ms;
    },
    async stream() {
      const one = ctx._branchCreate(0, { temperature: 0 });
      await ctx._branchPrefill(one, prompt);
      const t = now();
      for (let i = 0; i < STREAM_TOKENS; i++) await ctx._storeCommit([one], [ctx._branchSample(one)]);
      const ms = now() - t;
      ctx._branchPrune(one);
      return ms;
    },
    async prefill() {
      const b = ctx._branchCreate(0, { temperature: 0 });
      const t = now();
      await ctx._branchPrefill(b, prompt);
      const ms = now() - t;
      ctx._branchPrune(b);
      return ms;
    },
  };
}

async function loadNodeLlamaCpp(model) {
  const entry = path.join(SCRATCH, 'node_modules/node-llama-cpp/dist/index.js');
  const { getLlama, LlamaLogLevel } = await import(pathToFileURL(entry).href);
  const llama = await getLlama({ gpu: false, build: 'never', logLevel: LlamaLogLevel.error });
  return llama.loadModel({ modelPath: model });
}

/**
 * node-llama-cpp: N sequences of one context, the prompt evaluated in the first and copied to the
 * others (the KV copy its own decide() uses), then N concurrent `sequence.evaluate` generators,
 * which it batches into one decode per step. Each gets its distinct first token, as ours do.
 */
async function nodeLlamaCppWorker(job) {
  const model = await loadNodeLlamaCpp(job.model);
  const context = await model.createContext({ contextSize: 256, sequences: 32, threads: THREADS, batchSize: 512 });
  const { prompt, first } = job;
  // all 32 sequences taken once and cleared between runs (a disposed one is not free at once)
  const all = Array.from({ length: 32 }, () => context.getSequence());
  const generate = async (seq, token, count) => {
    let k = 0;
    for await (const _ of seq.evaluate([token], { temperature: 0 })) if (++k >= count) break;
    return k;
  };
  return {
    async batched(n) {
      const seqs = all.slice(0, n);
      for (const s of seqs) await s.clearHistory();
      await seqs[0].evaluateWithoutGeneratingNewTokens(prompt);
      for (const s of seqs.slice(1))
        if (!(await s._copyStateFromOtherSequence(seqs[0], prompt.length)))
          throw new Error('node-llama-cpp: copying the prompt to a sequence failed');
      const t = now();
      const counts = await Promise.all(seqs.map((s, i) => generate(s, first[i], STEPS)));
      const ms = now() - t;
      if (counts.some((c) => c !== STEPS)) throw new Error(`node-llama-cpp generated ${counts} tokens, not ${STEPS}`);
      return ms;
    },
    async stream() {
      const [one] = all;
      await one.clearHistory();
      await one.evaluateWithoutGeneratingNewTokens(prompt);
      const t = now();
      await generate(one, first[0], STREAM_TOKENS);
      return now() - t;
    },
    async prefill() {
      const [one] = all;
      await one.clearHistory();
      const t = now();
      await one.evaluateWithoutGeneratingNewTokens(prompt);
      return now() - t;
    },
  };
}

/** node-llama-cpp's LlamaDecisionContext.decide() on bench/decide.js's states and questions. */
async function nodeLlamaCppDecide(job) {
  const { state, QUESTIONS, ONE } = require('./decide');
  const model = await loadNodeLlamaCpp(job.model);
  const dctx = await model.createDecisionContext({ threads: THREADS });
  // The protocol says `instructions`; node-llama-cpp's questions say `instruction`.
  const theirs = (qs) =>
    Object.fromEntries(
      Object.entries(qs).map(([k, q]) => [
        k,
        q.criteria
          ? { type: q.type, instruction: q.instructions, criteria: q.criteria }
          : { type: q.type, instruction: q.instructions },
      ]),
    );
  const timedDecide = async (requests) => {
    const t = now();
    const res = await Promise.all(requests.map(([s, qs]) => dctx.decideWithMeta(s, theirs(qs))));
    return { seconds: (now() - t) / 1000, input: res.reduce((sum, r) => sum + r.tokenUsage.input, 0) };
  };
  await timedDecide([['Warm-up note: all pumps fine.', ONE]]);
  const rows = [];
  rows.push({ name: 'one', ...(await timedDecide([[state(1), ONE]])) });
  rows.push({ name: 'eight', ...(await timedDecide([[state(2), QUESTIONS]])) });
  rows.push({ name: 'again', ...(await timedDecide([[state(2), QUESTIONS]])) });
  rows.push({ name: 'four', ...(await timedDecide([3, 4, 5, 6].map((s) => [state(s), QUESTIONS]))) });
  await dctx.dispose();
  await model.dispose();
  return { rows };
}

/** Ours: bench/decide.js's rows (one, eight, again, four), after the same warm-up. */
async function oursDecide(job) {
  const { createContext, Scheduler } = require('..');
  const { decisionRows, ONE } = require('./decide');
  const ctx = await createContext({ modelPath: job.model, nCtx: 16384, nSeqMax: 48, nThreads: THREADS });
  const warm = new Scheduler(ctx);
  await warm.decide({ state: 'Warm-up note: all pumps fine.', questions: ONE });
  await warm.close();
  const rows = (await decisionRows(ctx)).map((r) => ({ ...r, name: r.name.split(':')[0] }));
  ctx.dispose();
  return { rows };
}

const WORKERS = { ours: oursWorker, lloyal: lloyalWorker, nllc: nodeLlamaCppWorker };
const ONE_SHOT = { 'ours-decide': oursDecide, 'nllc-decide': nodeLlamaCppDecide };

/** `--child=name` in a fresh process; `--job=file` holds its input. */
function spawnChild(name, job, ipc) {
  const file = path.join(os.tmpdir(), `peers-job-${process.pid}-${name}.json`);
  fs.writeFileSync(file, JSON.stringify(job));
  const passed = process.argv.slice(2).filter((a) => /^--(quick|steps|threads|scratch)/.test(a));
  // the peers print their load logs on stdout: keep them out of the tables
  const child = spawn(process.execPath, [__filename, `--child=${name}`, `--job=${file}`, ...passed], {
    stdio: ['ignore', 'ignore', 'pipe', ...(ipc ? ['ipc'] : [])],
  });
  child.err = '';
  child.stderr.on('data', (d) => (child.err = (child.err + d).slice(-4000)));
  child.file = file;
  return child;
}

/** Runs a one-shot child (a decision series) on `job`; resolves what it wrote. */
function runChild(name, job) {
  const child = spawnChild(name, job, false);
  return new Promise((resolve, reject) => {
    child.on('exit', (code) => {
      if (code !== 0) return reject(new Error(`child ${name} exited with ${code}: ${child.err}`));
      resolve(JSON.parse(fs.readFileSync(`${child.file}.out.json`, 'utf8')));
    });
  });
}

/** A library worker child: resolves `{ ask(op, n) → ms, close() }` once it has loaded and warmed up. */
function startWorker(name, job) {
  const child = spawnChild(name, job, true);
  let pending = null;
  const reply = (resolve, reject) => (pending = { resolve, reject });
  // the child's first message says it has loaded and warmed up
  const ready = new Promise(reply);
  child.on('message', (m) => {
    const p = pending;
    pending = null;
    if (m.error) p.reject(new Error(`${name}: ${m.error}`));
    else p.resolve(m.ms);
  });
  child.on('exit', (code) => pending && pending.reject(new Error(`worker ${name} exited with ${code}: ${child.err}`)));
  const ask = (op, n) => {
    const answer = new Promise(reply);
    child.send({ op, n });
    return answer;
  };
  return ready.then(() => ({ ask, close: () => stopProcess(child) }));
}

async function childMain() {
  const file = String(args.job);
  const job = JSON.parse(fs.readFileSync(file, 'utf8'));
  if (ONE_SHOT[args.child]) {
    fs.writeFileSync(`${file}.out.json`, JSON.stringify(await ONE_SHOT[args.child](job)));
    return;
  }
  const worker = await WORKERS[args.child](job);
  await worker.batched(4); // warm-up: first decodes allocate and fault in buffers
  process.on('message', async ({ op, n }) => {
    try {
      process.send({ ms: await worker[op](n) });
    } catch (e) {
      process.send({ error: String(e && e.stack) });
    }
  });
  process.send({ ms: 0 });
}

// ---------------------------------------------------------------------------------------------
// The library comparison

/** The 128-token prompt (bench/run.js's) and the N most likely first tokens after it, by ours. */
async function libraryJob(model) {
  const { createContext, Branch } = require('..');
  const { WORDS, PROMPT_TOKENS } = require('./run');
  const ctx = await createContext({ modelPath: model, nCtx: 1024, nSeqMax: 2, nThreads: THREADS });
  const prompt = (await ctx.tokenize(WORDS.repeat(6))).slice(0, PROMPT_TOKENS);
  const b = Branch.create(ctx, 0, { temperature: 0 });
  await b.prefill(prompt);
  const logits = b.getLogits();
  const first = Array.from(logits.keys())
    .sort((x, y) => logits[y] - logits[x])
    .slice(0, Math.max(...NS));
  await b.prune();
  ctx.dispose();
  return { model, prompt, first };
}

/**
 * The three libraries loaded side by side, taking turns workload by workload (the order rotates),
 * so that a change of load on the machine hits all three alike.
 */
async function library(model) {
  const job = await libraryJob(model);
  const names = ['ours', 'lloyal', 'nllc'];
  const workers = {};
  for (const n of names) workers[n] = await startWorker(n, job);
  const workloads = [
    ...NS.map((n) => ({ name: `batched N=${n}`, op: 'batched', n, tokens: n * STEPS })),
    { name: `one stream (${STREAM_TOKENS} tokens)`, op: 'stream', tokens: STREAM_TOKENS },
    { name: `prefill ${job.prompt.length} tokens`, op: 'prefill', tokens: job.prompt.length },
  ];
  const ms = Object.fromEntries(workloads.map((w) => [w.name, { ours: [], lloyal: [], nllc: [] }]));
  try {
    for (let r = 0; r < ROUNDS; r++) {
      for (const [i, w] of workloads.entries()) {
        for (let k = 0; k < names.length; k++) {
          const name = names[(r + i + k) % names.length];
          ms[w.name][name].push(await workers[name].ask(w.op, w.n));
        }
      }
      const rate = (n) => ((32 * STEPS) / ms['batched N=32'][n][r]) * 1000;
      log(`round ${r + 1}/${ROUNDS}: N=32 tok/s ${names.map((n) => `${n} ${rate(n).toFixed(1)}`).join(', ')}`);
    }
  } finally {
    for (const n of names) await workers[n].close();
  }
  // tokens/s: the median over rounds; ratios: per round (the three ran back to back), then the median
  const rows = workloads.map((w) => {
    const tps = Object.fromEntries(names.map((n) => [n, ms[w.name][n].map((v) => (w.tokens / v) * 1000)]));
    const row = { workload: w.name, tps: {}, oursOver: {}, perRound: tps };
    for (const n of names) row.tps[n] = median(tps[n]);
    for (const n of names.slice(1)) row.oursOver[n] = median(tps.ours.map((v, i) => v / tps[n][i]));
    return row;
  });
  return { promptTokens: job.prompt.length, steps: STEPS, rounds: ROUNDS, rows };
}

// ---------------------------------------------------------------------------------------------
// The servers

/** Both servers, same model, threads, context (16,384 cells) and 8 parallel slots. */
async function startServers(model) {
  const config = { nCtx: 16384, parallel: 8 };
  const oursPort = await freePort();
  const ours = await startProcess(
    process.execPath,
    [
      ...[path.join(__dirname, '..', 'bin', 'llama-branch.js'), 'serve', '--model', model, '--port', String(oursPort)],
      ...['--threads', String(THREADS), '--ctx-size', String(config.nCtx), '--parallel', String(config.parallel)],
      '--no-ui',
    ],
    oursPort,
  );
  const xl = await startLlamaCppServer({ model, threads: THREADS, port: await freePort(), ...config });
  return { ours, xllamacpp: xl, config };
}

async function post(url, body) {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify(body),
  });
  if (!res.ok) throw new Error(`${url}: HTTP ${res.status} ${await res.text()}`);
  return res;
}

/** One streaming /v1/completions request: ms to its first text, its completion tokens. */
async function streamed(url, prompt, t0) {
  const res = await post(`${url}/v1/completions`, {
    prompt,
    max_tokens: SERVER_TOKENS,
    temperature: 0,
    stream: true,
    stream_options: { include_usage: true },
  });
  let ttft = null;
  let tokens = 0;
  let buffer = '';
  const decoder = new TextDecoder();
  for await (const chunk of res.body) {
    buffer += decoder.decode(chunk, { stream: true });
    let nl;
    while ((nl = buffer.indexOf('\n')) >= 0) {
      const line = buffer.slice(0, nl).trim();
      buffer = buffer.slice(nl + 1);
      if (!line.startsWith('data:') || line === 'data: [DONE]') continue;
      const event = JSON.parse(line.slice(5));
      if (ttft === null && event.choices && event.choices.some((c) => c.text)) ttft = now() - t0;
      if (event.usage) tokens = event.usage.completion_tokens;
    }
  }
  return { ttft, tokens };
}

/**
 * C clients at once, each the same ~256-token text (bench/serve.js's system prompt, as a raw
 * completion: the default model is a base model) with its own question; `tag` makes every run's
 * prompts new to both servers' caches while the C prompts of one run share their beginning.
 */
async function clients(url, c, tag) {
  const { workload } = require('./serve');
  const { system, questions } = workload(null, c);
  const t0 = now();
  const results = await Promise.all(
    questions.map((q) => streamed(url, `Session ${tag}.\n${system}\n\n${q}\nAnswer:`, t0)),
  );
  const ms = now() - t0;
  const tokens = results.reduce((s, r) => s + r.tokens, 0);
  return {
    tps: (tokens / ms) * 1000,
    tokens,
    ttftP50: percentile(
      results.map((r) => r.ttft),
      50,
    ),
  };
}

async function serverComparison(servers) {
  const names = ['ours', 'xllamacpp'];
  for (const n of names) await clients(servers[n].url, 2, `warm-up ${n}`);
  const runs = Object.fromEntries(CLIENTS.map((c) => [c, { ours: [], xllamacpp: [] }]));
  let tag = 0;
  for (let rep = 0; rep < REPS; rep++) {
    for (const c of CLIENTS) {
      tag++;
      for (let k = 0; k < 2; k++) {
        const n = names[(rep + k) % 2];
        runs[c][n].push(await clients(servers[n].url, c, tag));
      }
      log(
        `C=${c} rep ${rep + 1}: ours ${runs[c].ours[rep].tps.toFixed(1)} tok/s, xllamacpp ${runs[c].xllamacpp[rep].tps.toFixed(1)} tok/s`,
      );
    }
  }
  return CLIENTS.map((c) => {
    const r = runs[c];
    const pick = (n, key) => median(r[n].map((x) => x[key]));
    return {
      clients: c,
      oursTps: pick('ours', 'tps'),
      xllamacppTps: pick('xllamacpp', 'tps'),
      tpsRatio: median(r.ours.map((x, i) => x.tps / r.xllamacpp[i].tps)),
      oursTtftMs: pick('ours', 'ttftP50'),
      xllamacppTtftMs: pick('xllamacpp', 'ttftP50'),
      ttftRatio: median(r.ours.map((x, i) => r.xllamacpp[i].ttftP50 / x.ttftP50)),
      tokens: { ours: r.ours.map((x) => x.tokens), xllamacpp: r.xllamacpp.map((x) => x.tokens) },
    };
  });
}

// ---------------------------------------------------------------------------------------------
// Decisions through the servers

/** The question as a chat message for an ordinary completion: the state, the question, the options. */
function questionPrompt(state, q) {
  const options = q.type === 'noul' ? ['yes', 'no'] : Array.isArray(q.criteria) ? q.criteria : Object.keys(q.criteria);
  return `${state}\n\n${q.instructions}\nAnswer with one of: ${options.join(', ')}.`;
}

/** The 8 questions as 8 concurrent chat requests with logprobs and max_tokens 1 (llama.cpp's server). */
async function xllamacppDecide(url, state, questions) {
  const t = now();
  const res = await Promise.all(
    Object.values(questions).map(async (q) =>
      (
        await post(`${url}/v1/chat/completions`, {
          messages: [{ role: 'user', content: questionPrompt(state, q) }],
          max_tokens: 1,
          temperature: 0,
          logprobs: true,
          top_logprobs: 10,
        })
      ).json(),
    ),
  );
  const seconds = (now() - t) / 1000;
  const prompt = res.reduce((s, r) => s + r.usage.prompt_tokens, 0);
  const cached = res.reduce((s, r) => s + ((r.usage.prompt_tokens_details || {}).cached_tokens || 0), 0);
  return { seconds, promptTokens: prompt, prefilled: prompt - cached };
}

/** The same 8 questions as one POST /v1/systemone to ours. */
async function oursSystemOne(url, state, questions) {
  const t = now();
  const body = await (await post(`${url}/v1/systemone`, { state, questions })).json();
  return { seconds: (now() - t) / 1000, usage: body.usage };
}

async function decisions(model, servers) {
  const { state, QUESTIONS } = require('./decide');
  const out = { library: { ours: [], nllc: [] }, server: [] };
  const decideRounds = Number(args['decide-rounds'] || 1);
  for (let r = 0; r < decideRounds; r++) {
    const order = r % 2 ? ['nllc', 'ours'] : ['ours', 'nllc'];
    for (const n of order) out.library[n].push((await runChild(`${n}-decide`, { model })).rows);
    log(`decisions round ${r + 1}: ${JSON.stringify(out.library)}`);
    if (servers) {
      // a state neither server has seen (bench/decide.js's generator, seeds of its own)
      const fresh = state(100 + r);
      const row = {};
      for (const n of r % 2 ? ['xllamacpp', 'ours'] : ['ours', 'xllamacpp']) {
        const ask = n === 'ours' ? oursSystemOne : xllamacppDecide;
        row[n] = {
          fresh: await ask(servers[n].url, fresh, QUESTIONS),
          again: await ask(servers[n].url, fresh, QUESTIONS),
        };
      }
      out.server.push(row);
      log(`decisions through the servers, round ${r + 1}: ${JSON.stringify(row)}`);
    }
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// The report

const plural = (n, word) => `${n} ${word}${n === 1 ? '' : 's'}`;
const f = (v, d = 1) => (Number.isFinite(v) ? v.toFixed(d) : 'n/a');
const x = (v) => (Number.isFinite(v) ? `${v.toFixed(2)} ×` : 'n/a');

function report(result) {
  const out = [];
  out.push(
    `Measured ${result.date.slice(0, 16).replace('T', ' ')} UTC by \`${result.command || 'npm run bench:peers'}\` on ${result.machine}, ` +
      `${result.threads} thread${result.threads === 1 ? '' : 's'} each, model ${result.model}; ${result.load}. Versions: ${Object.entries(
        result.versions,
      )
        .map(([k, v]) => `${k} ${v}`)
        .join(', ')}; ours ${result.oursVersion}. JSON: \`bench/results/${result.file}\`.`,
  );
  if (result.library) {
    const L = result.library;
    out.push(
      '',
      `**Library** (${plural(L.rounds, 'round')}; the three loaded side by side in processes of their own, taking turns workload by workload in a rotating order; ` +
        `tokens/s are medians over rounds, ratios the median of per-round ratios; ${L.steps} greedy steps per branch ` +
        `after a ${L.promptTokens}-token prompt):`,
      '',
      markdownTable(
        [
          'workload',
          'ours tok/s:',
          'lloyal.node tok/s:',
          'node-llama-cpp tok/s:',
          'ours / lloyal.node:',
          'ours / node-llama-cpp:',
        ],
        L.rows.map((r) => [
          r.workload,
          f(r.tps.ours),
          f(r.tps.lloyal),
          f(r.tps.nllc),
          x(r.oursOver.lloyal),
          x(r.oursOver.nllc),
        ]),
      ),
    );
  }
  if (result.server) {
    out.push(
      '',
      `**Server** (\`llama-branch serve\` against llama.cpp's server from the xllamacpp wheel, both with 8 slots and 16,384 ` +
        `cells; C clients at once, each a ~260-token raw completion prompt sharing its first ~250 tokens with the others, ` +
        `64 greedy tokens, streamed; ${plural(result.reps, 'repetition')} alternating the servers, medians; TTFT is the median client's):`,
      '',
      markdownTable(
        [
          'clients',
          'ours tok/s:',
          'llama.cpp tok/s:',
          'ours / llama.cpp:',
          'ours TTFT ms:',
          'llama.cpp TTFT ms:',
          'TTFT llama.cpp / ours:',
        ],
        result.server.map((r) => [
          r.clients,
          f(r.oursTps),
          f(r.xllamacppTps),
          x(r.tpsRatio),
          f(r.oursTtftMs, 0),
          f(r.xllamacppTtftMs, 0),
          x(r.ttftRatio),
        ]),
      ),
    );
  }
  if (result.decide) {
    const D = result.decide;
    const cases = ['one', 'eight', 'again', 'four'];
    const med = (n, c, key) => median(D.library[n].map((rows) => rows.find((r) => r.name === c)[key]));
    out.push(
      '',
      `**Decisions** (issue 41; bench/decide.js's ~1,580-token maintenance logs and 8 mixed questions; ` +
        `${plural(D.library.ours.length, 'round')}, medians; node-llama-cpp's \`LlamaDecisionContext\` with its defaults, parallelQuestions 4):`,
      '',
      markdownTable(
        ['case', 'ours s:', 'node-llama-cpp s:', 'ours faster by:', 'tokens decoded, ours / node-llama-cpp:'],
        cases.map((c) => [
          c,
          f(med('ours', c, 'seconds'), 2),
          f(med('nllc', c, 'seconds'), 2),
          x(med('nllc', c, 'seconds') / med('ours', c, 'seconds')),
          `${med('ours', c, 'prefilled')} / ${med('nllc', c, 'input')}`,
        ]),
      ),
    );
    if (D.server.length) {
      const s = (n, c, key) => median(D.server.map((row) => row[n][c][key]));
      out.push(
        '',
        "The same 8 questions through the servers: llama.cpp's as 8 concurrent chat requests with `logprobs` and " +
          '`max_tokens: 1` (each slot prefills the state itself), ours as one `POST /v1/systemone`:',
        '',
        markdownTable(
          ['state', 'ours s:', 'llama.cpp s:', 'ours faster by:', 'llama.cpp prompt tokens (prefilled):'],
          ['fresh', 'again'].map((c) => [
            c,
            f(s('ours', c, 'seconds'), 2),
            f(s('xllamacpp', c, 'seconds'), 2),
            x(s('xllamacpp', c, 'seconds') / s('ours', c, 'seconds')),
            `${s('xllamacpp', c, 'promptTokens')} (${s('xllamacpp', c, 'prefilled')})`,
          ]),
        ),
      );
    }
  }
  return out.join('\n');
}

/** Writes `table` as the Peers section of bench/RESULTS.md. */
function writeResults(table) {
  const file = path.join(__dirname, 'RESULTS.md');
  fs.writeFileSync(file, replaceSection(fs.readFileSync(file, 'utf8'), 'peers', table, '## Peers'));
  log('updated the Peers section of bench/RESULTS.md');
}

/**
 * --from=a.json,b.json: the tables of earlier runs (each with its own date, threads and load), in
 * that order, printed and written to bench/RESULTS.md; for parts measured in separate runs.
 */
async function fromFiles() {
  const tables = String(args.from)
    .split(',')
    .map((f) => report(JSON.parse(fs.readFileSync(path.resolve(f), 'utf8'))));
  const table = tables.join('\n\n');
  console.log(table);
  if (!args['no-write']) writeResults(table);
}

async function main() {
  const started = now();
  const model = modelPath();
  const startLoad = os.loadavg()[0];
  const versions = installPeers();
  log(`peers in ${SCRATCH}: ${JSON.stringify(versions)}`);
  const { systemInfo } = require('..');
  const result = {
    date: new Date().toISOString(),
    machine: `${os.cpus().length} cores (${os.cpus()[0].model}), no GPU`,
    load: `load average ${startLoad.toFixed(1)} at the start`,
    system: systemInfo(),
    threads: THREADS,
    model: path.basename(model),
    versions,
    oursVersion: require('../package.json').version,
    command: ['npm run bench:peers', ...(process.argv.length > 2 ? ['--', ...process.argv.slice(2)] : [])].join(' '),
    quick: QUICK,
    reps: REPS,
  };
  if (PARTS.has('library')) result.library = await library(model);
  let servers = null;
  try {
    if (PARTS.has('server') || PARTS.has('decide')) servers = await startServers(model);
    if (PARTS.has('server')) result.server = await serverComparison(servers);
    if (PARTS.has('decide')) result.decide = await decisions(model, servers);
  } finally {
    if (servers) await Promise.all([stopProcess(servers.ours.child), stopProcess(servers.xllamacpp.child)]);
  }
  const endLoad = os.loadavg()[0];
  // Past one runnable task per core, other work shared the CPU with the bench.
  const shared = Math.max(endLoad, startLoad) > os.cpus().length;
  result.load += `, ${endLoad.toFixed(1)} at the end${shared ? ` (${os.cpus().length} cores shared with other work: ratios measured interleaved are the headline)` : ''}`;
  result.wallSeconds = (now() - started) / 1000;
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  result.file = `peers-${result.date.replace(/[:.]/g, '-')}.json`;
  fs.writeFileSync(path.join(dir, result.file), `${JSON.stringify(result, null, 2)}\n`);
  const table = report(result);
  console.log(table);
  const partial = QUICK || args.parts || args.rounds || args.reps || args.steps;
  if (!partial && !args['no-write']) writeResults(table);
  log(`wrote bench/results/${result.file} in ${result.wallSeconds.toFixed(0)} s`);
}

if (require.main === module && args.help) {
  // the usage is this file's opening comment
  console.log(
    fs
      .readFileSync(__filename, 'utf8')
      .split('*/')[0]
      .replace(/^[\s\S]*?\/\*\*\n/, '')
      .replace(/^ \* ?/gm, ''),
  );
} else if (require.main === module) {
  (args.child ? childMain() : args.from ? fromFiles() : main()).catch((e) => {
    console.error(e);
    process.exit(1);
  });
}

module.exports = { report, questionPrompt };
