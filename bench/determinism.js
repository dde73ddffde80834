#!/usr/bin/env node
'use strict';

/**
 * What `deterministic: true` costs (issue 51, docs/determinism.md): the throughput of a default
 * context and of a deterministic one on the same model and thread count, and their ratio.
 *
 * - decode: N branches (N = 1, 4, 16, 32), each with a 32-token prompt of its own, then
 *   `--steps` steps in which every branch samples and all commit one token in ONE decode;
 *   tokens per second over the steps.
 * - prefill: one branch prefills a prompt of 128 and of 2,000 tokens (nBatch 512); tokens per
 *   second.
 *
 * Each setting runs in its own process; `--rounds` alternates their order so that a change in
 * the machine's load hits both alike; the median of the rounds is reported. The default run is
 * short (about a minute on an idle 2-core machine); numbers from a loaded machine are noise.
 *
 * Usage: node bench/determinism.js [--rounds=1] [--steps=8] [--threads=N] [--only=decode|prefill]
 */

const { execFileSync } = require('node:child_process');
const { args, modelPath, median } = require('./common');

const SETTINGS = { default: {}, deterministic: { deterministic: true } };
const ROUNDS = Number(args.rounds || 1);
const STEPS = Number(args.steps || 8);
const THREADS = args.threads ? Number(args.threads) : undefined;
const WIDTHS = [1, 4, 16, 32];
const PROMPTS = [128, 2000];
const TEXT =
  'The history of the city began with a small settlement by the river, where traders met every spring to exchange grain, cloth and stories. ';

const now = () => Number(process.hrtime.bigint()) / 1e6;

/** One setting, in this process: `{ 'decode N=…': tok/s, 'prefill …': tok/s }` as JSON on stdout. */
async function one(name) {
  const { createContext, Branch, BranchStore } = require('..');
  const ctx = await createContext({
    modelPath: modelPath(),
    nCtx: 4096,
    nBatch: 512,
    nSeqMax: 40,
    ...(THREADS ? { nThreads: THREADS } : {}),
    ...SETTINGS[name],
  });
  const store = new BranchStore(ctx);
  const words = await ctx.tokenize(TEXT.repeat(120));
  const out = {};
  if (args.only !== 'prefill') {
    for (const n of WIDTHS) {
      const branches = [];
      for (let i = 0; i < n; i++) {
        const b = Branch.create(ctx, 0, { temperature: 0 });
        branches.push(b);
      }
      await store.prefill(branches.map((b, i) => [b, words.slice(i * 7, i * 7 + 32)]));
      const step = async () => {
        const produced = store.produce(branches);
        await store.commit(produced.map((p, i) => [branches[i], p.token]));
      };
      await step(); // warm: the first decode of a width allocates
      const t0 = now();
      for (let s = 0; s < STEPS; s++) await step();
      out[`decode N=${n}`] = (n * STEPS) / ((now() - t0) / 1000);
      await Promise.all(branches.map((b) => b.prune()));
    }
  }
  if (args.only !== 'decode') {
    for (const len of PROMPTS) {
      const b = Branch.create(ctx, 0, { temperature: 0 });
      const t0 = now();
      await b.prefill(words.slice(0, len));
      out[`prefill ${len}`] = len / ((now() - t0) / 1000);
      await b.prune();
    }
  }
  ctx.dispose();
  process.stdout.write(JSON.stringify(out) + '\n');
}

async function main() {
  if (args.child) return one(args.child);
  const runs = { default: [], deterministic: [] };
  for (let r = 0; r < ROUNDS; r++) {
    const order = r % 2 ? ['deterministic', 'default'] : ['default', 'deterministic'];
    for (const name of order) {
      const argv = [__filename, `--child=${name}`, `--steps=${STEPS}`];
      if (THREADS) argv.push(`--threads=${THREADS}`);
      if (args.only) argv.push(`--only=${args.only}`);
      const line = execFileSync(process.execPath, argv, { encoding: 'utf8' }).trim().split('\n').pop();
      runs[name].push(JSON.parse(line));
    }
  }
  const rows = {};
  for (const key of Object.keys(runs.default[0])) {
    const base = median(runs.default.map((x) => x[key]));
    const det = median(runs.deterministic.map((x) => x[key]));
    rows[key] = {
      'default tok/s': Number(base.toFixed(1)),
      'deterministic tok/s': Number(det.toFixed(1)),
      'ratio (det / default)': Number((det / base).toFixed(3)),
    };
  }
  console.log(
    `deterministic: true against the default, ${ROUNDS} round(s), ${STEPS} decode steps, threads ${THREADS ?? 'all'}`,
  );
  console.table(rows);
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
