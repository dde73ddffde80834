'use strict';

// Speculative decoding in the reference's style: each round forks a draft from the main branch,
// reseeds it, produces and commits up to 4 draft tokens (without awaits) while reading the
// context's entropy, keeps the confident prefix, prunes the draft and commits the accepted
// tokens on the main branch, plus one token of its own when a draft token was rejected.
// Prints one JSON object.

const { createContext, Branch, BranchStore } = require('llama-branch');
const modelPath = require('./_model');

async function main() {
  const ctx = await createContext({ modelPath, nCtx: 1024, nSeqMax: 4 });
  const prompt = await ctx.tokenize('The three primary colours are');
  await ctx.decode(prompt, 0, 0);
  const main = Branch.create(ctx, 0, prompt.length, { temperature: 0.7, seed: 11 });
  main.captureLogits();

  let text = '';
  let drafted = 0;
  let accepted = 0;
  let ownTokens = 0;
  for (let round = 0; round < 4; round++) {
    const draft = main.fork();
    draft.reseedSampler(round + 1);
    const proposal = [];
    for (let i = 0; i < 4; i++) {
      const { token, text: piece, isStop } = draft.produce();
      if (isStop) break;
      draft.commit(token); // not awaited
      proposal.push({ token, piece, entropy: ctx.modelEntropy('nats') });
    }
    drafted += proposal.length;
    draft.prune(); // not awaited
    let kept = 0;
    while (kept < proposal.length && proposal[kept].entropy < 2.0) kept++;
    for (const p of proposal.slice(0, kept)) {
      main.commit(p.token); // not awaited
      text += p.piece;
    }
    accepted += kept;
    if (kept < proposal.length) {
      const own = main.produce();
      if (own.isStop) break;
      main.commit(own.token);
      text += own.text;
      ownTokens++;
    }
  }
  const available = new BranchStore(ctx).available; // every draft's lease is back
  console.log(
    JSON.stringify({
      text,
      drafted,
      accepted,
      ownTokens,
      position: main.position,
      promptLength: prompt.length,
      ppl: main.perplexity,
      available,
    }),
  );
  ctx.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
