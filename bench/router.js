'use strict';

/**
 * Replicas behind SGLang's model gateway (docs/deployment.md): the agent workload of
 * bench/agent-cache.js (`--sessions` conversations × `--turns` turns after a shared ~1,500-token
 * system prompt, sessions taking turns together) sent through `sglang-router` to `--replicas`
 * fresh `llama-branch serve` processes, once per policy (`--policies`, default cache_aware then
 * round_robin). Reports the prompt tokens the replicas prefilled (their /health `prefilledTokens`,
 * summed) and the wall time; the target is ≥ 2× fewer tokens prefilled with cache_aware.
 *
 *   node bench/router.js [--replicas 3] [--sessions 6] [--turns 3] [--reply 8] [--threads 1]
 *                        [--parallel 2] [--ctx-size 8192] [--policies cache_aware,round_robin]
 *
 * Each replica gets `--threads` threads: say how many cores the machine had. Needs
 * `sglang-router` on PATH (`npm run setup` installs it). Prints a Markdown table and writes
 * bench/results/router.json.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { parseArgs } = require('node:util');
const { systemPrompt, userMessage } = require('./agent-sessions');
const { freePort } = require('./common');

const MODEL = process.env.LLAMA_TEST_MODEL || path.join(__dirname, '..', 'models', 'gemma-3-270m-q4_k_m.gguf');
const BIN = path.join(__dirname, '..', 'bin', 'llama-branch.js');

const { values: args } = parseArgs({
  options: {
    replicas: { type: 'string', default: '3' },
    sessions: { type: 'string', default: '6' },
    turns: { type: 'string', default: '3' },
    reply: { type: 'string', default: '8' },
    threads: { type: 'string', default: '1' },
    parallel: { type: 'string', default: '2' },
    'ctx-size': { type: 'string', default: '8192' },
    policies: { type: 'string', default: 'cache_aware,round_robin' },
  },
});

/** Spawns `command args`, resolving the child once `ready()` says so (polled every 200 ms). */
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

async function startReplica() {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const argv = [BIN, 'serve', '--model', MODEL, '--port', String(port), '--no-ui'];
  argv.push('--threads', args.threads, '--parallel', args.parallel, '--ctx-size', args['ctx-size']);
  const child = await startProcess(process.execPath, argv, async () => (await fetch(`${url}/health`)).ok, url);
  return { child, url };
}

async function startRouter(workers, policy) {
  const port = await freePort();
  const url = `http://127.0.0.1:${port}`;
  const argv = ['launch', '--host', '127.0.0.1', '--port', String(port), '--policy', policy];
  argv.push('--prometheus-port', String(await freePort()), '--log-level', 'warn');
  argv.push('--worker-urls', ...workers.map((w) => w.url));
  const registered = async () => {
    const body = await (await fetch(`${url}/workers`)).json();
    return body.workers.filter((w) => w.is_healthy).length === workers.length;
  };
  return { child: await startProcess('sglang-router', argv, registered, `sglang-router (${policy})`), url };
}

function stop(child) {
  return new Promise((resolve) => {
    if (child.exitCode !== null) return resolve();
    const kill = setTimeout(() => child.kill('SIGKILL'), 10000);
    child.once('exit', () => {
      clearTimeout(kill);
      resolve();
    });
    child.kill('SIGTERM');
  });
}

/** The workload through the router; the replicas' counts after it. */
async function runPolicy(policy) {
  const replicas = await Promise.all(Array.from({ length: Number(args.replicas) }, () => startReplica()));
  const router = await startRouter(replicas, policy);
  try {
    const model = (await (await fetch(`${replicas[0].url}/v1/models`)).json()).data[0].id;
    const system = { role: 'system', content: systemPrompt() };
    const histories = Array.from({ length: Number(args.sessions) }, () => [system]);
    const failures = [];
    const started = performance.now();
    for (let turn = 0; turn < Number(args.turns); turn++) {
      await Promise.all(
        histories.map(async (history, session) => {
          history.push({ role: 'user', content: userMessage(session, turn) });
          const res = await fetch(`${router.url}/v1/chat/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ model, messages: history, max_tokens: Number(args.reply), temperature: 0 }),
          });
          const body = await res.json().catch(() => ({}));
          if (res.ok) history.push({ role: 'assistant', content: body.choices[0].message.content || '' });
          else {
            // Counted and reported: a failed request must show in the results, not end the run.
            failures.push(`${res.status}`);
            history.push({ role: 'assistant', content: '(no reply)' });
          }
        }),
      );
      process.stderr.write(`${policy}: turn ${turn + 1}/${args.turns}\n`);
    }
    const ms = performance.now() - started;
    const perReplica = [];
    for (const r of replicas) perReplica.push(await (await fetch(`${r.url}/health`)).json());
    const sum = (field) => perReplica.reduce((n, s) => n + s[field], 0);
    return {
      policy,
      ms: Math.round(ms),
      promptTokens: sum('promptTokens'),
      prefilledTokens: sum('prefilledTokens'),
      cachedPromptTokens: sum('cachedPromptTokens'),
      completedPerReplica: perReplica.map((s) => s.completed),
      failures,
    };
  } finally {
    await stop(router.child);
    await Promise.all(replicas.map((r) => stop(r.child)));
  }
}

async function main() {
  const results = [];
  for (const policy of args.policies.split(',')) results.push(await runPolicy(policy));
  const result = {
    date: new Date().toISOString(),
    cores: os.cpus().length,
    args,
    results,
  };
  fs.mkdirSync(path.join(__dirname, 'results'), { recursive: true });
  fs.writeFileSync(path.join(__dirname, 'results', 'router.json'), `${JSON.stringify(result, null, 2)}\n`);
  console.log(
    `\n${args.replicas} replicas (${args.threads} threads each, ${result.cores} cores), ${args.sessions} sessions × ${args.turns} turns\n`,
  );
  console.log('| policy | prompt tokens | prefilled | from cache | requests per replica | failed | wall |');
  console.log('|---|---|---|---|---|---|---|');
  for (const r of results)
    console.log(
      `| ${r.policy} | ${r.promptTokens} | ${r.prefilledTokens} | ${r.cachedPromptTokens} | ${r.completedPerReplica.join(' / ')} | ${r.failures.length} | ${(r.ms / 1000).toFixed(1)} s |`,
    );
  const [a, b] = results;
  if (a && b && a.prefilledTokens > 0)
    console.log(
      `\n${a.policy} prefilled ${(b.prefilledTokens / a.prefilledTokens).toFixed(2)}× fewer tokens than ${b.policy}`,
    );
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
