'use strict';

// A steer loop in the reference's style: ban the greedy choice with a -Infinity steer bias,
// produce and commit without awaits, then clear the steer. Prints one JSON object.

const { createContext, Branch } = require('llama-branch');
const modelPath = require('./_model');

async function main() {
  const ctx = await createContext({ modelPath, nCtx: 512, nSeqMax: 2 });
  const prompt = await ctx.tokenize('The capital of France is');
  await ctx.decode(prompt, 0, 0);
  const branch = Branch.create(ctx, 0, prompt.length, { temperature: 0 });
  branch.captureLogits();

  const unsteered = branch.produce().token;
  branch.steer([{ token: unsteered, bias: -Infinity }]);
  const steered = [];
  for (let i = 0; i < 5; i++) {
    const { token, isStop } = branch.produce();
    if (isStop) break;
    steered.push(token);
    branch.commit(token); // not awaited
  }
  branch.clearSteer();
  const afterClear = branch.produce().token;
  console.log(
    JSON.stringify({
      unsteered,
      steered,
      afterClear,
      text: await ctx.detokenize(steered),
      position: branch.position,
      promptLength: prompt.length,
    }),
  );
  ctx.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
