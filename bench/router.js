'use strict';

/**
 * Replicas behind a router, one routing mode after another (docs/deployment.md): the agent
 * workload of bench/agent-cache.js (`--sessions` conversations × `--turns` turns after a shared
 * ~1,700-token system prompt, all sessions taking each turn together, replies streamed) sent
 * to `--replicas` fresh `llama-branch serve` processes. The modes (`--routes`, in that order):
 *
 *   exact        SMG, gRPC workers (`serve --grpc-port`), cache_aware on the replicas' KV events
 *   approximate  SMG, HTTP workers, cache_aware on the tree of text SMG sent
 *   round_robin  SMG, HTTP workers, round_robin
 *   sglang-router  sglang-router 0.3.2, HTTP workers, cache_aware (last round's router)
 *
 * Reports the prompt tokens the replicas prefilled (their /health `prefilledTokens`, summed),
 * generated tokens per second of wall time, and p50/p95 time to the first streamed token as the
 * client saw it. SMG's cache_aware spills a matched request to the least-loaded replica only when
 * the matched one is `--balance-abs` requests over the mean AND `--balance-rel` times it; its
 * default (64) never spills at this size, so the bench sets 1 (and 1.5) for every SMG mode.
 * The issue's target: exact ≤ 0.8× approximate's prefilled tokens at equal or better throughput.
 *
 * `--context N` adds about N tokens of a tool's output to each user message (a session's own
 * history then grows by that each turn). `--restart-router-after T` stops the router after turn
 * T and starts a fresh one on the same replicas (its start not counted in the wall time): over
 * gRPC SMG learns the replicas' caches from their KV event snapshots; over HTTP its tree starts
 * empty. `--token-usage-threshold` (SMG's --balance-token-usage-threshold; 1: off) also leaves
 * cache affinity when the replicas' KV usage (gRPC GetLoads) spreads by more than that.
 * `--cache-ram SIZE` gives each replica a RAM tier below its KV cells (`serve --cache-ram`).
 * `--routers N` starts N routers on the same replicas and sends a session's turn t through
 * router (session + t) mod N (two gateways behind a front that spreads requests): over gRPC
 * each router reads every replica's KV events; over HTTP each tree sees only what it sent.
 * `--smg-warmup` leaves SMG's warm-up diversions at its defaults (off otherwise, as in the
 * tests): over gRPC, one cache hit in 8 (and some misses) then goes to a replica whose event
 * index is thin, which spreads sessions but moves each one it diverts.
 *
 *   node bench/router.js [--replicas 3] [--sessions 8] [--turns 4] [--reply 8] [--threads 1]
 *     [--parallel 2] [--ctx-size 8192] [--routes exact,approximate,round_robin]
 *     [--balance-abs 1] [--balance-rel 1.5] [--restart-router-after TURN] [--context 0]
 *     [--token-usage-threshold 1] [--cache-ram SIZE] [--smg-warmup] [--routers 1]
 *
 * Each replica gets `--threads` threads: say how many cores the machine had. Needs `smg` and
 * `sglang-router` (`npm run setup` installs both). Prints a Markdown table and writes
 * bench/results/router.json.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { parseArgs } = require('node:util');
const OpenAI = require('openai');
const { systemPrompt, userMessage } = require('./agent-sessions');
const { freePort, percentile, markdownTable } = require('./common');
const { smgCommand, startSmg, smgBranches } = require('./smg');
const { pythonTool } = require('../scripts/python');

const MODEL = process.env.LLAMA_TEST_MODEL || path.join(__dirname, '..', 'models', 'gemma-3-270m-q4_k_m.gguf');
const BIN = path.join(__dirname, '..', 'bin', 'llama-branch.js');

const { values: args } = parseArgs({
  options: {
    replicas: { type: 'string', default: '3' },
    sessions: { type: 'string', default: '8' },
    turns: { type: 'string', default: '4' },
    reply: { type: 'string', default: '8' },
    threads: { type: 'string', default: '1' },
    parallel: { type: 'string', default: '2' },
    'ctx-size': { type: 'string', default: '8192' },
    routes: { type: 'string', default: 'exact,approximate,round_robin' },
    'balance-abs': { type: 'string', default: '1' },
    'balance-rel': { type: 'string', default: '1.5' },
    'restart-router-after': { type: 'string', default: '0' },
    context: { type: 'string', default: '0' },
    'token-usage-threshold': { type: 'string', default: '1' },
    'cache-ram': { type: 'string' },
    'smg-warmup': { type: 'boolean', default: false },
    routers: { type: 'string', default: '1' },
  },
});

const ROUTES = {
  exact: { router: 'smg', transport: 'grpc', policy: 'cache_aware' },
  approximate: { router: 'smg', transport: 'http', policy: 'cache_aware' },
  round_robin: { router: 'smg', transport: 'http', policy: 'round_robin' },
  'sglang-router': { router: 'sglang-router', transport: 'http', policy: 'cache_aware' },
};

/** Spawns `command argv`, resolving the child once `ready()` says so (polled every 200 ms). */
async function startProcess(command, argv, ready, what) {
  const child = spawn(command, argv, { stdio: ['ignore', 'ignore', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr = (stderr + d).slice(-4000)));
  for (const until = Date.now() + 180000; Date.now() < until;) {
    if (child.exitCode !== null) throw new Error(`${what} exited with ${child.exitCode}: ${stderr}`);
    if (await ready().catch(() => false)) return child;
    await new Promise((r) => setTimeout(r, 200));
  }
  child.kill('SIGKILL');
  throw new Error(`${what} not ready within 180 s: ${stderr}`);
}

/** A fresh replica; with `grpc` also its gRPC worker, whose URL is then the one the router gets. */
async function startReplica(grpc) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const argv = [BIN, 'serve', '--model', MODEL, '--port', String(port), '--no-ui'];
  argv.push('--threads', args.threads, '--parallel', args.parallel, '--ctx-size', args['ctx-size']);
  if (args['cache-ram']) argv.push('--cache-ram', args['cache-ram']);
  let worker = url;
  if (grpc) {
    const grpcPort = await freePort();
    argv.push('--grpc-port', String(grpcPort));
    worker = `grpc://127.0.0.1:${grpcPort}`;
  }
  const child = await startProcess(process.execPath, argv, async () => (await fetch(`${url}/health`)).ok, url);
  return { child, url, worker };
}

