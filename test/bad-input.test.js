'use strict';

// Table-driven bad-input suite: every row is one distinct bad call. Each must fail with the exact
// stable `code` and a message that says what is wrong, and must not crash the process or change
// state; after every group (and after the whole table) a normal generation proves the context
// is fully usable. To add rows for a new API member, append `[description, code, call, /msg/?]`
// to a group (or add a group); rows only exist for members that exist.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { createContext, Branch, BranchStore, jsonSchemaToGrammar, setLogLevel, withLogits } = require('..');
const { MODEL, open } = require('./helpers');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

const GREEDY = { temperature: 0 };
const PROMPT = 'The capital of France is';
const N_CTX = 512;
const N_SEQ = 4;

/** Shared state the rows use; filled in `before`. */
const env = {};

/** Messages must name the problem: no bare "undefined"/"[object Object]", long enough to explain. */
function assertActionable(err, pattern) {
  assert.ok(typeof err.message === 'string' && err.message.length >= 25, `message too short: "${err.message}"`);
  assert.doesNotMatch(err.message, /\[object Object\]|^undefined|^null/, `message: "${err.message}"`);
  if (pattern) assert.match(err.message, pattern);
}

async function expectFailure(call, code, pattern) {
  let result;
  let caught;
  try {
    result = call();
    if (result && typeof result.then === 'function') await result;
  } catch (e) {
    caught = e;
  }
  assert.ok(caught, `expected ${code}, but the call succeeded (returned ${String(result)})`);
  assert.ok(caught instanceof Error, `expected an Error, got ${caught}`);
  assert.equal(caught.code, code, `wrong code; message: ${caught.message}`);
  assertActionable(caught, pattern);
  return caught;
}

/** A normal generation: fork, a few batched greedy steps, KV consistent, fork pruned. */
async function assertGenerates() {
  const { ctx, store, root } = env;
  assert.equal(ctx.disposed, false);
  const child = root.fork();
  try {
    for (let i = 0; i < 3; i++) {
      const produced = store.produce([root, child]);
      await store.commit([
        [root, produced[0].token],
        [child, produced[1].token],
      ]);
    }
    for (const b of [root, child]) assert.equal(ctx.kvSeqPosMax(b.seqId), b.position - 1);
    assert.ok(Number.isFinite(root.perplexity));
    const text = await ctx.detokenize(await ctx.tokenize(PROMPT, false));
    assert.equal(text, PROMPT);
  } finally {
    await child.prune();
  }
  // keep the root short so every group has room in nCtx
  if (root.position > 64) {
    await root.prune();
    env.root = await newRoot();
  }
}

async function newRoot() {
  const root = Branch.create(env.ctx, 0, GREEDY);
  await root.prefill(await env.ctx.tokenize(PROMPT));
  return root;
}

/** A temporary branch for one row, pruned afterwards. */
async function withBranch(params, fn) {
  const b = Branch.create(env.ctx, 0, params);
  try {
    await b.prefill(await env.ctx.tokenize(PROMPT));
    return await fn(b);
  } finally {
    await b.prune();
  }
}

function tmpFile(name, bytes) {
  const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-bad-')), name);
  fs.writeFileSync(file, bytes);
  return file;
}

/** A copy of `bytes` with every `step`-th byte from `start` inverted. */
function flipBytes(bytes, start, step) {
  const out = Buffer.from(bytes);
  for (let i = start; i < out.length; i += step) out[i] ^= 0xff;
  return out;
}

const V = 262144; // Gemma 3 vocabulary (asserted in `before`)

