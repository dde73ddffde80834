'use strict';

// Best-of-N in the reference's first BranchStore style: explicit sequence ids, a baseline
// branch created on an empty sequence and filled with kvSeqCopy afterwards, round-robin
// produce/commit without awaits, the lowest-perplexity candidate kept. Prints one JSON object.

const { createContext, Branch, BranchStore } = require('llama-branch');
const modelPath = require('./_model');

const N = 3;
const TOKENS = 12;

async function main() {
  const ctx = await createContext({ modelPath, nCtx: 1024, nSeqMax: N + 2 });
  const prompt = await ctx.tokenize('Write one sentence about the sea:');
  await ctx.decode(prompt, 0, 0);
  const root = Branch.create(ctx, 0, prompt.length, { temperature: 0.9, topP: 0.95, seed: 7 });
  root.captureLogits();

  // Baseline on sequence 1, created first and given the prompt by a copy afterwards.
  const baseline = Branch.create(ctx, 1, prompt.length, { temperature: 0.3, seed: 3 });
  ctx.kvSeqCopy(0, 1);
  baseline.captureLogits();
  let baselineText = '';
  for (let i = 0; i < TOKENS; i++) {
    const { token, text, isStop } = baseline.produce();
    if (isStop) break;
    baseline.commit(token); // not awaited
    baselineText += text;
  }

  const store = new BranchStore(ctx);
  const candidates = [];
  for (let i = 0; i < N; i++) {
    const c = root.fork(2 + i);
    c.reseedSampler(100 + i);
    candidates.push({ branch: c, text: '', done: false });
  }
  for (let step = 0; step < TOKENS; step++) {
    const live = candidates.filter((c) => !c.done);
    if (live.length === 0) break;
    const produced = store.produce(live.map((c) => c.branch));
    const entries = [];
    live.forEach((c, j) => {
      if (produced[j].isStop) c.done = true;
      else {
        c.text += produced[j].text;
        entries.push([c.branch, produced[j].token]);
      }
    });
    if (entries.length) store.commit(entries); // not awaited
  }
  const scored = candidates.map((c) => ({ text: c.text, ppl: c.branch.perplexity }));
  const best = scored.reduce((a, b) => (b.ppl < a.ppl ? b : a));
  for (const c of candidates) if (c.text !== best.text || c.branch.perplexity !== best.ppl) c.branch.prune();
  // What the un-awaited prunes left: which candidates live on, and the leases given back.
  const kept = candidates.map((c) => !c.branch.disposed);
  console.log(
    JSON.stringify({
      baseline: { text: baselineText, ppl: baseline.perplexity, position: baseline.position },
      candidates: scored,
      kept,
      available: store.available,
    }),
  );
  ctx.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