async function startSglangRouter(workers, policy) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const argv = ['launch', '--host', '127.0.0.1', '--port', String(port), '--policy', policy];
  argv.push('--prometheus-port', String(await freePort()), '--log-level', 'warn');
  argv.push('--worker-urls', ...workers);
  const registered = async () => {
    const body = await (await fetch(`${url}/workers`)).json();
    return body.workers.filter((w) => w.is_healthy).length === workers.length;
  };
  return { child: await startProcess(pythonTool('sglang-router'), argv, registered, 'sglang-router'), url };
}

function startRouter(route, workers, modelName) {
  if (route.router === 'sglang-router') return startSglangRouter(workers, route.policy);
  const extra = ['--balance-abs-threshold', args['balance-abs'], '--balance-rel-threshold', args['balance-rel']];
  extra.push('--balance-token-usage-threshold', args['token-usage-threshold']);
  const tokenizerModel = route.transport === 'grpc' ? modelName : null;
  return startSmg(smgCommand(), workers, { policy: route.policy, extra, tokenizerModel, warmup: args['smg-warmup'] });
}

const healthOf = async (replica) => (await fetch(`${replica.url}/health`)).json();

function stop(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null || child.signalCode !== null) return resolve();
    const kill = setTimeout(() => child.kill('SIGKILL'), 10000);
    child.once('exit', () => {
      clearTimeout(kill);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/**
 * The user's message of `session` at `turn`, with `--context` tokens (about) of a tool's output
 * only that session has seen: what makes a session's own history worth routing for.
 */
function userTurn(session, turn) {
  const message = userMessage(session, turn);
  const lines = [];
  for (let i = 0; lines.join('\n').length < Number(args.context) * 4; i++)
    lines.push(`${session}.${turn}.${i}: const value${session}x${i} = compute(${turn * 31 + i}, "s${session}");`);
  return lines.length ? `${message}\n\nTool output (read_file):\n${lines.join('\n')}` : message;
}

/** One streamed chat turn: its reply and the time to its first token, or its failure. */
async function chatTurn(client, model, messages) {
  const started = performance.now();
  let ttftMs = null;
  let content = '';
  try {
    const stream = await client.chat.completions.create({
      model,
      messages,
      max_tokens: Number(args.reply),
      temperature: 0,
      stream: true,
      stream_options: { include_usage: true },
    });
    let usage = null;
    for await (const chunk of stream) {
      if (chunk.usage) usage = chunk.usage;
      const piece = chunk.choices[0]?.delta?.content;
      if (!piece) continue;
      if (ttftMs === null) ttftMs = performance.now() - started;
      content += piece;
    }
    const cached = usage && usage.prompt_tokens_details ? usage.prompt_tokens_details.cached_tokens : null;
    return { content, ttftMs: ttftMs ?? performance.now() - started, usage: usage && [usage.prompt_tokens, cached] };
  } catch (e) {
    // Counted and reported: a failed request must show in the results, not end the run.
    return { failure: String(e.status || e.message) };
  }
}

/** Fresh replicas and `--routers` routers in front of them for `route`. */
async function startRoute(route) {
  const replicas = await Promise.all(
    Array.from({ length: Number(args.replicas) }, () => startReplica(route.transport === 'grpc')),
  );
  const model = (await (await fetch(`${replicas[0].url}/v1/models`)).json()).data[0].id;
  const workers = replicas.map((r) => r.worker);
  const newRouters = () =>
    Promise.all(Array.from({ length: Number(args.routers) }, () => startRouter(route, workers, model)));
  try {
    return { replicas, model, newRouters, routers: await newRouters() };
  } catch (e) {
    await Promise.all(replicas.map((r) => stop(r.child)));
    throw e;
  }
}

const clientOf = (r) => new OpenAI({ baseURL: `${r.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 600000 });

/**
 * Every session's turns, all sessions taking each turn together. With several routers (behind
 * a front that spreads requests, as two gateways for availability are), a session's turn t goes
 * through router (session + t) mod N: each router sees part of every session.
 */
async function runTurns(name, run) {
  const system = { role: 'system', content: systemPrompt() };
  const histories = Array.from({ length: Number(args.sessions) }, () => [system]);
  const out = { ttfts: [], failures: [], prefilledByTurn: [], restartMs: 0 };
  /** Per turn, per session: [prompt tokens, cached prompt tokens] as the router passed them on. */
  out.usageByTurn = Array.from({ length: Number(args.turns) }, () => []);
  const prefilledNow = async () =>
    (await Promise.all(run.replicas.map(healthOf))).reduce((n, h) => n + h.prefilledTokens, 0);
  for (let turn = 0; turn < Number(args.turns); turn++) {
    const clients = run.routers.map(clientOf);
    await Promise.all(
      histories.map(async (history, session) => {
        history.push({ role: 'user', content: userTurn(session, turn) });
        const reply = await chatTurn(clients[(session + turn) % clients.length], run.model, history);
        out.usageByTurn[turn][session] = reply.usage || null;
        if (reply.failure) out.failures.push(reply.failure);
        else out.ttfts.push(reply.ttftMs);
        history.push({ role: 'assistant', content: reply.failure ? '(no reply)' : reply.content });
      }),
    );
    const before = out.prefilledByTurn.reduce((n, t) => n + t, 0);
    out.prefilledByTurn.push((await prefilledNow()) - before);
    process.stderr.write(`${name}: turn ${turn + 1}/${args.turns}, ${out.prefilledByTurn.at(-1)} tokens prefilled\n`);
    if (turn + 1 !== Number(args['restart-router-after'])) continue;
    // A router started again (a deploy, a crash, a second gateway) knows only what it can learn.
    const pause = performance.now();
    await Promise.all(run.routers.map((r) => stop(r.child)));
    run.routers = await run.newRouters();
    out.restartMs += performance.now() - pause;
  }
  return out;
}

/** The workload through one routing mode; the replicas' counts after it. */
async function runRoute(name) {
  const route = ROUTES[name];
  if (!route) throw new Error(`unknown route ${name}: one of ${Object.keys(ROUTES).join(', ')}`);
  const run = await startRoute(route);
  try {
    const started = performance.now();
    const { restartMs, ...turns } = await runTurns(name, run);
    const ms = performance.now() - started - restartMs; // a restart's start is not counted
    const counts = await countsOf(run.replicas, run.routers, route);
    return { name, ...route, ms: Math.round(ms), ...turns, ...counts };
  } finally {
    await Promise.all(run.routers.map((r) => stop(r.child)));
    await Promise.all(run.replicas.map((r) => stop(r.child)));
  }
}

/** The replicas' summed counters, each one's completed requests, and SMG's cache_aware branches. */
async function countsOf(replicas, routers, route) {
  const perReplica = await Promise.all(replicas.map(healthOf));
  const sum = (field) => perReplica.reduce((n, s) => n + s[field], 0);
  const branches = {};
  if (route.router === 'smg' && route.policy === 'cache_aware')
    for (const counts of await Promise.all(routers.map(smgBranches)))
      for (const [branch, n] of Object.entries(counts)) branches[branch] = (branches[branch] || 0) + n;
  return {
    promptTokens: sum('promptTokens'),
    prefilledTokens: sum('prefilledTokens'),
    cachedPromptTokens: sum('cachedPromptTokens'),
    generatedTokens: sum('generatedTokens'),
    evictions: sum('evictions'),
    completedPerReplica: perReplica.map((s) => s.completed),
    branches,
  };
}

function report(result) {
  const { results } = result;
  console.log(
    `\n${args.replicas} replicas (${args.threads} thread(s) each, ${result.cores} cores), ${args.sessions} sessions × ${args.turns} turns, ${args.reply}-token replies, ${args.context} tokens of tool output a turn${Number(args.routers) > 1 ? `, ${args.routers} routers` : ''}${Number(args['restart-router-after']) > 0 ? `, the router started again after turn ${args['restart-router-after']}` : ''}\n`,
  );
  const rows = results.map((r) => [
    r.name,
    r.promptTokens,
    r.prefilledTokens,
    r.cachedPromptTokens,
    (r.generatedTokens / (r.ms / 1000)).toFixed(2),
    r.ttfts.length ? Math.round(percentile(r.ttfts, 50)) : '–',
    r.ttfts.length ? Math.round(percentile(r.ttfts, 95)) : '–',
    r.completedPerReplica.join(' / '),
    r.failures.length,
    `${(r.ms / 1000).toFixed(1)} s`,
  ]);
  const head = ['route', 'prompt tokens:', 'prefilled:', 'from cache:', 'generated tok/s:', 'TTFT p50 ms:'];
  console.log(markdownTable([...head, 'TTFT p95 ms:', 'requests per replica', 'failed:', 'wall:'], rows));
  const by = Object.fromEntries(results.map((r) => [r.name, r]));
  const ratio = (a, b, f) => (by[a] && by[b] && by[b][f] ? (by[a][f] / by[b][f]).toFixed(2) : null);
  const tps = (r) => r.generatedTokens / r.ms;
  if (ratio('exact', 'approximate', 'prefilledTokens') !== null)
    console.log(
      `\nexact / approximate: ${ratio('exact', 'approximate', 'prefilledTokens')}× the prefilled tokens (target ≤ 0.8), ${(tps(by.exact) / tps(by.approximate)).toFixed(2)}× the throughput (target ≥ 1)`,
    );
  if (ratio('exact', 'round_robin', 'prefilledTokens') !== null)
    console.log(`exact / round_robin: ${ratio('exact', 'round_robin', 'prefilledTokens')}× the prefilled tokens`);
  console.log(`\nprefix cache evictions: ${results.map((r) => `${r.name} ${r.evictions}`).join(', ')}`);
  console.log('prefilled tokens by turn:');
  for (const r of results) console.log(`- ${r.name}: ${r.prefilledByTurn.join(', ')}`);
  for (const r of results.filter((x) => Object.keys(x.branches).length))
    console.log(`${r.name}: SMG cache_aware branches ${JSON.stringify(r.branches)}`);
}

async function main() {
  const results = [];
  for (const name of args.routes.split(',')) results.push(await runRoute(name));
  const result = { date: new Date().toISOString(), cores: os.cpus().length, args, results };
  fs.mkdirSync(path.join(__dirname, 'results'), { recursive: true });
  fs.writeFileSync(path.join(__dirname, 'results', 'router.json'), `${JSON.stringify(result, null, 2)}\n`);
  report(result);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
