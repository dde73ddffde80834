#!/usr/bin/env node
'use strict';

// llama-branch demo: one prompt, a streamed greedy continuation, then best-of-4 by perplexity.
// Run with `npm run demo` (or `node examples/demo.js`). Model: $LLAMA_TEST_MODEL or the default.

const fs = require('node:fs');
const path = require('node:path');
const { createContext, Branch, BranchStore } = require('llama-branch');

const MODEL = process.env.LLAMA_TEST_MODEL || path.join(__dirname, '..', 'models', 'gemma-3-270m-q4_k_m.gguf');
const PROMPT = 'The capital of France is';
const N_TOKENS = 16;
const N_CANDIDATES = 4;

const fmt = (p) => `cells used ${p.cellsUsed}/${p.nCtx}, ${p.remaining} remaining`;
const oneLine = (s) => JSON.stringify(s);

async function main() {
  if (!fs.existsSync(MODEL)) {
    console.error(
      `Model not found: ${MODEL}\nRun \`npm run fetch-model\` first (or set LLAMA_TEST_MODEL=/path/to/model.gguf).`,
    );
    process.exit(1);
  }

  let t0 = Date.now();
  // One root + 4 forks, each on its own KV sequence: nSeqMax 5.
  const ctx = await createContext({ modelPath: MODEL, nCtx: 1024, nSeqMax: N_CANDIDATES + 1 });
  console.log(`Loaded ${ctx.modelDescription} in ${Date.now() - t0} ms (vocab ${ctx.vocabSize}, nCtx ${ctx.nCtx})`);

  const store = new BranchStore(ctx);
  const root = Branch.create(ctx, 0, { temperature: 0 }); // temperature <= 0: greedy
  await root.prefill(await ctx.tokenize(PROMPT));

  // 1. Greedy continuation, streamed. A fork shares the prompt's KV cells; the root stays put.
  process.stdout.write(`\n[greedy] ${PROMPT}`);
  const greedy = root.fork();
  let n = 0;
  for await (const { text } of greedy) {
    process.stdout.write(text);
    if (++n === N_TOKENS) break;
  }
  console.log(`\n  (perplexity ${greedy.perplexity.toFixed(2)})`);
  await greedy.prune(); // frees its sequence lease for the best-of-4 below

  // 2. Best-of-4: every candidate starts with a different one of the root's top-4 tokens.
  const logits = root.getLogits();
  const firsts = [...logits.keys()].sort((a, b) => logits[b] - logits[a]).slice(0, N_CANDIDATES);
  const candidates = firsts.map(() => root.fork());
  await store.commit(candidates.map((b, i) => [b, firsts[i]])); // one decode for all 4
  const texts = firsts.map((t) => ctx.tokenToText(t));

  let live = [...candidates];
  for (let step = 1; step < N_TOKENS && live.length > 0; step++) {
    const produced = store.produce(live); // sample all live branches (no KV write)
    const next = [];
    produced.forEach((p, i) => {
      if (p.isStop) return; // this candidate is finished
      texts[candidates.indexOf(live[i])] += p.text;
      next.push([live[i], p.token]);
    });
    await store.commit(next); // ONE batched decode per step
    live = next.map(([b]) => b);
  }

  console.log(`\n[best-of-${N_CANDIDATES}] ${PROMPT} ...`);
  candidates.forEach((b, i) => console.log(`  #${i} ppl ${b.perplexity.toFixed(2).padStart(6)}  ${oneLine(texts[i])}`));
  const winner = candidates.reduce((best, b) => (b.perplexity < best.perplexity ? b : best));
  console.log(`  winner: #${candidates.indexOf(winner)}`);

  console.log(`\nKV before retainOnly: ${fmt(store.kvPressure())}, free leases ${store.available}`);
  await store.retainOnly(winner); // frees the root and the other candidates in one pass
  console.log(`KV after  retainOnly: ${fmt(store.kvPressure())}, free leases ${store.available}`);
  console.log(`winner still live: ${!winner.disposed}, root disposed: ${root.disposed}`);

  ctx.dispose();
}

main().catch((e) => {
  console.error(e.code ? `${e.code}: ${e.message}` : e);
  process.exit(1);
});
