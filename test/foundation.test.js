'use strict';

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { createContext } = require('..');
const { MODEL, open, rejects, throwsSync, argmax, greedy, greedyRanks } = require('./helpers');

describe('createContext and SessionContext basics', function () {
  let ctx;
  before(async () => {
    ctx = await open();
  });
  after(() => ctx && ctx.dispose());

  it('loads the model and reports its shape', () => {
    assert.equal(ctx.vocabSize, 262144);
    assert.equal(ctx.nCtx, 1024);
    assert.equal(ctx.nBatch, 512);
    assert.equal(ctx.nSeqMax, 1);
    assert.ok(ctx.memorySize > 100e6 && ctx.memorySize < 1e9, `memorySize ${ctx.memorySize}`);
    assert.equal(ctx.disposed, false);
  });

  it('tokenizes and detokenizes round trip, BOS only with addSpecial', async () => {
    const text = 'Branched inference, tested on a real model.';
    const withBos = await ctx.tokenize(text);
    const without = await ctx.tokenize(text, false);
    assert.equal(withBos[0], ctx.getBosToken());
    assert.deepEqual(withBos.slice(1), without);
    assert.equal(await ctx.detokenize(without), text);
    assert.equal(await ctx.detokenize([]), '');
    assert.deepEqual(ctx.tokenizeSync(text, false), without);
  });

  it('parses special-token text into special tokens', async () => {
    const eog = ctx.getEogToken();
    const piece = ctx.tokenToText(eog);
    assert.ok(piece.length > 0);
    const tokens = await ctx.tokenize(`hi${piece}`, false);
    assert.equal(tokens[tokens.length - 1], eog);
  });

  it('detects end-of-generation tokens', async () => {
    const eog = ctx.getEogToken();
    assert.equal(ctx.isStopToken(eog), true);
    const [word] = await ctx.tokenize(' Paris', false);
    assert.equal(ctx.isStopToken(word), false);
    assert.equal(ctx.tokenToText(word), ' Paris');
  });

  it('decodes a prompt and exposes finite logits for greedy sampling', async () => {
    const tokens = await ctx.tokenize('The capital of France is');
    await ctx.decode(tokens, 0, 0);
    const logits = ctx.getLogits();
    assert.ok(logits instanceof Float32Array);
    assert.equal(logits.length, ctx.vocabSize);
    assert.ok(logits.every(Number.isFinite));
    const greedy = ctx.greedySample();
    assert.equal(greedy, argmax(logits));
    assert.match(ctx.tokenToText(greedy), /Paris| the| a/);
    const h = ctx.modelEntropy();
    assert.ok(Number.isFinite(h) && h > 0);
    assert.ok(Math.abs(ctx.modelEntropy('bits') - h / Math.LN2) < 1e-6);
    assert.ok(ctx.modelSurprisal(greedy) < ctx.modelSurprisal((greedy + 1) % ctx.vocabSize));
    assert.equal(ctx.kvSeqPosMax(0), tokens.length - 1);
    await ctx.kvCacheClear();
    assert.equal(ctx.kvSeqPosMax(0), -1);
  });

  it('rejects bad tokens and positions with clear errors and stays usable', async () => {
    await rejects(() => ctx.tokenToText(ctx.vocabSize), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(() => ctx.isStopToken(-1), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(() => ctx.tokenToText(1.5), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(() => ctx.decode([1, 2, 999999999], 0, 0), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(() => ctx.decode([1, 2], 0, 1), 'ERR_INVALID_ARG', /seqId/);
    await rejects(() => ctx.decode([], 0, 0), 'ERR_INVALID_ARG');
    await rejects(() => ctx.decode([2, 3], 5000, 0), 'ERR_INVALID_ARG');
    await rejects(() => ctx.detokenize(['a']), 'ERR_INVALID_ARG');
    await rejects(() => ctx.tokenize(42), 'ERR_INVALID_ARG');
    await rejects(() => ctx.modelEntropy('base10'), 'ERR_INVALID_ARG');
    // a gap after existing cells
    await ctx.decode([2, 818], 0, 0);
    await rejects(() => ctx.decode([5279], 7, 0), 'ERR_INVALID_ARG', /must start at 2/);
    await ctx.decode([5279], 2, 0);
    assert.equal(ctx.kvSeqPosMax(0), 2);
    await ctx.kvCacheClear();
  });
});

describe('createContext option validation', function () {
  const bad = [
    [{}, 'ERR_INVALID_ARG'],
    [{ modelPath: 42 }, 'ERR_INVALID_ARG'],
    [{ modelPath: '/nonexistent/model.gguf' }, 'ERR_MODEL_NOT_FOUND'],
    [{ modelPath: MODEL, nSeqMax: 0 }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, nSeqMax: 300 }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, nSeqMax: 2.5 }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, nCtx: 'big' }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, nCtx: -5 }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, nBatch: 0 }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, nThreads: Number.NaN }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, embeddings: 'yes' }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, logLevel: 'loud' }, 'ERR_INVALID_ARG'],
    [{ modelPath: MODEL, typeK: 'q5_1' }, 'ERR_INVALID_ARG', /typeK must be 'f16', 'q8_0' or 'q4_0'/],
    [{ modelPath: MODEL, typeV: 'F16' }, 'ERR_INVALID_ARG', /typeV must be/],
    [{ modelPath: MODEL, typeK: 8 }, 'ERR_INVALID_ARG', /typeK must be .* got number/],
    [{ modelPath: MODEL, flashAttention: true }, 'ERR_INVALID_ARG', /flashAttention must be 'auto', 'on' or 'off'/],
    [{ modelPath: MODEL, flashAttention: 'yes' }, 'ERR_INVALID_ARG', /flashAttention must be/],
    [
      { modelPath: MODEL, typeV: 'q8_0', flashAttention: 'off' },
      'ERR_INVALID_ARG',
      /typeV 'q8_0' needs flash attention.*flashAttention 'auto' or 'on', or typeV 'f16'/,
    ],
  ];
  for (const [options, code, message] of bad) {
    it(`rejects ${JSON.stringify(options).replace(MODEL, '<model>')} with ${code}`, async () => {
      await rejects(() => createContext(options), code, message);
    });
  }

  it('rejects a file that is not a GGUF model', async () => {
    const file = path.join(os.tmpdir(), `not-a-model-${process.pid}.gguf`);
    fs.writeFileSync(file, 'this is not a gguf file at all');
    try {
      await rejects(() => createContext({ modelPath: file }), 'ERR_MODEL_LOAD', /GGUF/);
    } finally {
      fs.unlinkSync(file);
    }
  });

  it('rejects a non-object', async () => {
    await rejects(() => createContext(null), 'ERR_INVALID_ARG');
    await rejects(() => createContext('model.gguf'), 'ERR_INVALID_ARG');
  });

  it('accepts file:// URLs', async () => {
    const ctx = await createContext({ modelPath: `file://${MODEL}`, nCtx: 256 });
    assert.equal(ctx.vocabSize, 262144);
    ctx.dispose();
  });
});

