'use strict';

// Context-level API: ctx.sample(params), metrics and perplexity trackers, grammar sampler handles,
// jsonSchemaToGrammar, embeddings (js-api.md §3.2 scenarios 2, 4, 8, 14, 17, 22).

const assert = require('node:assert/strict');
const { Branch, jsonSchemaToGrammar } = require('..');
const { open, rejects, throwsSync, argmax, cosine } = require('./helpers');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

const EMPTY_OBJECT_GBNF = 'root ::= "{" ws "}" ws\nws ::= [ \\t\\n]*';

function norm(v) {
  return Math.sqrt(v.reduce((s, x) => s + x * x, 0));
}

describe('Context API: sample, metrics, grammar handles, embeddings', function () {
  // Token-by-token loops are slow on a busy 2-core machine; the default 120 s is too tight.
  this.timeout(600000);
  let ctx;
  before(async () => {
    ctx = await open({ nCtx: 1024 });
  });
  after(() => ctx && ctx.dispose());
  afterEach(async () => {
    for (const h of nativeOf(ctx)._storeLiveHandles()) nativeOf(ctx)._branchPrune(h);
    await ctx.kvCacheClear();
  });

  async function decodeText(text) {
    const tokens = await ctx.tokenize(text);
    await ctx.decode(tokens, 0, 0);
    return tokens;
  }

  describe('ctx.sample', () => {
    it('without params and with temperature 0 equals greedySample()', async () => {
      await decodeText('The capital of France is');
      const greedy = ctx.greedySample();
      assert.equal(greedy, argmax(ctx.getLogits()));
      assert.equal(ctx.sample(), greedy);
      assert.equal(ctx.sample({ temperature: 0 }), greedy);
      assert.equal(ctx.sample({ temperature: 0, topK: 0, topP: 1, minP: 0 }), greedy);
    });

    it('keeps its chain while the params are equal: accepted tokens feed the penalties', async () => {
      await decodeText('One, two, three, four,');
      const greedy = ctx.greedySample();
      const penalised = { temperature: 0, penalties: { presence: 100, lastN: 64 } };
      assert.equal(ctx.sample(penalised), greedy, 'empty penalty history: argmax');
      const second = ctx.sample(penalised);
      assert.notEqual(second, greedy, 'the first pick was accepted and is now penalised');
      const third = ctx.sample({ ...penalised, penalties: { ...penalised.penalties } });
      assert.ok(third !== greedy && third !== second, 'equal params (a new object) reuse the chain');
      // Different params rebuild the chain: the penalty history starts empty again.
      assert.equal(ctx.sample({ temperature: 0, penalties: { presence: 100, lastN: 32 } }), greedy);
      // sample() without params is stateless argmax and leaves the chain alone.
      assert.equal(ctx.sample(), greedy);
    });

    it('a rebuilt seeded chain replays the same draws; a kept chain continues its RNG', async () => {
      await decodeText('Once upon a time');
      const params = { temperature: 1.5, topK: 0, topP: 1, minP: 0, seed: 1234 };
      const first = Array.from({ length: 16 }, () => ctx.sample(params));
      const continued = Array.from({ length: 16 }, () => ctx.sample(params));
      ctx.sample({ ...params, seed: 99 }); // rebuild
      const replay = Array.from({ length: 16 }, () => ctx.sample(params)); // rebuild with seed 1234
      assert.deepEqual(replay, first);
      assert.notDeepEqual(continued, first, 'the RNG state carried on between calls');
      assert.ok(new Set(first).size > 1, 'T 1.5 over the whole vocabulary should vary');
    });

    it('logitBias applies; errors are coded', async () => {
      await decodeText('The capital of France is');
      const greedy = ctx.greedySample();
      assert.notEqual(ctx.sample({ temperature: 0, logitBias: [{ token: greedy, bias: -Infinity }] }), greedy);
      throwsSync(() => ctx.sample({ temperature: 0, grammar: 'root ::= "a"' }), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.sample({ temperature: Number.NaN }), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.sample({ topP: 2 }), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.sample(42), 'ERR_INVALID_ARG');
      // a sync call waits for the decode queued before it, then samples that decode's logits
      const before = ctx.kvSeqPosMax(0);
      const pending = ctx.decode([greedy], before + 1, 0);
      const sampled = ctx.sample({ temperature: 0 });
      assert.equal(ctx.kvSeqPosMax(0), before + 1, 'the queued decode ran first');
      assert.equal(sampled, ctx.greedySample());
      await pending;
      const fresh = await open({ nCtx: 256 });
      try {
        throwsSync(() => fresh.sample({ temperature: 0 }), 'ERR_NO_LOGITS');
        throwsSync(() => fresh.sample(), 'ERR_NO_LOGITS');
      } finally {
        fresh.dispose();
      }
    });

    it('determinism: two fresh contexts, 20 steps of sample({temperature: 0}) + decode', async () => {
      async function run() {
        const c = await open({ nCtx: 256 });
        try {
          const tokens = await c.tokenize('Count from 1 to 5.');
          await c.decode(tokens, 0);
          const out = [];
          for (let i = 0; i < 20; i++) {
            const t = c.sample({ temperature: 0 });
            out.push(t);
            await c.decode([t], tokens.length + i);
          }
          return out;
        } finally {
          c.dispose();
        }
      }
      const [a, b] = [await run(), await run()];
      assert.equal(a.length, 20);
      assert.deepEqual(b, a);
    });
  });

  describe('metrics', () => {
    it('surprisal and entropy in nats and bits, from the context or a given logits row', async () => {
      const tokens = await decodeText('Hello');
      const t1 = ctx.greedySample();
      const nats = ctx.modelSurprisal(t1, 'nats');
      assert.ok(nats >= 0 && Number.isFinite(nats));
      assert.ok(Math.abs(ctx.modelSurprisal(t1, 'bits') - nats / Math.LN2) < 0.01);
      assert.equal(ctx.modelSurprisal(t1), nats, 'nats is the default');
      const logits = ctx.getLogits();
      assert.ok(Math.abs(ctx.modelSurprisal(t1, 'nats', logits) - nats) < 1e-9);
      assert.ok(Math.abs(ctx.modelEntropy('nats', logits) - ctx.modelEntropy()) < 1e-9);
      // A uniform row: entropy ln(V), surprisal ln(V) for any token.
      const uniform = new Float32Array(ctx.vocabSize);
      assert.ok(Math.abs(ctx.modelEntropy('nats', uniform) - Math.log(ctx.vocabSize)) < 1e-6);
      assert.ok(Math.abs(ctx.modelEntropy('bits', uniform) - 18) < 1e-6, 'log2(262144) = 18 bits');
      assert.ok(Math.abs(ctx.modelSurprisal(5, 'bits', uniform) - Math.log2(ctx.vocabSize)) < 1e-6);
      uniform[7] = -Infinity;
      assert.equal(ctx.modelSurprisal(7, 'nats', uniform), Infinity, 'a masked token is infinitely surprising');
      // Errors: wrong length, wrong type, bad base, bad token.
      throwsSync(() => ctx.modelEntropy('nats', new Float32Array(10)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.modelSurprisal(t1, 'nats', new Float32Array(ctx.vocabSize + 1)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.modelEntropy('nats', new Float64Array(ctx.vocabSize)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.modelEntropy('nats', Array.from(logits)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.modelEntropy('base10'), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.modelSurprisal(ctx.vocabSize, 'nats'), 'ERR_TOKEN_OUT_OF_RANGE');
      assert.ok(tokens.length > 0);
    });

    it('perplexity trackers: add, count, clone, reset, free (scenario 4)', async () => {
      const tokens = await decodeText('Hello');
      const t1 = ctx.greedySample();
      const h = ctx.createPerplexityTracker();
      assert.ok(Number.isInteger(h) && h > 0);
      assert.equal(ctx.getPerplexity(h), Infinity, 'nothing counted yet');
      ctx.addSurprisal(h, ctx.modelSurprisal(t1));
      await ctx.decode([t1], tokens.length);
      ctx.addSurprisal(h, ctx.modelSurprisal(ctx.greedySample()));
      assert.equal(ctx.getPerplexityCount(h), 2);
      const ppl = ctx.getPerplexity(h);
      assert.ok(ppl >= 1.0 && Number.isFinite(ppl));
      const c = ctx.clonePerplexityTracker(h);
      assert.notEqual(c, h);
      assert.equal(ctx.getPerplexity(c), ppl);
      ctx.resetPerplexityTracker(c);
      assert.equal(ctx.getPerplexityCount(c), 0);
      assert.equal(ctx.getPerplexityCount(h), 2, 'the clone is independent');
      ctx.freePerplexityTracker(h);
      ctx.freePerplexityTracker(c);
      throwsSync(() => ctx.getPerplexity(h), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.freePerplexityTracker(h), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.clonePerplexityTracker(c), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.addSurprisal(12345, 1), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.getPerplexityCount(0), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.resetPerplexityTracker(-1), 'ERR_INVALID_ARG');
    });

    it('non-finite surprisals are ignored, negative ones count as 0; trackers work while busy', async () => {
      const h = ctx.createPerplexityTracker();
      ctx.addSurprisal(h, Infinity);
      ctx.addSurprisal(h, Number.NaN);
      assert.equal(ctx.getPerplexityCount(h), 0);
      ctx.addSurprisal(h, -3);
      ctx.addSurprisal(h, 2 * Math.LN2);
      assert.equal(ctx.getPerplexityCount(h), 2);
      assert.ok(Math.abs(ctx.getPerplexity(h) - 2) < 1e-9, 'exp((0 + 2 ln 2) / 2) = 2');
      const pending = ctx.decode(await ctx.tokenize('Hi'), 0);
      ctx.addSurprisal(h, 1);
      assert.equal(ctx.getPerplexityCount(h), 3);
      await pending;
      ctx.freePerplexityTracker(h);
    });
  });

  describe('grammar sampler handles', () => {
    it('create, clone, apply, accept, free (scenario 8)', async () => {
      const h = ctx.createSampler(EMPTY_OBJECT_GBNF);
      assert.ok(Number.isInteger(h) && h > 0);
      const c = ctx.cloneSampler(h);
      assert.notEqual(c, h);
      const logits = new Float32Array(ctx.vocabSize).fill(0.5);
      ctx.applySampler(h, logits);
      const masked = logits.filter((x) => x < -1e30).length;
      const valid = logits.findIndex((x) => x === 0.5);
      assert.ok(masked > 0 && valid >= 0, `masked ${masked}, a valid token ${valid}`);
      assert.equal(ctx.tokenToText(valid), '{');
      ctx.acceptSamplerToken(h, valid);
      ctx.freeSamplerHandle(h);
      ctx.freeSamplerHandle(c);
      throwsSync(() => ctx.freeSamplerHandle(h), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.applySampler(c, logits), 'ERR_INVALID_ARG');
    });

    it('forbidden tokens are refused without changing the grammar; clones are independent', async () => {
      const [open_, close, letter] = [
        ...ctx.tokenizeSync('{', false),
        ...ctx.tokenizeSync('}', false),
        ...ctx.tokenizeSync('x', false),
      ];
      const eog = ctx.getEogToken();
      const h = ctx.createSampler(EMPTY_OBJECT_GBNF);
      throwsSync(() => ctx.acceptSamplerToken(h, letter), 'ERR_GRAMMAR_REJECTED');
      throwsSync(() => ctx.acceptSamplerToken(h, eog), 'ERR_GRAMMAR_REJECTED'); // would abort in llama.cpp
      ctx.acceptSamplerToken(h, open_);
      const c = ctx.cloneSampler(h);
      ctx.acceptSamplerToken(c, close);
      const forClone = new Float32Array(ctx.vocabSize);
      const forOriginal = new Float32Array(ctx.vocabSize);
      ctx.applySampler(c, forClone);
      ctx.applySampler(h, forOriginal);
      assert.equal(forClone[eog], 0, 'the clone is complete: end of generation allowed');
      assert.equal(forOriginal[eog], -Infinity, 'the original still needs "}"');
      assert.equal(forOriginal[close], 0);
      ctx.acceptSamplerToken(c, eog);
      throwsSync(() => ctx.acceptSamplerToken(h, ctx.vocabSize), 'ERR_TOKEN_OUT_OF_RANGE');
      ctx.freeSamplerHandle(h);
      ctx.freeSamplerHandle(c);
    });

    it('a manual grammar loop on context logits (applySampler + argmax + decode)', async () => {
      const tokens = await decodeText('Output: ');
      const h = ctx.createSampler(EMPTY_OBJECT_GBNF);
      let text = '';
      for (let i = 0; i < 10; i++) {
        const logits = ctx.getLogits();
        ctx.applySampler(h, logits);
        const t = argmax(logits);
        if (ctx.isStopToken(t)) break;
        ctx.acceptSamplerToken(h, t);
        text += ctx.tokenToText(t);
        await ctx.decode([t], tokens.length + i);
      }
      assert.match(text, /^\{\s*\}\s*$/);
      ctx.freeSamplerHandle(h);
    });

    it('a Branch with the same grammar produces {} (scenario 8)', async () => {
      const tokens = await decodeText('Output: ');
      const b = Branch.create(ctx, 0, tokens.length, { temperature: 0 }, undefined, EMPTY_OBJECT_GBNF);
      b.captureLogits();
      let text = '';
      for (let i = 0; i < 10; i++) {
        const p = b.produce();
        if (p.isStop) break;
        text += p.text;
        await b.commit(p.token);
      }
      assert.match(text, /^\{\s*\}\s*$/);
      await b.prune();
    });

    it('malformed grammars and bad arguments are coded errors everywhere', async () => {
      for (const bad of ['root ::= [', 'root ::= ???', '', '   ', 'notroot ::= "a"']) {
        throwsSync(() => ctx.createSampler(bad), 'ERR_GRAMMAR');
      }
      const tokens = await decodeText('Output: ');
      throwsSync(
        () => Branch.create(ctx, 0, tokens.length, { temperature: 0 }, undefined, 'root ::= ['),
        'ERR_GRAMMAR',
      );
      throwsSync(() => Branch.create(ctx, 0, tokens.length, { grammar: 'root ::= [' }), 'ERR_GRAMMAR');
      const b = Branch.create(ctx, 0, tokens.length, { temperature: 0 });
      throwsSync(() => b.setSamplerParams({ grammar: 'root ::= [' }), 'ERR_GRAMMAR');
      throwsSync(() => b.setGrammar('root ::= ['), 'ERR_GRAMMAR');
      await b.prune();
      const h = ctx.createSampler(EMPTY_OBJECT_GBNF);
      throwsSync(() => ctx.applySampler(h, new Float32Array(100)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.applySampler(h, new Float64Array(ctx.vocabSize)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.applySampler(h, null), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.applySampler(0, new Float32Array(ctx.vocabSize)), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.acceptSamplerToken(h + 1000, 1), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.cloneSampler(1.5), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.createSampler(42), 'ERR_INVALID_ARG');
      const more = await ctx.tokenize(' and more', false);
      const pending = ctx.decode(more, tokens.length, 0);
      ctx.applySampler(h, new Float32Array(ctx.vocabSize)); // waits for the queued decode
      assert.equal(ctx.kvSeqPosMax(0), tokens.length + more.length - 1, 'the queued decode ran first');
      ctx.acceptSamplerToken(h, ctx.tokenizeSync('{', false)[0]); // no context state: never waits
      await pending;
      ctx.freeSamplerHandle(h);
    });
  });

  describe('jsonSchemaToGrammar', () => {
    it('returns a Promise of GBNF that constrains a branch to valid JSON (scenario 22)', async () => {
      const schema = {
        type: 'object',
        properties: { name: { type: 'string' }, age: { type: 'integer' } },
        required: ['name', 'age'],
      };
      const pending = jsonSchemaToGrammar(schema);
      assert.ok(pending instanceof Promise);
      const grammar = await pending;
      assert.ok(grammar.length > 0 && grammar.includes('root'));
      assert.equal(await jsonSchemaToGrammar(JSON.stringify(schema)), grammar, 'object and JSON text agree');
      const h = ctx.createSampler(grammar);
      assert.ok(h > 0);
      ctx.freeSamplerHandle(h);
      const tokens = await decodeText('Output JSON: ');
      const b = Branch.create(ctx, 0, tokens.length, { temperature: 0 }, undefined, grammar);
      b.captureLogits();
      let text = '';
      for (let i = 0; i < 60; i++) {
        const p = b.produce();
        if (p.isStop) break;
        text += p.text;
        await b.commit(p.token);
      }
      const obj = JSON.parse(text);
      assert.equal(typeof obj.name, 'string');
      assert.ok(Number.isInteger(obj.age));
      await b.prune();
    });

    it('rejects bad JSON and unconvertible schemas with ERR_GRAMMAR, other types with ERR_INVALID_ARG', async () => {
      await rejects(() => jsonSchemaToGrammar('not valid json {{{'), 'ERR_GRAMMAR', /not valid JSON/);
      await rejects(() => jsonSchemaToGrammar({ type: 'no-such-type' }), 'ERR_GRAMMAR');
      await rejects(() => jsonSchemaToGrammar('123'), 'ERR_GRAMMAR');
      await rejects(() => jsonSchemaToGrammar(null), 'ERR_INVALID_ARG');
      await rejects(() => jsonSchemaToGrammar(undefined), 'ERR_INVALID_ARG');
      await rejects(() => jsonSchemaToGrammar(42), 'ERR_INVALID_ARG');
    });
  });

  describe('embeddings', () => {
    let emb;
    before(async () => {
      emb = await open({ nCtx: 512, nBatch: 512, embeddings: true, poolingType: 1 });
    });
    after(() => emb && emb.dispose());

    async function embed(text, normalize) {
      await emb.encode(await emb.tokenize(text));
      return emb.getEmbeddings(normalize);
    }

    it('pooled, normalised, and ordered by meaning (scenario 17)', async () => {
      assert.equal(emb.hasPooling(), true);
      const dim = emb.getEmbeddingDimension();
      assert.ok(dim > 0);
      const cat = await embed('The cat sat on the mat');
      assert.ok(cat instanceof Float32Array);
      assert.equal(cat.length, dim);
      assert.ok(Math.abs(norm(cat) - 1) < 0.01);
      assert.ok(cosine(cat, await embed('The cat sat on the mat')) > 0.99);
      const rug = await embed('A cat rested on the rug');
      const stocks = await embed('Stock prices rose sharply');
      const [related, unrelated] = [cosine(cat, rug), cosine(cat, stocks)];
      assert.ok(related > unrelated, `related ${related} vs unrelated ${unrelated}`);
    });

    it('normalize=false keeps the raw vector (same direction); a copy each call', async () => {
      const raw = await embed('The weather is sunny and warm today.', false);
      const unit = emb.getEmbeddings();
      assert.ok(Math.abs(norm(raw) - 1) > 0.01, `raw norm ${norm(raw)}`);
      assert.ok(cosine(raw, unit) > 0.9999);
      unit[0] = 12345;
      assert.notEqual(emb.getEmbeddings()[0], 12345);
    });

    it('encode replaces sequence 0 each time, so the order of texts does not matter', async () => {
      const a1 = await embed('I love eating pizza with cheese.');
      await embed('The function returns a null pointer.');
      const a2 = await embed('I love eating pizza with cheese.');
      assert.ok(cosine(a1, a2) > 0.999);
      assert.equal(emb.kvSeqPosMax(0), (await emb.tokenize('I love eating pizza with cheese.')).length - 1);
    });

    it('errors: empty, too long, leased sequence 0, busy', async () => {
      await rejects(() => emb.encode([]), 'ERR_INVALID_ARG');
      await rejects(() => emb.encode(new Array(emb.nBatch + 1).fill(1)), 'ERR_INVALID_ARG', /nBatch/);
      await rejects(() => emb.encode([emb.vocabSize]), 'ERR_TOKEN_OUT_OF_RANGE');
      const b = Branch.create(emb, 0, emb.kvSeqPosMax(0) + 1);
      await rejects(() => emb.encode([1, 2]), 'ERR_INVALID_ARG', /leased/);
      await b.prune();
      const first = emb.getEmbeddings();
      const pending = emb.encode(await emb.tokenize('a different text entirely'));
      assert.equal(emb.hasPooling(), true, 'hasPooling never waits');
      const waited = emb.getEmbeddings(); // waits for the queued encode
      assert.notDeepEqual(Array.from(waited), Array.from(first), 'the queued encode ran first');
      await pending;
    });

    it('getEmbeddings before any encode is ERR_NO_LOGITS; NONE pooling returns the last token', async () => {
      const none = await open({ nCtx: 256, nBatch: 256, embeddings: true, poolingType: 0 });
      try {
        assert.equal(none.hasPooling(), false);
        throwsSync(() => none.getEmbeddings(), 'ERR_NO_LOGITS');
        await none.encode(await none.tokenize('The cat sat on the mat'));
        const v = none.getEmbeddings();
        assert.equal(v.length, none.getEmbeddingDimension());
        assert.ok(Math.abs(norm(v) - 1) < 0.01);
      } finally {
        none.dispose();
      }
    });

    it('embedBatch: a vector per input as encode gives it, several per decode; bad input changes nothing', async () => {
      const batch = await open({ nCtx: 512, nBatch: 128, embeddings: true, poolingType: 1, nSeqMax: 4 });
      try {
        const texts = [
          'The cat sat on the mat',
          'Stock prices rose sharply',
          'A cat rested on the rug',
          'I love eating pizza with cheese.',
          'The function returns a null pointer.',
          `A long line ${'about the harbour and the sea '.repeat(12)}`, // over half of nBatch: a decode of its own
        ];
        const inputs = await Promise.all(texts.map((t) => batch.tokenize(t)));
        assert.ok(inputs[5].length > 64 && inputs[5].length <= 128, `${inputs[5].length} tokens`);
        const vectors = await batch.embedBatch(inputs);
        assert.equal(vectors.length, texts.length);
        assert.equal(batch.kvSeqPosMax(0), -1, 'its sequences are cleared after');
        for (const [i, tokens] of inputs.entries()) {
          await batch.encode(tokens);
          const alone = batch.getEmbeddings();
          // Not batch-invariant on CPU (a Q4 model, other batch shapes): near, not equal.
          assert.ok(cosine(vectors[i], alone) > 0.999, `input ${i}: cosine ${cosine(vectors[i], alone)}`);
          assert.ok(Math.abs(norm(vectors[i]) - 1) < 0.01);
        }
        assert.ok(cosine(vectors[0], vectors[2]) > cosine(vectors[0], vectors[1]), 'the cats are nearer each other');
        const [raw] = await batch.embedBatch([inputs[1]], false);
        assert.ok(Math.abs(norm(raw) - 1) > 0.01 && cosine(raw, vectors[1]) > 0.999);

        await rejects(() => batch.embedBatch([inputs[0], []]), 'ERR_INVALID_ARG', /inputs\[1\]/);
        await rejects(() => batch.embedBatch([new Array(129).fill(inputs[0][1])]), 'ERR_INVALID_ARG', /nBatch/);
        await rejects(() => batch.embedBatch([[batch.vocabSize]]), 'ERR_TOKEN_OUT_OF_RANGE');
        await rejects(() => batch.embedBatch(/** @type {any} */ ('text')), 'ERR_INVALID_ARG');
        await batch.encode(inputs[3]);
        const before = batch.getEmbeddings();
        const b = Branch.create(batch, batch.kvSeqPosMax(0) + 1, { temperature: 0 });
        await rejects(() => batch.embedBatch(inputs.slice(0, 3)), 'ERR_INVALID_ARG', /leased/);
        await b.prune();
        assert.deepEqual(Array.from(batch.getEmbeddings()), Array.from(before), 'a refused batch changed nothing');
      } finally {
        batch.dispose();
      }
    });

    it('embedBatch needs a pooled embedding context: ERR_UNSUPPORTED otherwise', async () => {
      // llama.cpp aborts reserving mean pooling's graph when nBatch / nSeqMax does not divide.
      const odd = { nCtx: 256, nBatch: 256, embeddings: true, poolingType: 1, nSeqMax: 3 };
      await rejects(() => open(odd), 'ERR_INVALID_ARG', /multiple of nSeqMax/);
      const none = await open({ nCtx: 256, nBatch: 256, embeddings: true, poolingType: 0 });
      try {
        await rejects(() => none.embedBatch([[1, 2]]), 'ERR_UNSUPPORTED', /pooled/);
      } finally {
        none.dispose();
      }
      await rejects(() => ctx.embedBatch([[1, 2]]), 'ERR_UNSUPPORTED', /embeddings: true/);
    });

    it('a context without embeddings refuses encode/getEmbeddings with ERR_UNSUPPORTED', async () => {
      assert.equal(ctx.hasPooling(), false);
      assert.ok(ctx.getEmbeddingDimension() > 0);
      await rejects(() => ctx.encode([1, 2, 3]), 'ERR_UNSUPPORTED', /embeddings: true/);
      throwsSync(() => ctx.getEmbeddings(), 'ERR_UNSUPPORTED');
    });
  });

  it('dispose frees trackers and grammar handles; later calls are ERR_CONTEXT_DISPOSED', async () => {
    const c = await open({ nCtx: 256 });
    const t = c.createPerplexityTracker();
    const g = c.createSampler(EMPTY_OBJECT_GBNF);
    c.dispose();
    throwsSync(() => c.getPerplexity(t), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => c.freeSamplerHandle(g), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => c.createPerplexityTracker(), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => c.sample({ temperature: 0 }), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => c.hasPooling(), 'ERR_CONTEXT_DISPOSED');
    await rejects(() => c.encode([1]), 'ERR_CONTEXT_DISPOSED');
  });
});
