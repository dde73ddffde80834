#!/usr/bin/env node
'use strict';

/**
 * What publishing KV events costs a server (issue 50: within 2 %). Two servers in this process on
 * the same model and settings, one with `kvEvents` (and a real subscriber attached: NVIDIA
 * Dynamo's indexer through test/kv-consumer.py, applying every event), one without. Each round
 * sends the same fresh workload to both, in the order A B B A across rounds so that a drift of the
 * machine's load falls on both: `--requests` completions over HTTP, `--concurrency` at a time,
 * each a ~300-token prompt (a shared 100-token group prefix, then its own text) and `--tokens` new
 * tokens; a 2,048-cell context, so the cache stores and evicts throughout (events of both kinds).
 * Reported: requests/s and tokens/s (prompt + new) per server, the ratio with/without, and the
 * number of events published.
 *
 * Usage: node bench/kv-events.js [--rounds=4] [--requests=24] [--concurrency=4] [--tokens=16] [--threads=2]
 * Writes bench/results/kv-events-<timestamp>.json.
 */

const fs = require('node:fs');
const path = require('node:path');
const readline = require('node:readline');
const { spawn } = require('node:child_process');
const { createServer } = require('..');
const { args, modelPath, median } = require('./common');
const { testPython } = require('../scripts/python');

const ROUNDS = Number(args.rounds || 4);
const REQUESTS = Number(args.requests || 24);
const CONCURRENCY = Number(args.concurrency || 4);
const TOKENS = Number(args.tokens || 16);
const THREADS = Number(args.threads || 2);
const log = (...a) => console.error('[bench:kv-events]', ...a);

/** The prompts of round `round`: fresh text each round, group prefixes shared by 4 requests. */
function prompts(round) {
  return Array.from({ length: REQUESTS }, (_, i) => {
    const group = `Round ${round}, archive group ${i >> 2}. ${'Every record is kept with its date, its place and its keeper. '.repeat(8)}`;
    return `${group}Record ${i}: ${'a note on the weather, the harbour and the ships that came in. '.repeat(15)}`;
  });
}

/** Sends `list` to `server` over HTTP, CONCURRENCY at a time; resolves { seconds, tokens }. */
async function run(server, list) {
  const url = `http://127.0.0.1:${server.http.address().port}/v1/completions`;
  let next = 0;
  let tokens = 0;
  const started = performance.now();
  const worker = async () => {
    while (next < list.length) {
      const prompt = list[next++];
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt, max_tokens: TOKENS, temperature: 0 }),
      });
      if (res.status !== 200) throw new Error(`HTTP ${res.status}: ${await res.text()}`);
      tokens += (await res.json()).usage.total_tokens;
    }
  };
  await Promise.all(Array.from({ length: CONCURRENCY }, worker));
  return { seconds: (performance.now() - started) / 1000, tokens };
}

/** Dynamo's indexer subscribed to `address`; resolves once it is listening. */
async function startConsumer(address) {
  const child = spawn(
    testPython() || 'python3',
    [path.join(__dirname, '..', 'test', 'kv-consumer.py'), `1=${address}`],
    {
      stdio: ['pipe', 'pipe', 'inherit'],
    },
  );
  const lines = readline.createInterface({ input: child.stdout });
  const waiting = [];
  lines.on('line', (line) => waiting.shift()?.(JSON.parse(line)));
  const next = () => new Promise((resolve) => waiting.push(resolve));
  await next();
  return {
    child,
    ask(command) {
      const answer = next();
      child.stdin.write(`${JSON.stringify(command)}\n`);
      return answer;
    },
  };
}

async function main() {
  const modelFile = modelPath();
  const options = { modelPath: modelFile, nCtx: 2048, nThreads: THREADS, parallel: CONCURRENCY, ui: false };
  const withEvents = await createServer({ ...options, kvEvents: 'tcp://127.0.0.1:0' });
  const without = await createServer(options);
  await withEvents.listen(0, '127.0.0.1');
  await without.listen(0, '127.0.0.1');
  const consumer = await startConsumer(withEvents.kvEvents.address);

  const servers = { with: withEvents, without };
  const times = { with: [], without: [] };
  await run(withEvents, prompts(-1).slice(0, CONCURRENCY)); // warm-up, both
  await run(without, prompts(-1).slice(0, CONCURRENCY));
  for (let round = 0; round < ROUNDS; round++) {
    const order = round % 2 === 0 ? ['with', 'without'] : ['without', 'with'];
    for (const name of order) {
      const r = await run(servers[name], prompts(round));
      times[name].push(r);
      log(`round ${round + 1}/${ROUNDS} ${name} events: ${r.seconds.toFixed(2)} s, ${r.tokens} tokens`);
    }
  }
  const published = withEvents.kvEvents.publisher.sequence;
  const { seq, errors } = await consumer.ask({ cmd: 'state' });
  consumer.child.kill();
  await withEvents.close();
  await without.close();

  const rate = (name) => median(times[name].map((r) => r.tokens / r.seconds));
  const result = {
    rounds: ROUNDS,
    requests: REQUESTS,
    concurrency: CONCURRENCY,
    newTokens: TOKENS,
    threads: THREADS,
    tokensPerSecondWith: rate('with'),
    tokensPerSecondWithout: rate('without'),
    ratio: rate('with') / rate('without'),
    batchesPublished: Number(published),
    consumerSequence: seq['1'],
    consumerErrors: errors.length,
  };
  console.log(
    `tokens/s (prompt + new, median of ${ROUNDS} rounds): with KV events ${result.tokensPerSecondWith.toFixed(1)}, ` +
      `without ${result.tokensPerSecondWithout.toFixed(1)}; ratio ${result.ratio.toFixed(3)}; ` +
      `${result.batchesPublished} event batches published, the consumer applied up to ${result.consumerSequence} ` +
      `with ${result.consumerErrors} errors`,
  );
  const dir = path.join(__dirname, 'results');
  fs.mkdirSync(dir, { recursive: true });
  const file = path.join(dir, `kv-events-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
  fs.writeFileSync(file, `${JSON.stringify(result, null, 2)}\n`);
  log(`wrote ${path.relative(process.cwd(), file)}`);
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
