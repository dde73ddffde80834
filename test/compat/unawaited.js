'use strict';

// The reference's BranchStore-era style (its commits were synchronous): commit, store.commit,
// prune and retainOnly are called without `await`, and the next line reads positions, samples
// or forks right away. Sequence ids are explicit. Prints one JSON object.

const { createContext, Branch, BranchStore } = require('llama-branch');
const modelPath = require('./_model');

async function main() {
  const ctx = await createContext({ modelPath, nCtx: 1024, nSeqMax: 4 });
  const prompt = await ctx.tokenize('The capital of France is');
  await ctx.decode(prompt, 0, 0);
  const root = Branch.create(ctx, 0, prompt.length, { temperature: 0 });
  root.captureLogits();

  const pieces = [];
  for (let i = 0; i < 6; i++) {
    const { token, text, isStop } = root.produce();
    if (isStop) break;
    root.commit(token); // not awaited
    pieces.push(text);
  }
  const afterLoop = root.position; // waits for the queued commits

  const child = root.fork(1);
  const store = new BranchStore(ctx);
  const a = child.produce();
  const b = root.produce();
  store.commit([
    [child, a.token],
    [root, b.token],
  ]); // not awaited
  const positions = [root.position, child.position];

  child.prune(); // not awaited
  const again = root.fork(1); // sequence 1 is free once the prune (queued first) has run
  const refork = again.seqId;
  const retained = store.retainOnly(root); // not awaited
  const available = store.available; // waits for the retainOnly queued before it
  await retained; // its promise marks the freed branches' wrappers disposed
  const survivors = { root: root.disposed, again: again.disposed, available };

  console.log(
    JSON.stringify({
      promptLength: prompt.length,
      text: pieces.join(''),
      afterLoop,
      positions,
      refork,
      survivors,
      kv: ctx.kvSeqPosMax(0),
    }),
  );
  ctx.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