const GROUPS = [
  {
    name: 'createContext options and model files',
    rows: [
      ['no options', 'ERR_INVALID_ARG', () => createContext(), /options/],
      ['options is a string', 'ERR_INVALID_ARG', () => createContext('model.gguf'), /options/],
      ['empty modelPath', 'ERR_INVALID_ARG', () => createContext({ modelPath: '' }), /modelPath/],
      ['modelPath is a number', 'ERR_INVALID_ARG', () => createContext({ modelPath: 7 }), /modelPath/],
      [
        'missing model file',
        'ERR_MODEL_NOT_FOUND',
        () => createContext({ modelPath: '/nonexistent/x.gguf' }),
        /nonexistent/,
      ],
      ['modelPath is a directory', 'ERR_MODEL_NOT_FOUND', () => createContext({ modelPath: os.tmpdir() })],
      [
        'not a GGUF file',
        'ERR_MODEL_LOAD',
        () => createContext({ modelPath: path.join(__dirname, '..', 'package.json') }),
        /GGUF/,
      ],
      [
        'GGUF magic followed by garbage',
        'ERR_MODEL_LOAD',
        () =>
          createContext({
            modelPath: tmpFile('garbage.gguf', Buffer.concat([Buffer.from('GGUF'), Buffer.alloc(4096, 0xab)])),
          }),
      ],
      [
        'truncated GGUF (first 2 MiB of the real model)',
        'ERR_MODEL_LOAD',
        () => {
          const fd = fs.openSync(MODEL, 'r');
          const head = Buffer.alloc(2 << 20);
          fs.readSync(fd, head, 0, head.length, 0);
          fs.closeSync(fd);
          return createContext({ modelPath: tmpFile('truncated.gguf', head) });
        },
      ],
      ['nCtx NaN', 'ERR_INVALID_ARG', () => createContext({ modelPath: MODEL, nCtx: NaN }), /nCtx/],
      ['nCtx Infinity', 'ERR_INVALID_ARG', () => createContext({ modelPath: MODEL, nCtx: Infinity }), /nCtx/],
      ['nBatch fractional', 'ERR_INVALID_ARG', () => createContext({ modelPath: MODEL, nBatch: 1.5 }), /nBatch/],
      ['nSeqMax above 256', 'ERR_INVALID_ARG', () => createContext({ modelPath: MODEL, nSeqMax: 257 }), /nSeqMax/],
      ['nThreads negative', 'ERR_INVALID_ARG', () => createContext({ modelPath: MODEL, nThreads: -1 }), /nThreads/],
      [
        'poolingType unknown',
        'ERR_INVALID_ARG',
        () => createContext({ modelPath: MODEL, poolingType: 9 }),
        /poolingType/,
      ],
      [
        'logLevel unknown',
        'ERR_INVALID_ARG',
        () => createContext({ modelPath: MODEL, logLevel: 'verbose' }),
        /logLevel/,
      ],
      ['useMmap not a boolean', 'ERR_INVALID_ARG', () => createContext({ modelPath: MODEL, useMmap: 'no' }), /useMmap/],
    ],
  },
  {
    name: 'tokenizer',
    rows: [
      ['tokenize(number)', 'ERR_INVALID_ARG', () => env.ctx.tokenize(42), /tokenize/],
      ['tokenizeSync(null)', 'ERR_INVALID_ARG', () => env.ctx.tokenizeSync(null), /tokenizeSync/],
      ['detokenize([-1])', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.detokenize([-1]), /vocabulary/],
      ['detokenize([vocabSize])', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.detokenize([V]), /262144/],
      ['detokenize([1.5])', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.detokenize([1.5]), /1\.5 is not an integer/],
      ['detokenize(string)', 'ERR_INVALID_ARG', () => env.ctx.detokenize('abc'), /detokenize/],
      ['tokenToText(NaN)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.tokenToText(NaN), /NaN/],
      ['isStopToken(vocabSize)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.isStopToken(V)],
    ],
  },
  {
    name: 'raw decode and KV calls',
    rows: [
      ['decode([])', 'ERR_INVALID_ARG', () => env.ctx.decode([], 0, 3), /at least one token/],
      ['decode at a negative position', 'ERR_INVALID_ARG', () => env.ctx.decode([1, 2], -1, 3), /position/],
      ['decode at a position beyond nCtx', 'ERR_INVALID_ARG', () => env.ctx.decode([1, 2], N_CTX + 1, 3), /position/],
      ['decode at Infinity', 'ERR_INVALID_ARG', () => env.ctx.decode([1], Infinity, 3), /position/],
      ['decode on seqId = nSeqMax', 'ERR_INVALID_ARG', () => env.ctx.decode([1, 2], 0, N_SEQ), /seqId.*nSeqMax/],
      ['decode on seqId -1', 'ERR_INVALID_ARG', () => env.ctx.decode([1, 2], 0, -1), /seqId/],
      ['decode on seqId 1.5', 'ERR_INVALID_ARG', () => env.ctx.decode([1, 2], 0, 1.5), /seqId/],
      [
        'decode a run longer than nCtx (oversized array)',
        'ERR_KV_FULL',
        () => env.ctx.decode(new Array(N_CTX + 1).fill(236761), 0, 3),
        /nCtx/,
      ],
      ['decode 100k tokens', 'ERR_KV_FULL', () => env.ctx.decode(new Array(100000).fill(236761), 0, 3), /nCtx/],
      ['decode a NaN token', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.decode([NaN], 0, 3), /not an integer/],
      ['decode a token id of 1e10', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.decode([1e10], 0, 3), /vocabulary/],
      ['decode(string tokens)', 'ERR_INVALID_ARG', () => env.ctx.decode('abc', 0, 3), /decode/],
      [
        'decode at a position that does not continue the sequence',
        'ERR_INVALID_ARG',
        async () => {
          await env.ctx.decode([10, 11, 12], 0, 3);
          try {
            await env.ctx.decode([13], 5, 3);
          } finally {
            await env.ctx.kvCacheRemove(3, -1, -1);
          }
        },
        /must start at 3/,
      ],
      [
        'decode into a sequence a branch leases',
        'ERR_INVALID_ARG',
        () => env.ctx.decode([1], env.root.position, env.root.seqId),
        /leased/,
      ],
      ['kvSeqPosMax(nSeqMax)', 'ERR_INVALID_ARG', () => env.ctx.kvSeqPosMax(N_SEQ), /seqId/],
      ['kvSeqPosMax("0")', 'ERR_INVALID_ARG', () => env.ctx.kvSeqPosMax('0'), /kvSeqPosMax/],
      [
        'kvCacheRemove on a leased sequence',
        'ERR_INVALID_ARG',
        () => env.ctx.kvCacheRemove(env.root.seqId, -1, -1),
        /leased/,
      ],
      ['kvCacheRemove with a fractional end', 'ERR_INVALID_ARG', () => env.ctx.kvCacheRemove(3, 0, 2.5), /end/],
      ['kvCacheRemove with start below -1', 'ERR_INVALID_ARG', () => env.ctx.kvCacheRemove(3, -7, -1), /start/],
      ['kvSeqCopy to seqId 99', 'ERR_INVALID_ARG', () => env.ctx.kvSeqCopy(3, 99), /seqId/],
      ['kvSeqCopy into a leased sequence', 'ERR_INVALID_ARG', () => env.ctx.kvSeqCopy(3, env.root.seqId), /leased/],
      ['kvCacheClear with live branches', 'ERR_INVALID_ARG', () => env.ctx.kvCacheClear(), /prune/],
      ['modelEntropy in decibels', 'ERR_INVALID_ARG', () => env.ctx.modelEntropy('decibels'), /nats/],
      [
        'modelEntropy of an empty logits buffer',
        'ERR_INVALID_ARG',
        () => env.ctx.modelEntropy('nats', new Float32Array(0)),
        /vocabSize/,
      ],
      [
        'modelSurprisal with a too-short logits buffer',
        'ERR_INVALID_ARG',
        () => env.ctx.modelSurprisal(5, 'nats', new Float32Array(3)),
        /vocabSize/,
      ],
      [
        'modelSurprisal with a plain array as logits',
        'ERR_INVALID_ARG',
        () => env.ctx.modelSurprisal(5, 'nats', [1, 2, 3]),
        /modelSurprisal/,
      ],
      ['modelSurprisal of token -5', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.modelSurprisal(-5)],
      ['withLogits with an async callback', 'ERR_INVALID_ARG', () => withLogits(env.ctx, async () => 1), /synchronous/],
    ],
  },
  {
    name: 'Branch.create and sampling parameters',
    rows: [
      ['Branch.create(null)', 'ERR_INVALID_ARG', () => Branch.create(null, 0), /SessionContext/],
      ['Branch.create on a plain object', 'ERR_INVALID_ARG', () => Branch.create({}, 0), /SessionContext/],
      ['Branch.create with a string position', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, 'zero'), /position/],
      [
        'Branch.create at position 5 on an empty sequence',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 5),
        /position must be 0/,
      ],
      ['Branch.create at position NaN', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, NaN), /position/],
      ['Branch.create on seqId = nSeqMax', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, N_SEQ, 0), /seqId/],
      [
        'Branch.create on a leased seqId',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, env.root.seqId, env.root.position),
        /already leased/,
      ],
      [
        'Branch.create with params as a string',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 0, 'greedy'),
        /SamplingParams/,
      ],
      ['temperature NaN', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, 0, { temperature: NaN }), /temperature/],
      ['topK negative', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, 0, { topK: -1 }), /topK/],
      ['topP above 1', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, 0, { topP: 2 }), /topP/],
      ['seed fractional', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, 0, { seed: 1.5 }), /seed/],
      [
        'penalties.lastN below -1',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 0, { penalties: { lastN: -5 } }),
        /lastN/,
      ],
      [
        'mirostat mode 3',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 0, { advanced: { mirostat: { mode: 3 } } }),
        /mirostat/,
      ],
      [
        'logitBias on token -1',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 0, { logitBias: [{ token: -1, bias: 1 }] }),
        /logitBias/,
      ],
      [
        'a GBNF grammar that does not parse',
        'ERR_GRAMMAR',
        () => Branch.create(env.ctx, 0, { grammar: 'root ::= (' }),
        /grammar/i,
      ],
      [
        'grammar argument not a string',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 0, undefined, undefined, 42),
        /grammar/,
      ],
      ['nBatch 0', 'ERR_INVALID_ARG', () => Branch.create(env.ctx, 0, undefined, 0), /nBatch/],
      [
        'nBatch above the context nBatch',
        'ERR_INVALID_ARG',
        () => Branch.create(env.ctx, 0, undefined, 100000),
        /nBatch/,
      ],
      [
        'create and fork beyond nSeqMax',
        'ERR_NO_FREE_SEQUENCE',
        () => {
          const forks = [];
          try {
            while (forks.length < N_SEQ) forks.push(env.root.fork());
          } finally {
            for (const f of forks) f.prune();
          }
        },
        /nSeqMax/,
      ],
    ],
  },
  {
    name: 'Branch methods on live branches',
    rows: [
      ['commit(-1)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.commit(-1), /vocabulary/],
      ['commit(vocabSize)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.commit(V), /vocabulary/],
      ['commit(1.5)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.commit(1.5), /1\.5 is not an integer/],
      ['commit(NaN)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.commit(NaN), /not an integer/],
      ['commit("a")', 'ERR_INVALID_ARG', () => env.root.commit('a'), /storeCommit|token/],
      ['prefill(string)', 'ERR_INVALID_ARG', () => env.root.prefill('abc'), /array/],
      ['prefill with a negative token', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.prefill([1, -2]), /vocabulary/],
      ['prefill of objects', 'ERR_INVALID_ARG', () => env.root.prefill([{}]), /branchPrefill/],
      [
        'prefill past nCtx (run longer than nBatch and the context)',
        'ERR_KV_FULL',
        () => env.root.prefill(new Array(N_CTX).fill(236761)),
        /nCtx/,
      ],
      ['decodeAndCaptureOne(-1)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.decodeAndCaptureOne(-1)],
      ['accept(-3)', 'ERR_TOKEN_OUT_OF_RANGE', () => env.root.accept(-3)],
      ['steer(string)', 'ERR_INVALID_ARG', () => env.root.steer('x'), /array/],
      ['steer with a NaN bias', 'ERR_INVALID_ARG', () => env.root.steer([{ token: 1, bias: NaN }]), /bias/],
      ['steer with a +Infinity bias', 'ERR_INVALID_ARG', () => env.root.steer([{ token: 1, bias: Infinity }]), /bias/],
      [
        'steer an out-of-vocabulary token',
        'ERR_INVALID_ARG',
        () => env.root.steer([{ token: 1e9, bias: 1 }]),
        /steer token/,
      ],
      ['steer without a bias', 'ERR_INVALID_ARG', () => env.root.steer([{ token: 1 }]), /branchSteer/],
      ['reseedSampler(-1)', 'ERR_INVALID_ARG', () => env.root.reseedSampler(-1), /seed/],
      ['reseedSampler(2^33)', 'ERR_INVALID_ARG', () => env.root.reseedSampler(2 ** 33), /seed/],
      ['setSamplerParams with minP -0.5', 'ERR_INVALID_ARG', () => env.root.setSamplerParams({ minP: -0.5 }), /minP/],
      [
        'setGrammar with an invalid GBNF',
        'ERR_GRAMMAR',
        () => env.root.setGrammar('root ::= "a" undefined-rule'),
        /grammar/i,
      ],
      ['setGrammar with a grammar lacking root', 'ERR_GRAMMAR', () => env.root.setGrammar('start ::= "a"'), /grammar/i],
      [
        'setGrammar with an invalid trigger regex',
        'ERR_GRAMMAR',
        () => env.root.setGrammar('root ::= "a"', { triggerPatterns: ['('] }),
        /trigger|grammar/i,
      ],
      [
        'setGrammar with a trigger token -1',
        'ERR_TOKEN_OUT_OF_RANGE',
        () => env.root.setGrammar('root ::= "a"', { triggerTokens: [-1] }),
      ],
      ['entropy("decibels")', 'ERR_INVALID_ARG', () => env.root.entropy('decibels'), /nats/],
      ['fork onto seqId 99', 'ERR_INVALID_ARG', () => env.root.fork(99), /seqId/],
      ['fork onto its own leased seqId', 'ERR_INVALID_ARG', () => env.root.fork(env.root.seqId), /already leased/],
      [
        'produce on a branch without logits',
        'ERR_NO_LOGITS',
        async () => {
          const fresh = Branch.create(env.ctx, 0);
          try {
            fresh.produce();
          } finally {
            await fresh.prune();
          }
        },
        /prefill/,
      ],
      [
        'getLogits on a branch without logits',
        'ERR_NO_LOGITS',
        async () => {
          const fresh = Branch.create(env.ctx, 0);
          try {
            fresh.getLogits();
          } finally {
            await fresh.prune();
          }
        },
      ],
      [
        'commit a token the grammar forbids',
        'ERR_GRAMMAR_REJECTED',
        () =>
          withBranch({ temperature: 0, grammar: 'root ::= " yes" | " no"' }, async (b) => {
            const [paris] = await env.ctx.tokenize(' Paris', false);
            await b.commit(paris);
          }),
        /grammar/,
      ],
      [
        'produce with every grammar-allowed token banned',
        'ERR_GRAMMAR',
        () =>
          withBranch({ temperature: 0, grammar: 'root ::= " yes"' }, async (b) => {
            // ban each token the grammar allows (" yes", " y", " ", ...) until none is left
            const banned = [];
            for (let i = 0; i < 64; i++) {
              banned.push({ token: b.produce().token, bias: -Infinity });
              b.steer(banned);
            }
          }),
        /masked/,
      ],
    ],
  },
  {
    name: 'disposed and stale branches',
    rows: [
      ['commit on a pruned branch', 'ERR_BRANCH_DISPOSED', () => env.pruned.commit(1), /live branch/],
      ['prefill on a pruned branch', 'ERR_BRANCH_DISPOSED', () => env.pruned.prefill([1])],
      ['produce on a pruned branch', 'ERR_BRANCH_DISPOSED', () => env.pruned.produce()],
      ['fork of a pruned branch', 'ERR_BRANCH_DISPOSED', () => env.pruned.fork()],
      ['position of a pruned branch', 'ERR_BRANCH_DISPOSED', () => env.pruned.position],
      ['getLogits of a destroyed branch', 'ERR_BRANCH_DISPOSED', () => env.destroyed.getLogits()],
      [
        'setGrammar on a branch released by retainOnly',
        'ERR_BRANCH_DISPOSED',
        () => env.released.setGrammar('root ::= "a"'),
      ],
      ['store.commit with a pruned branch', 'ERR_BRANCH_DISPOSED', () => env.store.commit([[env.pruned, 1]])],
      ['store.retainOnly(pruned)', 'ERR_BRANCH_DISPOSED', () => env.store.retainOnly(env.pruned)],
      [
        'native call with a stale handle whose slot was reused',
        'ERR_BRANCH_DISPOSED',
        async () => {
          const a = env.root.fork();
          const stale = a.handle;
          await a.prune();
          const b = env.root.fork();
          try {
            nativeOf(env.ctx)._branchPosition(stale);
          } finally {
            await b.prune();
          }
        },
      ],
      ['native call with handle -1', 'ERR_INVALID_ARG', () => nativeOf(env.ctx)._branchInfo(-1), /handle/],
      ['native call with handle 1.5', 'ERR_INVALID_ARG', () => nativeOf(env.ctx)._branchInfo(1.5), /handle/],
      [
        'native commit with handles and tokens of different lengths',
        'ERR_INVALID_ARG',
        () => nativeOf(env.ctx)._storeCommit([env.root.handle], [1, 2]),
        /same length/,
      ],
    ],
  },
  {
    name: 'BranchStore',
    rows: [
      ['new BranchStore({})', 'ERR_INVALID_ARG', () => new BranchStore({}), /SessionContext/],
      ['store.commit(string)', 'ERR_INVALID_ARG', () => env.store.commit('x'), /pairs/],
      ['store.commit entry not a pair', 'ERR_INVALID_ARG', () => env.store.commit([env.root]), /pair/],
      ['store.commit with a non-branch', 'ERR_INVALID_ARG', () => env.store.commit([[{}, 1]]), /Branch/],
      [
        'store.commit with the same branch twice',
        'ERR_INVALID_ARG',
        () =>
          env.store.commit([
            [env.root, 1],
            [env.root, 2],
          ]),
        /more than once/,
      ],
      [
        'store.prefill with the same branch twice',
        'ERR_INVALID_ARG',
        () =>
          env.store.prefill([
            [env.root, [1]],
            [env.root, [2]],
          ]),
        /more than once/,
      ],
      [
        'store.commit with a branch of another context',
        'ERR_FOREIGN_BRANCH',
        () => env.store.commit([[env.foreign, 1]]),
        /another context/,
      ],
      ['store.produce with a branch of another context', 'ERR_FOREIGN_BRANCH', () => env.store.produce([env.foreign])],
      ['store.retainOnly(branch of another context)', 'ERR_FOREIGN_BRANCH', () => env.store.retainOnly(env.foreign)],
      ['store.prefill with a non-array run', 'ERR_INVALID_ARG', () => env.store.prefill([[env.root, 'x']]), /array/],
      ['store.produce(string)', 'ERR_INVALID_ARG', () => env.store.produce('x'), /array/],
      ['store.commit of token -1', 'ERR_TOKEN_OUT_OF_RANGE', () => env.store.commit([[env.root, -1]])],
      [
        'store.prefill past nCtx',
        'ERR_KV_FULL',
        () => env.store.prefill([[env.root, new Array(N_CTX).fill(236761)]]),
        /nCtx/,
      ],
    ],
  },
  {
    name: 'grammars, schemas and global functions',
    rows: [
      ['jsonSchemaToGrammar of invalid JSON text', 'ERR_GRAMMAR', () => jsonSchemaToGrammar('{not json'), /schema/],
      [
        'jsonSchemaToGrammar of an unknown type',
        'ERR_GRAMMAR',
        () => jsonSchemaToGrammar({ type: 'nonsense' }),
        /schema/,
      ],
      ['jsonSchemaToGrammar(undefined)', 'ERR_INVALID_ARG', () => jsonSchemaToGrammar(undefined)],
      ['setLogLevel("loud")', 'ERR_INVALID_ARG', () => setLogLevel('loud'), /logLevel/],
    ],
  },
  {
    name: 'raw decode with capture, KV state buffers and files',
    rows: [
      [
        'kvCacheLoad of a garbage buffer',
        'ERR_STATE',
        () => env.ctx.kvCacheLoad(3, Buffer.from('garbage garbage garbage')),
        /kvCacheSave/,
      ],
      ['kvCacheLoad of an empty buffer', 'ERR_INVALID_ARG', () => env.ctx.kvCacheLoad(3, Buffer.alloc(0)), /empty/],
      [
        'kvCacheLoad of a truncated state',
        'ERR_STATE',
        () => env.ctx.kvCacheLoad(3, env.state.subarray(0, env.state.length >> 1)),
        /truncated|corrupt/,
      ],
      [
        'kvCacheLoad of a state with flipped bytes',
        'ERR_STATE',
        () => env.ctx.kvCacheLoad(3, flipBytes(env.state, 40, 97)),
        /corrupt/,
      ],
      ['kvCacheLoad of a string', 'ERR_INVALID_ARG', () => env.ctx.kvCacheLoad(3, 'abc'), /kvCacheLoad/],
      ['kvCacheLoad onto seqId 9', 'ERR_INVALID_ARG', () => env.ctx.kvCacheLoad(9, env.state), /seqId/],
      [
        'kvCacheLoad into a leased sequence',
        'ERR_INVALID_ARG',
        () => env.ctx.kvCacheLoad(env.root.seqId, env.state),
        /leased/,
      ],
      [
        'kvCacheReadFile of a missing file',
        'ERR_INVALID_ARG',
        () => env.ctx.kvCacheReadFile(3, '/nonexistent/state.bin'),
        /cannot open/,
      ],
      [
        'kvCacheReadFile of a JSON file',
        'ERR_STATE',
        () => env.ctx.kvCacheReadFile(3, path.join(__dirname, '..', 'package.json')),
        /magic/,
      ],
      [
        'kvCacheReadFile of a truncated state file',
        'ERR_STATE',
        () => env.ctx.kvCacheReadFile(3, tmpFile('trunc.bin', env.stateFile.subarray(0, env.stateFile.length >> 1))),
        /truncated|corrupt/,
      ],
      [
        'kvCacheReadFile of a corrupted state file',
        'ERR_STATE',
        () => env.ctx.kvCacheReadFile(3, tmpFile('flip.bin', flipBytes(env.stateFile, 64, 89))),
        /corrupt/,
      ],
      [
        'kvCacheReadFile of a directory',
        'ERR_INVALID_ARG',
        () => env.ctx.kvCacheReadFile(3, os.tmpdir()),
        /regular file/,
      ],
      [
        'kvCacheWriteFile into a missing directory',
        'ERR_INVALID_ARG',
        async () => {
          await env.ctx.decode([2, 5], 0, 3);
          try {
            await env.ctx.kvCacheWriteFile(3, '/nonexistent/dir/state.bin', [2, 5]);
          } finally {
            await env.ctx.kvCacheRemove(3, -1, -1);
          }
        },
        /cannot write/,
      ],
      [
        'kvCacheWriteFile of an empty sequence',
        'ERR_INVALID_ARG',
        () => env.ctx.kvCacheWriteFile(3, path.join(os.tmpdir(), 'llama-branch-empty.bin'), [2]),
        /empty/,
      ],
      [
        'kvCacheWriteFile with token -1',
        'ERR_TOKEN_OUT_OF_RANGE',
        () => env.ctx.kvCacheWriteFile(3, path.join(os.tmpdir(), 'llama-branch-bad.bin'), [-1]),
      ],
      ['kvCacheSave(99)', 'ERR_INVALID_ARG', () => env.ctx.kvCacheSave(99), /seqId/],
      ['kvSeqKeep(9)', 'ERR_INVALID_ARG', () => env.ctx.kvSeqKeep(9), /seqId/],
      ['kvSeqKeep while branches are live', 'ERR_INVALID_ARG', () => env.ctx.kvSeqKeep(3)],
      [
        'decodeAndCapture into a 10-float buffer',
        'ERR_INVALID_ARG',
        () => env.ctx.decodeAndCapture([5], 0, 3, new Float32Array(10)),
        /vocabSize/,
      ],
      [
        'decodeAndCapture into a plain array',
        'ERR_INVALID_ARG',
        () => env.ctx.decodeAndCapture([5], 0, 3, [1, 2]),
        /Float32Array/,
      ],
      [
        'decodeAndCapture into a 16-byte ArrayBuffer',
        'ERR_INVALID_ARG',
        () => env.ctx.decodeAndCapture([5], 0, 3, new ArrayBuffer(16)),
        /vocabSize/,
      ],
      [
        'decodeAndCapture of no tokens',
        'ERR_INVALID_ARG',
        () => env.ctx.decodeAndCapture([], 0, 3, new Float32Array(V)),
        /at least one token/,
      ],
      [
        'decodeAndCapture into a leased sequence',
        'ERR_INVALID_ARG',
        () => env.ctx.decodeAndCapture([5], env.root.position, env.root.seqId, new Float32Array(V)),
        /leased/,
      ],
      ['clearAndReseed of nothing', 'ERR_INVALID_ARG', () => env.ctx.clearAndReseed([], []), /at least one token/],
      ['clearAndReseed with live branches', 'ERR_INVALID_ARG', () => env.ctx.clearAndReseed([2], [5]), /live branch/],
      [
        'clearAndReseed of more tokens than nCtx',
        'ERR_KV_FULL',
        () => env.ctx.clearAndReseed(new Array(N_CTX + 1).fill(5), [6]),
        /nCtx/,
      ],
    ],
  },
  {
    name: 'chat templates and chat output',
    rows: [
      [
        'formatChat of truncated JSON text',
        'ERR_INVALID_ARG',
        () => env.ctx.formatChat('[{"role":"user","content":"x"}'),
        /not valid JSON/,
      ],
      ['formatChat(null)', 'ERR_INVALID_ARG', () => env.ctx.formatChat(null), /messages/],
      [
        'formatChat with numeric content',
        'ERR_INVALID_ARG',
        () => env.ctx.formatChat([{ role: 'user', content: 5 }]),
        /content/,
      ],
      [
        'formatChat with a numeric role',
        'ERR_INVALID_ARG',
        () => env.ctx.formatChat([{ role: 7, content: 'x' }]),
        /messages/,
      ],
      [
        'formatChat with numeric options',
        'ERR_INVALID_ARG',
        () => env.ctx.formatChat([{ role: 'user', content: 'x' }], 5),
        /formatChat/,
      ],
      [
        'formatChat with a numeric templateOverride',
        'ERR_INVALID_ARG',
        () => env.ctx.formatChat([{ role: 'user', content: 'x' }], { templateOverride: 42 }),
        /templateOverride/,
      ],
      [
        'formatChat with a template that does not parse',
        'ERR_CHAT_TEMPLATE',
        () => env.ctx.formatChat([{ role: 'user', content: 'x' }], { templateOverride: '{% for %}' }),
      ],
      [
        'formatChat with a template nested 100,000 levels deep',
        'ERR_CHAT_TEMPLATE',
        () =>
          env.ctx.formatChat([{ role: 'user', content: 'x' }], {
            templateOverride: `{{ ${'('.repeat(100000)}1${')'.repeat(100000)} }}`,
          }),
      ],
      [
        'formatChat with roles that do not alternate',
        'ERR_CHAT_TEMPLATE',
        () =>
          env.ctx.formatChat([
            { role: 'user', content: 'a' },
            { role: 'user', content: 'b' },
          ]),
        /alternate/,
      ],
      [
        'parseChatOutput of a number',
        'ERR_INVALID_ARG',
        () => env.ctx.parseChatOutput(42, env.chat.format),
        /parseChatOutput/,
      ],
      [
        'parseChatOutput with format "zero"',
        'ERR_INVALID_ARG',
        () => env.ctx.parseChatOutput('x', 'zero'),
        /parseChatOutput/,
      ],
      ['parseChatOutput with format -1', 'ERR_INVALID_ARG', () => env.ctx.parseChatOutput('x', -1)],
      [
        'parseChatOutput with a truncated parser definition',
        'ERR_INVALID_ARG',
        () =>
          env.ctx.parseChatOutput('x', env.chat.format, {
            parser: env.chat.parser.slice(0, env.chat.parser.length >> 1),
          }),
        /parser/,
      ],
      [
        'parseChatOutput with JSON that is not a parser',
        'ERR_INVALID_ARG',
        () => env.ctx.parseChatOutput('x', env.chat.format, { parser: '{"a":1}' }),
        /parser/,
      ],
      [
        'validateChatTemplate(null)',
        'ERR_INVALID_ARG',
        () => env.ctx.validateChatTemplate(null),
        /validateChatTemplate/,
      ],
    ],
  },
  {
    name: 'context sampling, grammar handles, perplexity trackers and embeddings',
    rows: [
      [
        'ctx.sample with a grammar',
        'ERR_INVALID_ARG',
        () => env.ctx.sample({ temperature: 0, grammar: 'root ::= "a"' }),
        /grammar/,
      ],
      [
        'ctx.sample with temperature NaN',
        'ERR_INVALID_ARG',
        () => env.ctx.sample({ temperature: Number.NaN }),
        /temperature/,
      ],
      ['ctx.sample with topP 2', 'ERR_INVALID_ARG', () => env.ctx.sample({ topP: 2 }), /topP/],
      ['ctx.sample(42)', 'ERR_INVALID_ARG', () => env.ctx.sample(42)],
      [
        'createSampler of an unclosed character class',
        'ERR_GRAMMAR',
        () => env.ctx.createSampler('root ::= ['),
        /grammar/i,
      ],
      ['createSampler(42)', 'ERR_INVALID_ARG', () => env.ctx.createSampler(42)],
      [
        'applySampler with a 100-float array',
        'ERR_INVALID_ARG',
        () => env.ctx.applySampler(env.grammarHandle, new Float32Array(100)),
        /vocabSize/,
      ],
      [
        'applySampler with a Float64Array',
        'ERR_INVALID_ARG',
        () => env.ctx.applySampler(env.grammarHandle, new Float64Array(V)),
        /Float32Array/,
      ],
      [
        'applySampler with an unknown handle',
        'ERR_INVALID_ARG',
        () => env.ctx.applySampler(0, new Float32Array(V)),
        /handle/,
      ],
      [
        'acceptSamplerToken of a token the grammar forbids',
        'ERR_GRAMMAR_REJECTED',
        () => env.ctx.acceptSamplerToken(env.grammarHandle, env.ctx.getEogToken()),
      ],
      [
        'acceptSamplerToken of token vocabSize',
        'ERR_TOKEN_OUT_OF_RANGE',
        () => env.ctx.acceptSamplerToken(env.grammarHandle, V),
      ],
      ['cloneSampler(1.5)', 'ERR_INVALID_ARG', () => env.ctx.cloneSampler(1.5)],
      [
        'freeSamplerHandle of a freed handle',
        'ERR_INVALID_ARG',
        () => env.ctx.freeSamplerHandle(env.freedGrammarHandle),
        /handle/,
      ],
      ['addSurprisal to an unknown tracker', 'ERR_INVALID_ARG', () => env.ctx.addSurprisal(12345, 1), /handle|tracker/],
      [
        'getPerplexity of a freed tracker',
        'ERR_INVALID_ARG',
        () => env.ctx.getPerplexity(env.freedTracker),
        /handle|tracker/,
      ],
      ['resetPerplexityTracker(-1)', 'ERR_INVALID_ARG', () => env.ctx.resetPerplexityTracker(-1)],
      [
        'modelEntropy with a 10-float row',
        'ERR_INVALID_ARG',
        () => env.ctx.modelEntropy('nats', new Float32Array(10)),
        /vocabSize/,
      ],
      ['modelEntropy in base10', 'ERR_INVALID_ARG', () => env.ctx.modelEntropy('base10'), /nats|bits/],
      ['modelSurprisal of token vocabSize', 'ERR_TOKEN_OUT_OF_RANGE', () => env.ctx.modelSurprisal(V, 'nats')],
      ['encode on a generative context', 'ERR_UNSUPPORTED', () => env.ctx.encode([2, 5]), /embeddings/],
      ['getEmbeddings on a generative context', 'ERR_UNSUPPORTED', () => env.ctx.getEmbeddings(), /embeddings/],
    ],
  },
  {
    name: 'cancellation options',
    rows: [
      ['branch.prefill with options 5', 'ERR_INVALID_ARG', () => env.root.prefill([5], 5), /options/],
      [
        'branch.commit with a string signal',
        'ERR_INVALID_ARG',
        () => env.root.commit(5, { signal: 'stop' }),
        /AbortSignal/,
      ],
      [
        'store.commit with options as an array',
        'ERR_INVALID_ARG',
        () => env.store.commit([[env.root, 5]], []),
        /options/,
      ],
      [
        'store.prefill with a plain-object signal',
        'ERR_INVALID_ARG',
        () => env.store.prefill([[env.root, [5]]], { signal: { aborted: true } }),
        /AbortSignal/,
      ],
      [
        'ctx.decode with an already-aborted signal',
        'ERR_ABORTED',
        () => env.ctx.decode([2, 5], 0, 3, { signal: AbortSignal.abort() }),
        /aborted/,
      ],
      [
        'branch.decodeAndCaptureOne with an already-aborted signal',
        'ERR_ABORTED',
        () => env.root.decodeAndCaptureOne(5, { signal: AbortSignal.abort() }),
        /aborted/,
      ],
    ],
  },
  {
    name: 'calls after dispose()',
    rows: [
      ['tokenize on a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.tokenize('a'), /createContext/],
      ['decode on a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.decode([1], 0)],
      ['getLogits on a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.getLogits()],
      ['vocabSize of a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.vocabSize],
      ['kvCacheClear on a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.kvCacheClear()],
      ['Branch.create on a disposed context', 'ERR_CONTEXT_DISPOSED', () => Branch.create(env.disposed, 0)],
      ['new BranchStore on a disposed context', 'ERR_CONTEXT_DISPOSED', () => new BranchStore(env.disposed)],
      ['commit on a branch of a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.orphan.commit(1)],
      ['produce on a branch of a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.orphan.produce()],
      ['kvCacheSave on a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.kvCacheSave(0)],
      [
        'formatChat on a disposed context',
        'ERR_CONTEXT_DISPOSED',
        () => env.disposed.formatChat([{ role: 'user', content: 'x' }]),
      ],
      ['parseChatOutput on a disposed context', 'ERR_CONTEXT_DISPOSED', () => env.disposed.parseChatOutput('x', 0)],
    ],
  },
];

describe('bad-input suite', function () {
  before(async () => {
    env.ctx = await open({ nSeqMax: N_SEQ, nCtx: N_CTX, nBatch: 64 });
    assert.equal(env.ctx.vocabSize, V);
    env.store = new BranchStore(env.ctx);
    env.root = await newRoot();
    env.chat = await env.ctx.formatChat([{ role: 'user', content: 'hi' }]);
    // a valid sequence state (buffer and file) to corrupt
    await env.ctx.decode([2, 651, 6207, 529], 0, 3);
    env.state = await env.ctx.kvCacheSave(3);
    const stateFile = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-bad-')), 'state.bin');
    await env.ctx.kvCacheWriteFile(3, stateFile, [2, 651, 6207, 529]);
    env.stateFile = fs.readFileSync(stateFile);
    await env.ctx.kvCacheRemove(3, -1, -1);
    env.pruned = env.root.fork();
    await env.pruned.prune();
    const destroyed = env.root.fork();
    await env.ctx.kvCacheRemove(destroyed.destroy(), -1, -1);
    env.destroyed = destroyed;
    env.other = await open({ nSeqMax: 1, nCtx: 256 });
    env.foreign = Branch.create(env.other, 0, GREEDY);
    await env.foreign.prefill(await env.other.tokenize(PROMPT));
    env.disposed = await open({ nSeqMax: 1, nCtx: 256 });
    env.orphan = Branch.create(env.disposed, 0, GREEDY);
    await env.orphan.prefill(await env.disposed.tokenize(PROMPT));
    env.disposed.dispose();
    // a branch released by retainOnly, on its own context so that env.root is untouched
    // grammar handles and perplexity trackers: one live, one freed of each
    env.grammarHandle = env.ctx.createSampler('root ::= "yes" | "no"');
    env.freedGrammarHandle = env.ctx.createSampler('root ::= "a"');
    env.ctx.freeSamplerHandle(env.freedGrammarHandle);
    env.freedTracker = env.ctx.createPerplexityTracker();
    env.ctx.freePerplexityTracker(env.freedTracker);
    env.releasedCtx = await open({ nSeqMax: 2, nCtx: 256 });
    const winner = Branch.create(env.releasedCtx, 0, GREEDY);
    await winner.prefill([2, 10, 11]);
    env.released = winner.fork();
    await new BranchStore(env.releasedCtx).retainOnly(winner);
  });
  after(() => {
    for (const c of [env.ctx, env.other, env.releasedCtx]) if (c) c.dispose();
  });

  let tried = 0;
  for (const group of GROUPS) {
    describe(group.name, () => {
      for (const [what, code, call, pattern] of group.rows) {
        it(`${what} → ${code}`, async () => {
          tried++;
          await expectFailure(call, code, pattern);
        });
      }
      it('the context still generates normally after this group', assertGenerates);
    });
  }

  describe('after the whole table', () => {
    it('tried at least 60 distinct bad calls, then a normal generation works', async () => {
      const total = GROUPS.reduce((n, g) => n + g.rows.length, 0);
      const names = new Set(GROUPS.flatMap((g) => g.rows.map((r) => `${g.name}: ${r[0]}`)));
      assert.equal(names.size, total, 'row descriptions are distinct');
      assert.equal(tried, total, 'every row ran');
      assert.ok(total >= 60, `only ${total} bad calls`);
      console.log(`      ${total} distinct bad calls tried`);
      await assertGenerates();
      assert.equal(env.store.available, N_SEQ - 1, 'only the root holds a lease');
      assert.equal(env.store.kvPressure().cellsUsed, env.root.position, 'no stray KV cells');
    });
  });
});