describe('KV cache types and flash attention', function () {
  this.timeout(120000);
  const PROMPT = 'The history of the printing press begins in the fifteenth century, when';
  const contexts = {};
  const make = (options) => createContext({ modelPath: MODEL, nCtx: 1024, nThreads: 2, ...options });
  before(async () => {
    contexts.f16 = await make({});
    contexts.q8_0 = await make({ typeK: 'q8_0', typeV: 'q8_0' });
    contexts.q4_0 = await make({ typeK: 'q4_0', typeV: 'q4_0' });
  });
  after(() => Object.values(contexts).forEach((c) => c.dispose()));

  /** Bytes of sequence 0's state (its KV cells) after decoding PROMPT; the sequence is cleared again. */
  async function stateBytes(ctx) {
    const tokens = await ctx.tokenize(PROMPT);
    await ctx.decode(tokens, 0, 0);
    const bytes = (await ctx.kvCacheSave(0)).length;
    await ctx.kvCacheClear();
    return bytes;
  }

  it('reports the resolved options: f16 and auto by default, a quantized V turns flash attention on', async () => {
    assert.deepEqual([contexts.f16.typeK, contexts.f16.typeV, contexts.f16.flashAttention], ['f16', 'f16', 'auto']);
    assert.deepEqual([contexts.q8_0.typeK, contexts.q8_0.typeV, contexts.q8_0.flashAttention], ['q8_0', 'q8_0', 'on']);
    const kOnly = await make({ typeK: 'q8_0', flashAttention: 'off' });
    try {
      assert.deepEqual([kOnly.typeK, kOnly.typeV, kOnly.flashAttention], ['q8_0', 'f16', 'off']);
      assert.ok(argmax(await greedyLogits(kOnly)) >= 0, 'a quantized K decodes without flash attention');
    } finally {
      kOnly.dispose();
    }
  });

  async function greedyLogits(ctx) {
    await ctx.decode(await ctx.tokenize(PROMPT), 0, 0);
    const logits = Float32Array.from(ctx.getLogits());
    await ctx.kvCacheClear();
    assert.ok(logits.every(Number.isFinite));
    return logits;
  }

  it('a q8_0 cache holds a sequence in fewer bytes than f16, q4_0 in fewer still', async () => {
    const f16 = await stateBytes(contexts.f16);
    const q8 = await stateBytes(contexts.q8_0);
    const q4 = await stateBytes(contexts.q4_0);
    // 16 bits a value, 8.5 (32 values + a 2-byte scale), 4.5; the state's headers are small.
    assert.ok(q8 < 0.6 * f16, `q8_0 ${q8} B vs f16 ${f16} B`);
    assert.ok(q4 < 0.6 * q8, `q4_0 ${q4} B vs q8_0 ${q8} B`);
  });

  it('a q8_0 context generates what f16 ranks first (teacher-forced, near-ties allowed)', async () => {
    const out = await greedy(contexts.q8_0, PROMPT, 24);
    assert.ok((await contexts.q8_0.detokenize(out)).trim().length > 0);
    const ranks = await greedyRanks(contexts.f16, await contexts.f16.tokenize(PROMPT), out);
    // Quantizing the cache perturbs the logits a little: a near-tie may flip, nothing more.
    assert.ok(ranks.filter((r) => r === 0).length >= 20, `ranks under f16: ${ranks}`);
    assert.ok(Math.max(...ranks) < 5, `ranks under f16: ${ranks}`);
  });

  it('a state saved from an f16 cache is refused by a q8_0 one with ERR_STATE, and the context stays usable', async () => {
    const tokens = await contexts.f16.tokenize(PROMPT);
    await contexts.f16.decode(tokens, 0, 0);
    const state = await contexts.f16.kvCacheSave(0);
    await contexts.f16.kvCacheClear();
    await rejects(() => contexts.q8_0.kvCacheLoad(0, state), 'ERR_STATE');
    assert.ok((await stateBytes(contexts.q8_0)) > 0);
  });
});

