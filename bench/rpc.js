'use strict';

/**
 * `npm run bench -- --rpc [--steps=24] [--reps=3]`: ms per step of N-branch greedy generation
 * (store.produce + one store.commit per step) at N = 1 and N = 8, on a local context and on a
 * context spread over two loopback `llama-branch rpc-server` processes (one thread each),
 * measured interleaved. Batching pays the network round trips once per step, not once per
 * branch, so (N=8 ÷ N=1 tokens/s over RPC) ÷ (the same locally) should stay >= 0.9.
 * Writes bench/results/rpc-<timestamp>.json.
 */

const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');
const { createContext, Branch, BranchStore } = require('..');

const { args, median, modelPath, freePort } = require('./common');

const STEPS = Number(args.steps || 24);
const REPS = Number(args.reps || 3);
const NS = [1, 8];
const MODEL = modelPath();
const CLI = path.join(__dirname, '..', 'bin', 'llama-branch.js');
const now = () => Number(process.hrtime.bigint()) / 1e6;

async function startServer() {
  const port = await freePort();
  const proc = spawn(process.execPath, [CLI, 'rpc-server', '--port', String(port), '--threads', '1'], {
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  await new Promise((resolve, reject) => {
    let out = '';
    proc.stdout.on('data', (c) => {
      out += c;
      if (out.includes('listening on')) resolve();
    });
    proc.once('exit', (code) => reject(new Error(`rpc-server exited with ${code}`)));
  });
  proc.stdout.resume();
  return { proc, endpoint: `127.0.0.1:${port}` };
}

async function msPerStep(ctx, prompt, n) {
  const store = new BranchStore(ctx);
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(prompt);
  const branches = [root];
  for (let i = 1; i < n; i++) branches.push(root.fork());
  const logits = root.getLogits();
  const top = Array.from(logits.keys())
    .sort((a, b) => logits[b] - logits[a])
    .slice(0, n);
  await store.commit(branches.map((b, i) => [b, top[i]]));
  const t0 = now();
  for (let s = 0; s < STEPS; s++) {
    const produced = store.produce(branches);
    await store.commit(branches.map((b, i) => [b, produced[i].token]));
  }
  const ms = (now() - t0) / STEPS;
  await root.pruneSubtree();
  return ms;
}

async function main() {
  const servers = [await startServer(), await startServer()];
  try {
    const opts = { modelPath: MODEL, nCtx: 2048, nThreads: 2, nSeqMax: 8 };
    const local = await createContext(opts);
    const rpc = await createContext({ ...opts, rpcServers: servers.map((s) => s.endpoint) });
    const prompt = await local.tokenize('The history of the city began with a small settlement by the river.');
    const samples = { local: { 1: [], 8: [] }, rpc: { 1: [], 8: [] } };
    for (let r = 0; r < REPS; r++) {
      for (const n of NS) {
        samples.local[n].push(await msPerStep(local, prompt, n));
        samples.rpc[n].push(await msPerStep(rpc, prompt, n));
      }
    }
    const ms = Object.fromEntries(Object.entries(samples).map(([k, v]) => [k, { 1: median(v[1]), 8: median(v[8]) }]));
    const gain = (m) => 8 / m[8] / (1 / m[1]); // tok/s at N=8 over tok/s at N=1
    const ratio = gain(ms.rpc) / gain(ms.local);
    console.log('| backend | ms/step N=1 | ms/step N=8 | tok/s N=1 | tok/s N=8 | N=8/N=1 tok/s |');
    console.log('|---|---:|---:|---:|---:|---:|');
    for (const k of ['local', 'rpc']) {
      const m = ms[k];
      console.log(
        `| ${k === 'rpc' ? 'RPC (2 loopback servers, 1 thread each)' : 'local (2 threads)'} | ${m[1].toFixed(1)} | ${m[8].toFixed(1)} | ${(1000 / m[1]).toFixed(1)} | ${(8000 / m[8]).toFixed(1)} | ${gain(m).toFixed(2)} |`,
      );
    }
    console.log(`\nbatching gain over RPC ÷ batching gain locally = ${ratio.toFixed(2)} (target >= 0.9)`);
    const dir = path.join(__dirname, 'results');
    fs.mkdirSync(dir, { recursive: true });
    const file = path.join(dir, `rpc-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
    fs.writeFileSync(file, JSON.stringify({ steps: STEPS, reps: REPS, samples, ms, ratio }, null, 2));
    console.log(`wrote ${path.relative(process.cwd(), file)}`);
    local.dispose();
    rpc.dispose();
  } finally {
    for (const s of servers) s.proc.kill('SIGKILL');
  }
}

module.exports = { main };
if (require.main === module) {
  main().then(
    () => process.exit(0),
    (e) => {
      console.error(e);
      process.exit(1);
    },
  );
}
