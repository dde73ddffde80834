'use strict';

// The reference's later surface: ctx.jsonSchemaToGrammar and the synchronous twins
// (jsonSchemaToGrammarSync, formatChatSync, produceSync, forkSync, pruneSync,
// pruneSubtreeSync), used as its programs use them. Prints one JSON object.

const { createContext, Branch, BranchStore } = require('llama-branch');
const modelPath = require('./_model');

async function main() {
  const ctx = await createContext({ modelPath, nCtx: 1024, nSeqMax: 4 });
  const schema = {
    type: 'object',
    properties: { answer: { type: 'integer', maximum: 1000 } },
    required: ['answer'],
    additionalProperties: false,
  };
  const viaPromise = await ctx.jsonSchemaToGrammar(schema);
  const viaSync = ctx.jsonSchemaToGrammarSync(JSON.stringify(schema));

  const chat = ctx.formatChatSync([{ role: 'user', content: 'Give me a number as JSON.' }]);
  const tokens = await ctx.tokenize('A JSON object with the answer to two plus two: ');
  await ctx.decode(tokens, 0, 0);
  const root = Branch.create(ctx, 0, tokens.length, { temperature: 0 }, undefined, viaSync);
  root.captureLogits();

  let json = '';
  for (let i = 0; i < 60; i++) {
    const { token, text, isStop } = root.produceSync();
    if (isStop) break;
    await root.commit(token);
    json += text;
  }
  const child = root.forkSync();
  const grandchild = child.forkSync();
  grandchild.pruneSync();
  const afterPruneSync = grandchild.disposed;
  const spare = root.forkSync();
  spare.produceSync();
  child.pruneSubtreeSync();
  console.log(
    JSON.stringify({
      sameGrammar: viaPromise === viaSync,
      promptHasUser: chat.prompt.includes('Give me a number'),
      json,
      afterPruneSync,
      childDisposed: child.disposed,
      spareLive: !spare.disposed,
      liveLeases: 4 - new BranchStore(ctx).available,
    }),
  );
  ctx.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
