#!/usr/bin/env node
'use strict';

// Embeddings with a similarity ranking. An embedding context (`embeddings: true`, mean pooling)
// turns each text into one vector (`ctx.encode(tokens)`, then `ctx.getEmbeddings(true)`: unit
// length, so a dot product is the cosine similarity). Prints the pairwise similarity matrix, then
// ranks the documents against a query. Works with the default model; a dedicated embedding model
// (e.g. a nomic-embed or bge GGUF, passed with --model) gives much better rankings.

const { createContext, PoolingType } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/embeddings.js [--jsonl] [--model path] [--query text]`;

const DOCUMENTS = [
  'The cat sat on the warm windowsill and purred.',
  'A kitten was sleeping in a patch of sunlight.',
  'Interest rates rose again as the central bank fought inflation.',
  'The stock market fell after the bank raised its rates.',
  'Fresh basil, tomatoes and mozzarella make a simple salad.',
];

const dot = (a, b) => a.reduce((sum, x, i) => sum + x * b[i], 0);

run(async () => {
  const flags = parseFlags(USAGE, { query: 'Where do cats like to nap?' });
  const out = output(flags);
  const started = Date.now();

  const ctx = await createContext(
    contextOptions(flags, { nCtx: 512, embeddings: true, poolingType: PoolingType.MEAN }),
  );
  const dimension = ctx.getEmbeddingDimension();
  out.emit('start', { embeddingDim: dimension, hasPooling: ctx.hasPooling(), documents: DOCUMENTS.length });
  out.say(`${ctx.modelDescription}: ${dimension}-dimensional embeddings, pooling ${ctx.hasPooling() ? 'on' : 'off'}`);

  async function embed(text) {
    await ctx.encode(await ctx.tokenize(text)); // clears sequence 0, then one decode
    return Array.from(ctx.getEmbeddings(true)); // normalised: |v| = 1
  }

  const vectors = [];
  for (const [i, text] of DOCUMENTS.entries()) {
    const vector = await embed(text);
    vectors.push(vector);
    out.emit('embedding', { index: i, text, dim: vector.length, norm: round(Math.sqrt(dot(vector, vector)), 6) });
    out.progress('embedding', i + 1, DOCUMENTS.length);
  }

  out.say('\ncosine similarity:');
  out.say(`      ${DOCUMENTS.map((_, j) => `#${j}`.padStart(6)).join('')}`);
  for (let i = 0; i < DOCUMENTS.length; i++) {
    const row = [];
    for (let j = 0; j < DOCUMENTS.length; j++) {
      const similarity = dot(vectors[i], vectors[j]);
      row.push(similarity.toFixed(2).padStart(6));
      if (j > i) out.emit('similarity', { a: i, b: j, cosine: round(similarity, 6) });
    }
    out.say(`  #${i} ${row.join('')}  ${oneLine(DOCUMENTS[i])}`);
  }

  const query = await embed(flags.query);
  const ranking = DOCUMENTS.map((text, i) => ({ index: i, text, score: dot(query, vectors[i]) })).sort(
    (a, b) => b.score - a.score,
  );
  out.say(`\nquery ${oneLine(flags.query)}:`);
  ranking.forEach((r, rank) => out.say(`  ${rank + 1}. ${r.score.toFixed(3)}  ${oneLine(r.text)}`));
  out.emit('search', {
    query: flags.query,
    ranking: ranking.map((r) => ({ index: r.index, score: round(r.score, 6) })),
  });
  out.emit('complete', { embeddings: vectors.length, elapsedMs: Date.now() - started });
  ctx.dispose();
});
