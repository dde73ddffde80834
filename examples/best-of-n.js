#!/usr/bin/env node
'use strict';

// Best-of-N with perplexity selection: decode the prompt once, fork N sampled candidates (plus a
// low-temperature baseline) that share the prompt's KV cells, advance all of them with ONE
// batched decode per step, keep the candidate with the lowest perplexity (retainOnly).

const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/best-of-n.js [--jsonl] [--model path] [--n 5] [--max-tokens 48]
                                 [--temperature 0.9] [--seed 1] [--prompt text]`;

run(async () => {
  const flags = parseFlags(USAGE, {
    n: 5,
    maxTokens: 48,
    temperature: 0.9,
    seed: 1,
    prompt: 'The best thing about living near the ocean is',
  });
  const out = output(flags);
  const started = Date.now();

  // Leases: the root, the baseline and N candidates are alive at the same time.
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: flags.n + 2 }));
  const store = new BranchStore(ctx);
  const trace = out.trace(ctx); // --jsonl: the tree's events too, for the page of `llama-branch serve`
  const prompt = await ctx.tokenize(flags.prompt);
  out.emit('start', {
    n: flags.n,
    maxTokens: flags.maxTokens,
    promptTokens: prompt.length,
    model: ctx.modelDescription,
  });
  out.say(`best-of-${flags.n} on ${ctx.modelDescription}: ${oneLine(flags.prompt)}`);

  const root = Branch.create(ctx, 0, { temperature: flags.temperature, topP: 0.95, seed: flags.seed });
  await root.prefill(prompt); // the prompt is decoded once; every fork shares these cells

  const baseline = root.fork();
  baseline.setSamplerParams({ temperature: 0.2, seed: flags.seed });
  const candidates = Array.from({ length: flags.n }, (_, i) => {
    const b = root.fork();
    b.reseedSampler(flags.seed + 1 + i); // a fork copies the parent's RNG state: give each its own
    return b;
  });
  const all = [baseline, ...candidates];
  const texts = all.map(() => '');
  const counts = all.map(() => 0);

  let live = all.map((_, i) => i);
  for (let step = 0; step < flags.maxTokens && live.length > 0; step++) {
    const produced = store.produce(live.map((i) => all[i])); // sample every live branch
    const next = [];
    produced.forEach((p, j) => {
      if (p.isStop) return; // this branch is finished
      const i = live[j];
      texts[i] += p.text;
      counts[i]++;
      next.push(i);
    });
    await store.commit(next.map((i) => [all[i], produced[live.indexOf(i)].token])); // ONE decode
    live = next;
    out.progress('generating', step + 1, flags.maxTokens);
  }

  out.emit('baseline', { ppl: round(baseline.perplexity), tokens: counts[0], text: texts[0] });
  out.say(`\nbaseline (T 0.2)  ppl ${baseline.perplexity.toFixed(2).padStart(6)}  ${oneLine(texts[0])}`);
  candidates.forEach((b, i) => {
    out.emit('candidate', { index: i, ppl: round(b.perplexity), tokens: counts[i + 1], text: texts[i + 1] });
    out.say(`candidate #${i}      ppl ${b.perplexity.toFixed(2).padStart(6)}  ${oneLine(texts[i + 1])}`);
  });

  const best = candidates.reduce((a, b) => (b.perplexity < a.perplexity ? b : a));
  const bestIndex = candidates.indexOf(best);
  const baselinePpl = baseline.perplexity;
  const kvBefore = store.kvPressure();
  if (trace) trace.finish(best, 'best'); // the others are pruned next
  await store.retainOnly(best); // frees the root, the baseline and the other candidates at once
  const kvAfter = store.kvPressure();

  out.say(`\nwinner: candidate #${bestIndex} (lowest perplexity ${best.perplexity.toFixed(2)})`);
  out.say(`KV cells used: ${kvBefore.cellsUsed} before retainOnly, ${kvAfter.cellsUsed} after`);
  out.emit('complete', {
    bestIndex,
    bestPpl: round(best.perplexity),
    baselinePpl: round(baselinePpl),
    baselineDisposed: baseline.disposed,
    kvCellsBefore: kvBefore.cellsUsed,
    kvCellsAfter: kvAfter.cellsUsed,
    winnerPosition: best.position,
    liveBranchesAfter: flags.n + 2 - store.available,
    elapsedMs: Date.now() - started,
  });
  ctx.dispose();
});