describe('dispose and sharing', function () {
  it('dispose is idempotent and every later call throws a clear error', async () => {
    const ctx = await open({ nCtx: 256 });
    ctx.dispose();
    ctx.dispose();
    assert.equal(ctx.disposed, true);
    throwsSync(() => ctx.vocabSize, 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => ctx.tokenToText(1), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => ctx.getLogits(), 'ERR_CONTEXT_DISPOSED');
    await rejects(() => ctx.tokenize('x'), 'ERR_CONTEXT_DISPOSED');
    await rejects(() => ctx.decode([2], 0, 0), 'ERR_CONTEXT_DISPOSED');
  });

  it('two contexts on one model work independently and deterministically', async () => {
    const [a, b] = await Promise.all([open({ nCtx: 256 }), open({ nCtx: 256 })]);
    try {
      const prompt = await a.tokenize('Count from one to five: one, two,');
      const run = async (ctx) => {
        await ctx.decode(prompt, 0, 0);
        const out = [];
        for (let i = 0; i < 6; i++) {
          const t = ctx.greedySample();
          out.push(t);
          await ctx.decode([t], prompt.length + i, 0);
        }
        return out;
      };
      const [ra, rb] = await Promise.all([run(a), run(b)]);
      assert.deepEqual(ra, rb, 'same path on two contexts must give the same greedy tokens');
      assert.match(await a.detokenize(ra), /three/);
    } finally {
      a.dispose();
      b.dispose();
    }
  });

  it('an operation queued before dispose settles with a clear error or completes', async () => {
    const ctx = await open({ nCtx: 512 });
    const tokens = await ctx.tokenize('word '.repeat(200));
    const inflight = ctx.decode(tokens, 0, 0);
    const queued = ctx.decode([2], tokens.length, 0);
    ctx.dispose();
    await inflight.then(
      () => {},
      (e) => assert.equal(e.code, 'ERR_CONTEXT_DISPOSED'),
    );
    await rejects(() => queued, 'ERR_CONTEXT_DISPOSED');
  });
});
