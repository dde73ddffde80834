'use strict';

// Raw decoding, the zero-copy logits view, KV sequence operations and per-sequence state
// (js-api.md §3.2 scenarios 2, 3, 7, 14 and 15, plus state round trips and every documented error).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, BranchStore, withLogits } = require('..');
const { open, rejects, throwsSync, argmax } = require('./helpers');

/** True when `view` was revoked: its buffer is detached, so nothing stale can be read. */
function isRevoked(view) {
  return view.length === 0 && view.buffer.byteLength === 0 && view[0] === undefined;
}

function bitsEqual(a, b) {
  assert.equal(a.length, b.length);
  const ua = new Uint32Array(a.buffer, a.byteOffset, a.length);
  const ub = new Uint32Array(b.buffer, b.byteOffset, b.length);
  for (let i = 0; i < ua.length; i++) {
    if (ua[i] !== ub[i]) return false;
  }
  return true;
}

describe('raw decode, logits view, KV and state', function () {
  this.timeout(120000);
  let ctx;
  let tmp;

  before(async () => {
    ctx = await open({ nSeqMax: 4 });
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-raw-'));
  });
  after(() => {
    ctx?.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  });
  beforeEach(async () => {
    await ctx.kvCacheClear();
  });

  describe('core API (scenario 2)', () => {
    it('decodes and exposes a sane logits row, argmax and entropy', async () => {
      const tokens = await ctx.tokenize('Hello world');
      assert.ok(tokens.length > 0);
      assert.equal(typeof (await ctx.detokenize(tokens)), 'string');
      assert.equal(typeof ctx.tokenToText(tokens[0]), 'string');
      await ctx.decode(tokens, 0);
      const logits = ctx.getLogits();
      assert.ok(logits instanceof Float32Array);
      assert.equal(logits.length, ctx.vocabSize);
      assert.ok(
        logits.some((x) => x !== 0),
        'some logit is non-zero',
      );
      assert.ok(!logits.some((x) => Number.isNaN(x)), 'no NaN');
      const h = ctx.modelEntropy();
      assert.ok(Number.isFinite(h) && h >= 0);
      const g = ctx.greedySample();
      assert.ok(Number.isInteger(g) && g >= 0 && g < ctx.vocabSize);
      assert.equal(g, argmax(logits));
      assert.ok(ctx.isStopToken(ctx.getEogToken()));
    });

    it('memoises the view within a step: one shared buffer', async () => {
      await ctx.decode(await ctx.tokenize('Hello world'), 0);
      const a = ctx.getLogits();
      const b = ctx.getLogits();
      assert.equal(a.buffer, b.buffer);
      assert.equal(a[0], b[0]);
      b[1] = 12345;
      assert.equal(a[1], 12345);
    });

    it('is zero-copy: writes through the view steer greedySample, entropy and surprisal', async () => {
      await ctx.decode(await ctx.tokenize('The sky is'), 0);
      const view = ctx.getLogits();
      const before = ctx.greedySample();
      const target = before === 7 ? 8 : 7;
      view[target] = 1e6;
      assert.equal(ctx.greedySample(), target);
      assert.ok(ctx.modelEntropy() < 1e-3, 'the distribution collapsed on the written token');
      assert.ok(ctx.modelSurprisal(target) < 1e-3);
      view.fill(-Infinity);
      view[before] = 0;
      assert.equal(ctx.greedySample(), before);
    });

    it('withLogits passes the view and refuses asynchronous callbacks', async () => {
      await ctx.decode(await ctx.tokenize('Hello'), 0);
      const max = withLogits(ctx, (l) => {
        assert.equal(l.buffer, ctx.getLogits().buffer);
        return l.reduce((m, x) => (x > m ? x : m), -Infinity);
      });
      assert.ok(Number.isFinite(max));
      throwsSync(() => withLogits(ctx, async () => 1), 'ERR_INVALID_ARG');
      throwsSync(() => withLogits(ctx, () => ({ then() {} })), 'ERR_INVALID_ARG');
    });

    it('getLogits / greedySample before any decode throw ERR_NO_LOGITS', async () => {
      const fresh = await open();
      try {
        throwsSync(() => fresh.getLogits(), 'ERR_NO_LOGITS');
        throwsSync(() => fresh.greedySample(), 'ERR_NO_LOGITS');
      } finally {
        fresh.dispose();
      }
    });

    it('getLogits while an operation is pending waits for it and shows its logits', async () => {
      const tokens = await ctx.tokenize('Hello');
      const pending = ctx.decode(tokens, 0);
      const view = ctx.getLogits();
      assert.equal(ctx.kvSeqPosMax(0), tokens.length - 1, 'the queued decode ran first');
      assert.equal(view.length, ctx.vocabSize);
      const copy = Float32Array.from(view);
      await pending;
      assert.deepEqual(Array.from(ctx.getLogits().subarray(0, 64)), Array.from(copy.subarray(0, 64)));
    });
  });

  describe('raw decode errors', () => {
    it('rejects bad arguments with coded errors before decoding', async () => {
      await rejects(() => ctx.decode([], 0), 'ERR_INVALID_ARG');
      await rejects(() => ctx.decode([ctx.vocabSize], 0), 'ERR_TOKEN_OUT_OF_RANGE');
      await rejects(() => ctx.decode([1], -1), 'ERR_INVALID_ARG');
      await rejects(() => ctx.decode([1], 0, ctx.nSeqMax), 'ERR_INVALID_ARG');
      await rejects(() => ctx.decode([1], ctx.nCtx), 'ERR_KV_FULL');
      await ctx.decode([2, 3], 0);
      await rejects(() => ctx.decode([4], 5), 'ERR_INVALID_ARG', /must start at 2/);
    });

    it('rejects when llama_decode itself fails (no free KV cells) and cleans up', async () => {
      const small = await open({ nCtx: 64, nSeqMax: 2, nBatch: 64 });
      try {
        const fill = Array.from({ length: small.nCtx - 4 }, (_, i) => 1000 + i);
        await small.decode(fill, 0, 0);
        // Positions 0..9 are valid for sequence 1, but only 4 cells are free: llama_decode fails.
        await rejects(
          () =>
            small.decode(
              Array.from({ length: 10 }, (_, i) => 2000 + i),
              0,
              1,
            ),
          'ERR_KV_FULL',
        );
        assert.equal(small.kvSeqPosMax(1), -1, 'no half-written cells remain');
        assert.equal(small.kvSeqPosMax(0), fill.length - 1, 'the other sequence is intact');
      } finally {
        small.dispose();
      }
    });
  });

  describe('logits view revocation', () => {
    let prompt;
    before(async () => {
      prompt = await ctx.tokenize('Once upon a time');
    });

    /** Takes a view, starts `op`, and checks the view is revoked synchronously (at submit). */
    async function revokedBy(op) {
      const view = ctx.getLogits();
      assert.equal(view.length, ctx.vocabSize);
      const running = op();
      assert.ok(isRevoked(view), 'revoked before the operation runs');
      assert.throws(() => view.fill(0), TypeError, 'a detached view cannot be written either');
      await running;
      return view;
    }

    it('is revoked by raw decode, decodeAndCapture and clearAndReseed', async () => {
      await ctx.decode(prompt, 0);
      await revokedBy(() => ctx.decode([5], prompt.length));
      await revokedBy(() => ctx.decodeAndCapture([6], prompt.length + 1, 0, new Float32Array(ctx.vocabSize)));
      await revokedBy(() => ctx.clearAndReseed(prompt.slice(0, 1), prompt.slice(1)));
    });

    it('is revoked by kvCacheClear, kvCacheRemove, kvCacheLoad and kvCacheReadFile', async () => {
      await ctx.decode(prompt, 0);
      const state = await ctx.kvCacheSave(0);
      const file = path.join(tmp, 'revoke.bin');
      await ctx.kvCacheWriteFile(0, file, prompt);
      await revokedBy(() => ctx.kvCacheRemove(0, 2, -1));
      await revokedBy(() => ctx.kvCacheLoad(0, state));
      await revokedBy(() => ctx.kvCacheReadFile(1, file));
      await revokedBy(() => ctx.kvCacheClear());
    });

    it('is revoked by branch and store decodes', async () => {
      await ctx.decode(prompt, 0);
      await ctx.kvCacheRemove(0, -1, -1); // the logits stay; branches need empty sequences
      const root = Branch.create(ctx, 0, { temperature: 0 });
      const store = new BranchStore(ctx);
      try {
        await revokedBy(() => root.prefill(prompt));
        const child = root.fork();
        await revokedBy(() => root.commit(root.produce().token));
        await revokedBy(() =>
          store.commit([
            [root, root.produce().token],
            [child, child.produce().token],
          ]),
        );
        await revokedBy(() =>
          store.prefill([
            [root, [5, 6]],
            [child, [7]],
          ]),
        );
        await revokedBy(() => child.decodeAndCaptureOne(8));
      } finally {
        await root.pruneSubtree();
      }
    });

    it('is not revoked by tokenizer work, state saves or metadata-only KV calls', async () => {
      await ctx.decode(prompt, 0);
      const view = ctx.getLogits();
      const first = view[0];
      await ctx.tokenize('more text');
      await ctx.detokenize(prompt);
      await ctx.kvCacheSave(0);
      await ctx.kvCacheWriteFile(0, path.join(tmp, 'keep.bin'), prompt);
      ctx.kvSeqCopy(0, 1);
      ctx.kvSeqKeep(0);
      assert.equal(ctx.kvSeqPosMax(0), prompt.length - 1);
      assert.equal(view.length, ctx.vocabSize);
      assert.equal(view[0], first);
      assert.equal(ctx.getLogits().buffer, view.buffer);
    });

    it('is revoked by dispose', async () => {
      const own = await open();
      await own.decode(await own.tokenize('Hi'), 0);
      const view = own.getLogits();
      own.dispose();
      assert.ok(isRevoked(view));
    });

    it('a reachable view keeps its context alive through garbage collection', async function () {
      assert.equal(typeof global.gc, 'function', 'run mocha with --node-option expose-gc (.mocharc.json does)');
      const view = await (async () => {
        const own = await open();
        await own.decode(await own.tokenize('Hi there'), 0);
        return own.getLogits();
      })();
      const copy = Float32Array.from(view);
      for (let i = 0; i < 3; i++) {
        global.gc();
        await new Promise((resolve) => setImmediate(resolve));
      }
      assert.ok(bitsEqual(view, copy), 'the memory under the view was not freed');
      const owner = view.buffer.__llamaBranchContext; // the hidden link that pins the context
      assert.equal(owner.disposed, false);
      owner.dispose();
      assert.ok(isRevoked(view));
    });

    it('a fresh view after the decode shows the new logits', async () => {
      await ctx.decode(prompt, 0);
      const old = Float32Array.from(ctx.getLogits());
      await ctx.decode([ctx.greedySample()], prompt.length);
      const fresh = ctx.getLogits();
      assert.equal(fresh.length, ctx.vocabSize);
      assert.ok(!bitsEqual(old, fresh), 'the next position has a different distribution');
    });
  });

  describe('KV cache (scenario 3)', () => {
    it('kvCacheSize is the highest position; kvCacheClear empties it', async () => {
      const tokens = await ctx.tokenize('Test prompt');
      await ctx.decode(tokens, 0);
      assert.ok(ctx.kvCacheSize() >= 0);
      assert.equal(ctx.kvCacheSize(), tokens.length - 1);
      assert.equal(ctx.kvCacheSize(0), ctx.kvSeqPosMax(0));
      await ctx.kvCacheClear();
      assert.equal(ctx.kvCacheSize(), -1);
    });

    it('kvCacheRemove trims the tail so decoding can continue from there', async () => {
      const tokens = await ctx.tokenize('One two three four five');
      await ctx.decode(tokens, 0);
      await ctx.kvCacheRemove(0, 3, -1);
      assert.equal(ctx.kvSeqPosMax(0), 2);
      await ctx.decode(tokens.slice(3), 3);
      assert.equal(ctx.kvSeqPosMax(0), tokens.length - 1);
    });
  });

  describe('multi-sequence KV (scenario 7)', () => {
    it('kvSeqCopy shares a sequence, whole or by range', async () => {
      const tokens = await ctx.tokenize('The quick brown fox');
      await ctx.decode(tokens, 0, 0);
      const end = ctx.kvSeqPosMax(0);
      assert.ok(end >= 0);
      assert.equal(ctx.kvSeqPosMax(1), -1);
      ctx.kvSeqCopy(0, 1);
      assert.equal(ctx.kvSeqPosMax(1), end);
      assert.equal(ctx.kvSeqPosMax(0), end, 'the source is unchanged');
      ctx.kvSeqCopy(0, 2, 0, 2);
      assert.equal(ctx.kvSeqPosMax(2), 1, 'only positions [0, 2) were copied');
      ctx.kvSeqCopy(0, 2, -1, 3);
      assert.equal(ctx.kvSeqPosMax(2), 2, 'the destination was replaced, not extended');
      // A copied prefix can be extended.
      await ctx.decode([tokens[3]], 3, 2);
      assert.equal(ctx.kvSeqPosMax(2), 3);
    });

    it('a copy continues like the source', async () => {
      const tokens = await ctx.tokenize('The quick brown fox');
      await ctx.decode(tokens, 0, 0);
      const next = ctx.greedySample();
      ctx.kvSeqCopy(0, 1);
      const onCopy = new Float32Array(ctx.vocabSize);
      const onSource = new Float32Array(ctx.vocabSize);
      await ctx.decodeAndCapture([next], tokens.length, 1, onCopy);
      await ctx.decodeAndCapture([next], tokens.length, 0, onSource);
      // The two decodes write different cells, which CPU kernels need not sum bit-identically.
      assert.equal(argmax(onCopy), argmax(onSource));
    });

    it('kvSeqKeep drops every other sequence', async () => {
      const tokens = await ctx.tokenize('Alpha beta');
      await ctx.decode(tokens, 0, 0);
      ctx.kvSeqCopy(0, 1);
      await ctx.decode([5, 6, 7], 0, 2);
      ctx.kvSeqKeep(1);
      assert.equal(ctx.kvSeqPosMax(0), -1);
      assert.equal(ctx.kvSeqPosMax(2), -1);
      assert.equal(ctx.kvSeqPosMax(1), tokens.length - 1);
    });

    it('argument errors are coded', async () => {
      throwsSync(() => ctx.kvSeqCopy(0, 0), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.kvSeqCopy(0, ctx.nSeqMax), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.kvSeqCopy(0, 1, 3, 3), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.kvSeqCopy(0, 1, 1.5), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.kvSeqKeep(-1), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.kvSeqPosMax(ctx.nSeqMax), 'ERR_INVALID_ARG');
      await rejects(() => ctx.kvCacheRemove(ctx.nSeqMax, 0, -1), 'ERR_INVALID_ARG');
    });
  });

  describe('leased sequences', () => {
    it('raw writes to a leased sequence are refused; reads work', async () => {
      const prompt = await ctx.tokenize('Leased prompt');
      const root = Branch.create(ctx, 0, { temperature: 0 });
      try {
        await root.prefill(prompt);
        const seq = root.seqId;
        const other = (seq + 1) % ctx.nSeqMax;
        const state = await ctx.kvCacheSave(seq);
        assert.ok(state.length > 0, 'saving a leased sequence is a read');
        const file = path.join(tmp, 'leased.bin');
        assert.ok((await ctx.kvCacheWriteFile(seq, file, prompt)) > 0);
        assert.equal(ctx.kvSeqPosMax(seq), prompt.length - 1);
        await rejects(() => ctx.decode([5], prompt.length, seq), 'ERR_INVALID_ARG', /leased/);
        await rejects(
          () => ctx.decodeAndCapture([5], prompt.length, seq, new Float32Array(ctx.vocabSize)),
          'ERR_INVALID_ARG',
          /leased/,
        );
        await rejects(() => ctx.kvCacheRemove(seq, 0, -1), 'ERR_INVALID_ARG', /leased/);
        await rejects(() => ctx.kvCacheLoad(seq, state), 'ERR_INVALID_ARG', /leased/);
        await rejects(() => ctx.kvCacheReadFile(seq, file), 'ERR_INVALID_ARG', /leased/);
        throwsSync(() => ctx.kvSeqCopy(other, seq), 'ERR_INVALID_ARG');
        await rejects(() => ctx.kvCacheClear(), 'ERR_INVALID_ARG', /live branch/);
        await rejects(() => ctx.clearAndReseed([1], []), 'ERR_INVALID_ARG', /live branch/);
        // Copying out of the branch and keeping the branch's own sequence are fine.
        ctx.kvSeqCopy(seq, other);
        assert.equal(ctx.kvSeqPosMax(other), prompt.length - 1);
        ctx.kvSeqKeep(seq);
        assert.equal(ctx.kvSeqPosMax(other), -1);
        assert.equal(root.position, prompt.length, 'the branch is untouched');
        // kvSeqKeep on any other sequence would delete the branch's KV.
        throwsSync(() => ctx.kvSeqKeep(other), 'ERR_INVALID_ARG');
        assert.equal(ctx.kvSeqPosMax(seq), prompt.length - 1);
      } finally {
        await root.prune();
      }
    });
  });

  describe('clearAndReseed', () => {
    it('rebuilds sequence 0 from sinks + tail and continues after them', async () => {
      const sinks = await ctx.tokenize('System:', true);
      const tail = await ctx.tokenize(' the last words', false);
      await ctx.decode([5, 6, 7], 0, 1);
      await ctx.clearAndReseed(sinks, tail);
      assert.equal(ctx.kvSeqPosMax(1), -1, 'every sequence was cleared');
      assert.equal(ctx.kvSeqPosMax(0), sinks.length + tail.length - 1);
      const next = ctx.greedySample();
      await ctx.decode([next], sinks.length + tail.length);
      // The same tokens decoded plainly give the same top token (different batch shapes: top-1 only).
      const direct = new Float32Array(ctx.vocabSize);
      await ctx.kvCacheClear();
      await ctx.decodeAndCapture([...sinks, ...tail], 0, 0, direct);
      assert.equal(argmax(direct), next);
      await ctx.clearAndReseed([], tail);
      assert.equal(ctx.kvSeqPosMax(0), tail.length - 1);
    });

    it('rejects empty input and oversize input before clearing', async () => {
      await ctx.decode([5, 6], 0);
      await rejects(() => ctx.clearAndReseed([], []), 'ERR_INVALID_ARG');
      await rejects(() => ctx.clearAndReseed(new Array(ctx.nCtx).fill(5), [6]), 'ERR_KV_FULL');
      await rejects(() => ctx.clearAndReseed([ctx.vocabSize], []), 'ERR_TOKEN_OUT_OF_RANGE');
      assert.equal(ctx.kvSeqPosMax(0), 1, 'nothing was cleared');
    });
  });

  describe('decodeAndCapture (scenario 15)', () => {
    it('copies the logits into dest (an independent copy)', async () => {
      const tokens = await ctx.tokenize('Hello');
      const buf = new Float32Array(ctx.vocabSize);
      await ctx.decodeAndCapture(tokens, 0, 0, buf);
      assert.ok(buf.some((x) => x !== 0));
      assert.ok(!buf.some((x) => Number.isNaN(x)));
      const view = ctx.getLogits();
      assert.ok(bitsEqual(buf, view), 'the copy equals the context row');
      const original = view[0];
      buf[0] = -999;
      assert.equal(ctx.getLogits()[0], original);
    });

    it('accepts an ArrayBuffer and larger buffers', async () => {
      const tokens = await ctx.tokenize('Hello');
      const ab = new ArrayBuffer(ctx.vocabSize * 4 + 16);
      await ctx.decodeAndCapture(tokens, 0, 0, ab);
      const row = new Float32Array(ab, 0, ctx.vocabSize);
      assert.ok(bitsEqual(row, ctx.getLogits()));
      assert.equal(new Float32Array(ab)[ctx.vocabSize], 0, 'nothing written past vocabSize');
    });

    it('checks dest before decoding', async () => {
      const tokens = await ctx.tokenize('Hello');
      await rejects(
        () => ctx.decodeAndCapture(tokens, 0, 0, new Float32Array(ctx.vocabSize - 1)),
        'ERR_INVALID_ARG',
        /vocabSize/,
      );
      await rejects(() => ctx.decodeAndCapture(tokens, 0, 0, new ArrayBuffer(16)), 'ERR_INVALID_ARG', /vocabSize/);
      await rejects(() => ctx.decodeAndCapture(tokens, 0, 0, new Float64Array(ctx.vocabSize)), 'ERR_INVALID_ARG');
      await rejects(() => ctx.decodeAndCapture(tokens, 0, 0, []), 'ERR_INVALID_ARG');
      await rejects(() => ctx.decodeAndCapture(tokens, 0, 0), 'ERR_INVALID_ARG');
      assert.equal(ctx.kvSeqPosMax(0), -1, 'nothing was decoded');
      await rejects(() => ctx.decodeAndCapture([], 0, 0, new Float32Array(ctx.vocabSize)), 'ERR_INVALID_ARG');
    });
  });

  describe('state save / load', () => {
    /** Decodes `prompt` into seq 0 of the cleared context, then one `next` token: its logits. */
    async function nextLogits(prompt, next) {
      const out = new Float32Array(ctx.vocabSize);
      await ctx.decodeAndCapture([next], prompt.length, 0, out);
      return out;
    }

    it('kvCacheSave + kvCacheLoad restore bit-identical next-token logits', async () => {
      const prompt = await ctx.tokenize('The capital of France is');
      await ctx.decode(prompt, 0);
      const state = await ctx.kvCacheSave(0);
      assert.ok(Buffer.isBuffer(state) && state.length > 0);
      const next = ctx.greedySample();
      const original = await nextLogits(prompt, next);

      // Path 1: clear everything, load, decode the same single token at the same place.
      await ctx.kvCacheClear();
      await ctx.kvCacheLoad(0, state);
      assert.equal(ctx.kvSeqPosMax(0), prompt.length - 1);
      assert.ok(bitsEqual(await nextLogits(prompt, next), original));

      // Path 2: decode more tokens, then load over them.
      await ctx.decode([5, 6, 7], prompt.length + 1);
      await ctx.kvCacheLoad(0, state);
      assert.equal(ctx.kvSeqPosMax(0), prompt.length - 1);
      assert.ok(bitsEqual(await nextLogits(prompt, next), original));

      // Loading into another sequence (a Uint8Array works too) gives the same continuation.
      await ctx.kvCacheClear();
      await ctx.kvCacheLoad(2, new Uint8Array(state));
      const other = new Float32Array(ctx.vocabSize);
      await ctx.decodeAndCapture([next], prompt.length, 2, other);
      assert.ok(bitsEqual(other, original));
    });

    it('kvCacheWriteFile + kvCacheReadFile round trip the state and the tokens', async () => {
      const prompt = await ctx.tokenize('Water boils at');
      await ctx.decode(prompt, 0);
      const next = ctx.greedySample();
      const file = path.join(tmp, 'seq0.bin');
      const written = await ctx.kvCacheWriteFile(0, file, prompt);
      assert.equal(written, fs.statSync(file).size);
      // llama.cpp's sequence state file layout: 'ggsq', version 4, token count, tokens, state.
      const bytes = fs.readFileSync(file);
      assert.equal(bytes.readUInt32LE(0), 0x67677371);
      assert.equal(bytes.readUInt32LE(4), 4);
      assert.equal(bytes.readUInt32LE(8), prompt.length);
      assert.equal(bytes.readInt32LE(12), prompt[0]);
      const original = await nextLogits(prompt, next);
      await ctx.kvCacheClear();
      const { tokens, bytesRead } = await ctx.kvCacheReadFile(0, file);
      assert.deepEqual(tokens, prompt);
      assert.equal(bytesRead, written);
      assert.equal(ctx.kvSeqPosMax(0), prompt.length - 1);
      assert.ok(bitsEqual(await nextLogits(prompt, next), original));
    });

    it('a state survives into a fresh context of the same model and settings', async () => {
      const prompt = await ctx.tokenize('Roses are red,');
      await ctx.decode(prompt, 0);
      const state = await ctx.kvCacheSave(0);
      const next = ctx.greedySample();
      const original = await nextLogits(prompt, next);
      const twin = await open({ nSeqMax: 4 });
      try {
        await twin.kvCacheLoad(0, state);
        const out = new Float32Array(twin.vocabSize);
        await twin.decodeAndCapture([next], prompt.length, 0, out);
        assert.ok(bitsEqual(out, original));
      } finally {
        twin.dispose();
      }
    });

    it('empty sequences, bad sequence ids and bad buffers are coded errors', async () => {
      await rejects(() => ctx.kvCacheSave(0), 'ERR_INVALID_ARG', /empty/);
      await rejects(() => ctx.kvCacheSave(ctx.nSeqMax), 'ERR_INVALID_ARG');
      await rejects(() => ctx.kvCacheWriteFile(0, path.join(tmp, 'empty.bin'), []), 'ERR_INVALID_ARG', /empty/);
      assert.ok(!fs.existsSync(path.join(tmp, 'empty.bin')));
      await rejects(() => ctx.kvCacheLoad(0, Buffer.alloc(0)), 'ERR_INVALID_ARG');
      await rejects(() => ctx.kvCacheLoad(0, 'not a buffer'), 'ERR_INVALID_ARG');
      await rejects(() => ctx.kvCacheLoad(0, Buffer.from('definitely not a state')), 'ERR_STATE');
      await rejects(() => ctx.kvCacheLoad(-1, Buffer.from('x')), 'ERR_INVALID_ARG');
    });

    it('truncated, extended or corrupted states are refused and leave the sequence as it was', async () => {
      const prompt = await ctx.tokenize('A truncated state');
      await ctx.decode(prompt, 0);
      const state = await ctx.kvCacheSave(0);
      const next = ctx.greedySample();
      const before = await nextLogits(prompt, next);
      await ctx.kvCacheRemove(0, prompt.length, -1);
      await ctx.decode([5, 6], 0, 1);
      const candidates = [
        state.subarray(0, 100),
        state.subarray(0, state.length - 1),
        Buffer.concat([state, Buffer.from([1, 2, 3])]),
        (() => {
          const b = Buffer.from(state);
          b.writeUInt32LE(7, 8);
          return b;
        })(), // stream count
        (() => {
          const b = Buffer.from(state);
          b.writeUInt32LE(1 << 30, 12);
          return b;
        })(), // cell count
        (() => {
          const b = Buffer.from(state);
          b.writeUInt32LE(3, 20);
          return b;
        })(), // n_seq_id of a cell
      ];
      for (const bad of candidates) {
        await rejects(() => ctx.kvCacheLoad(1, bad), 'ERR_STATE');
        assert.equal(ctx.kvSeqPosMax(1), 1, 'the destination kept its cells');
      }
      assert.equal(ctx.kvSeqPosMax(0), prompt.length - 1);
      const after = await nextLogits(prompt, next);
      assert.equal(argmax(after), argmax(before), 'sequence 0 still continues the same way');
    });

    it('missing, foreign, truncated and corrupt files are coded errors', async () => {
      const prompt = await ctx.tokenize('File errors');
      await ctx.decode(prompt, 0);
      const good = path.join(tmp, 'good.bin');
      await ctx.kvCacheWriteFile(0, good, prompt);
      const bytes = fs.readFileSync(good);
      const write = (name, data) => {
        const p = path.join(tmp, name);
        fs.writeFileSync(p, data);
        return p;
      };
      await rejects(() => ctx.kvCacheReadFile(1, path.join(tmp, 'missing.bin')), 'ERR_INVALID_ARG', /cannot open/);
      await rejects(() => ctx.kvCacheReadFile(1, ''), 'ERR_INVALID_ARG');
      await rejects(() => ctx.kvCacheReadFile(1, tmp), 'ERR_INVALID_ARG');
      await rejects(
        () => ctx.kvCacheReadFile(1, write('text.bin', 'hello, this is not a state file')),
        'ERR_STATE',
        /magic/,
      );
      await rejects(() => ctx.kvCacheReadFile(1, write('short.bin', bytes.subarray(0, 6))), 'ERR_STATE');
      await rejects(() => ctx.kvCacheReadFile(1, write('cut.bin', bytes.subarray(0, bytes.length - 10))), 'ERR_STATE');
      const badVersion = Buffer.from(bytes);
      badVersion.writeUInt32LE(99, 4);
      await rejects(() => ctx.kvCacheReadFile(1, write('version.bin', badVersion)), 'ERR_STATE', /version/);
      const manyTokens = Buffer.from(bytes);
      manyTokens.writeUInt32LE(0xffffffff, 8);
      await rejects(() => ctx.kvCacheReadFile(1, write('tokens.bin', manyTokens)), 'ERR_STATE');
      const badToken = Buffer.from(bytes);
      badToken.writeInt32LE(ctx.vocabSize + 5, 12);
      await rejects(() => ctx.kvCacheReadFile(1, write('token.bin', badToken)), 'ERR_STATE', /vocabulary/);
      assert.equal(ctx.kvSeqPosMax(1), -1, 'nothing was loaded');
      await rejects(
        () => ctx.kvCacheWriteFile(0, path.join(tmp, 'no', 'such', 'dir.bin'), prompt),
        'ERR_INVALID_ARG',
        /cannot write/,
      );
      await rejects(() => ctx.kvCacheWriteFile(0, '', prompt), 'ERR_INVALID_ARG');
      await rejects(() => ctx.kvCacheWriteFile(0, good, [ctx.vocabSize]), 'ERR_TOKEN_OUT_OF_RANGE');
      await rejects(() => ctx.kvCacheWriteFile(0, good, new Array(ctx.nCtx + 1).fill(1)), 'ERR_INVALID_ARG');
      // The good file still loads after all that.
      const { tokens } = await ctx.kvCacheReadFile(1, good);
      assert.deepEqual(tokens, prompt);
    });
  });

  describe('determinism (scenario 14)', () => {
    it('two fresh contexts produce the same 20 greedy tokens', async function () {
      this.timeout(600000); // 42 single-token decodes: slow on a loaded 2-core machine
      async function run() {
        const c = await open({ nThreads: 1 });
        try {
          const prompt = await c.tokenize('Count from 1 to 5.');
          await c.decode(prompt, 0);
          const out = [];
          for (let i = 0; i < 20; i++) {
            const t = c.greedySample();
            out.push(t);
            await c.decode([t], prompt.length + i);
          }
          return out;
        } finally {
          c.dispose();
        }
      }
      const a = await run();
      const b = await run();
      assert.equal(a.length, 20);
      assert.deepEqual(a, b);
    });
  });

  describe('after dispose', () => {
    it('every new member rejects or throws ERR_CONTEXT_DISPOSED', async () => {
      const own = await open();
      own.dispose();
      throwsSync(() => own.getLogits(), 'ERR_CONTEXT_DISPOSED');
      throwsSync(() => own.kvSeqKeep(0), 'ERR_CONTEXT_DISPOSED');
      await rejects(() => own.kvCacheSave(0), 'ERR_CONTEXT_DISPOSED');
      await rejects(
        () => own.kvCacheLoad(0, Buffer.from([0xd8, 0x3c, 0x14, 0xaf, 0, 0, 0, 0])),
        'ERR_CONTEXT_DISPOSED',
      );
      await rejects(() => own.clearAndReseed([1], []), 'ERR_CONTEXT_DISPOSED');
      await rejects(() => own.kvCacheWriteFile(0, path.join(tmp, 'x.bin'), []), 'ERR_CONTEXT_DISPOSED');
      await rejects(() => own.kvCacheReadFile(0, path.join(tmp, 'x.bin')), 'ERR_CONTEXT_DISPOSED');
    });
  });
});
