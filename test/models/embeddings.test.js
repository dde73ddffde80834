'use strict';

// A real embedding encoder (issue 60): nomic-embed-text-v1.5 (nomic-bert: non-causal attention,
// mean pooling from the GGUF, a WordPiece vocabulary), in-process and behind
// `llama-branch serve --embeddings` with the official `openai` client, against llama.cpp's own
// computation of the same model (the xllamacpp wheel: ./reference.js).

const assert = require('node:assert/strict');
const path = require('node:path');
const OpenAI = require('openai');
const { ensureModel } = require('../../scripts/fetch-model');
const { cosine, rejects } = require('../helpers');
const { startServer, stopServer } = require('../serve-helpers');
const { referenceEmbeddings } = require('./reference');
const { createContext, Branch } = require('../..');

const MODEL = ensureModel('nomic-embed-text-v1.5');
const MODEL_ID = path.basename(MODEL, '.gguf');

// nomic-embed's task prefixes: a query and the documents it searches.
const QUERY = 'search_query: What is the capital of France?';
const DOCS = [
  'search_document: Photosynthesis turns light, water and carbon dioxide into sugar in plant leaves.',
  'search_document: Paris is the capital and largest city of France, on the river Seine.',
  'search_document: The Rust borrow checker rejects programs that hold two mutable references.',
  'search_document: Mount Kilimanjaro in Tanzania is the highest mountain in Africa.',
];
const TEXTS = [QUERY, ...DOCS];

describe('nomic-embed-text-v1.5: a real encoder', function () {
  this.timeout(600000);
  let reference;

  before(() => {
    reference = referenceEmbeddings(MODEL, TEXTS);
    assert.equal(reference.length, TEXTS.length);
  });

  it('in-process vectors agree with llama.cpp to cosine >= 0.9999, and the query finds its document', async () => {
    const ctx = await createContext({ modelPath: MODEL, embeddings: true, nCtx: 2048, nThreads: 2 });
    try {
      assert.equal(ctx.getEmbeddingDimension(), 768);
      assert.ok(ctx.hasPooling(), 'the GGUF says mean pooling');
      const ours = [];
      for (const text of TEXTS) {
        await ctx.encode(ctx.tokenizeSync(text, true));
        ours.push(Array.from(ctx.getEmbeddings(true)));
      }
      ours.forEach((v, i) => {
        const c = cosine(v, reference[i]);
        assert.ok(c >= 0.9999, `text ${i}: cosine ${c} with llama.cpp's vector`);
      });
      const scores = DOCS.map((_, i) => cosine(ours[0], ours[i + 1]));
      assert.equal(scores.indexOf(Math.max(...scores)), 1, `the Paris document ranks first: ${scores}`);
      // An encoder makes no text: a branch is refused, with what to do instead.
      await rejects(() => Branch.create(ctx, 0), 'ERR_UNSUPPORTED', /encoder/);
    } finally {
      await ctx.dispose();
    }
  });

  it('embedBatch: several texts per decode, each agreeing with llama.cpp to cosine >= 0.9999', async () => {
    const ctx = await createContext({ modelPath: MODEL, embeddings: true, nCtx: 2048, nSeqMax: 4, nThreads: 2 });
    try {
      // Five texts on four sequences: two decodes.
      const vectors = await ctx.embedBatch(TEXTS.map((t) => ctx.tokenizeSync(t, true)));
      assert.equal(vectors.length, TEXTS.length);
      vectors.forEach((v, i) => {
        const c = cosine(Array.from(v), reference[i]);
        assert.ok(c >= 0.9999, `text ${i}: cosine ${c} with llama.cpp's vector`);
      });
    } finally {
      await ctx.dispose();
    }
  });

  it('serve --embeddings answers a batch of texts through the openai client; chat is a 400', async () => {
    const server = await startServer(['--embeddings', '--threads', '2', '--ctx-size', '2048'], process.env, MODEL);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
      const r = await client.embeddings.create({ model: MODEL_ID, input: TEXTS, encoding_format: 'float' });
      assert.equal(r.data.length, TEXTS.length);
      r.data.forEach((d, i) => {
        assert.equal(d.index, i);
        const c = cosine(d.embedding, reference[i]);
        assert.ok(c >= 0.9999, `input ${i}: cosine ${c} with llama.cpp's vector`);
      });
      assert.ok(r.usage.prompt_tokens > TEXTS.length * 5, 'usage counts the tokens embedded');
      const chat = client.chat.completions.create({ model: MODEL_ID, messages: [{ role: 'user', content: 'hi' }] });
      await assert.rejects(chat, (e) => e.status === 400 && e.code === 'unsupported' && /encoder/.test(e.message));
      const again = await client.embeddings.create({ model: MODEL_ID, input: QUERY });
      assert.ok(cosine(again.data[0].embedding, reference[0]) >= 0.9999, 'the server still embeds after the refusal');
    } finally {
      assert.equal(await stopServer(server.child), 0, `clean exit; stderr: ${server.stderr()}`);
    }
  });
});
