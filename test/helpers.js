'use strict';

const assert = require('node:assert/strict');
const path = require('node:path');
const { ensureModel } = require('../scripts/fetch-model');

// The Scheduler's KV safety net (evicting cached prefixes when a step needs cells admission did
// not leave free) throws under the tests instead of warning: a planning bug fails a test. Servers
// the tests spawn inherit it.
process.env.LLAMA_BRANCH_STRICT_KV ??= '1';
const { Branch, createContext } = require('..');

/** The real GGUF every test runs on (LLAMA_TEST_MODEL overrides the default Gemma 3 270M). */
const MODEL = process.env.LLAMA_TEST_MODEL ? path.resolve(process.env.LLAMA_TEST_MODEL) : ensureModel();

function open(options = {}) {
  return createContext({ modelPath: MODEL, nCtx: 1024, nThreads: 2, ...options });
}

/** Asserts that `fn` (sync or async) fails with a JS Error carrying `code`. */
async function rejects(fn, code, messagePart) {
  let caught;
  try {
    await fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught, `expected an error with code ${code}, but the call succeeded`);
  assert.ok(caught instanceof Error, `expected an Error instance, got ${caught}`);
  assert.equal(caught.code, code, `wrong code; message: ${caught.message}`);
  assert.ok(caught.message.length > 10, 'the message should say what to do');
  if (messagePart) assert.match(caught.message, messagePart);
  return caught;
}

function throwsSync(fn, code) {
  let caught;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught, `expected a synchronous throw with code ${code}`);
  assert.equal(caught.code, code, `wrong code; message: ${caught.message}`);
  return caught;
}

function argmax(a) {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

function topK(a, k) {
  return Array.from(a.keys())
    .sort((x, y) => a[y] - a[x])
    .slice(0, k);
}

/** Greedy continuation of `prompt` on a fresh branch of `ctx`: the `n` tokens (the branch is pruned). */
async function greedy(ctx, prompt, n) {
  const b = Branch.create(ctx, 0, { temperature: 0 });
  try {
    await b.prefill(await ctx.tokenize(prompt));
    const out = [];
    for (let i = 0; i < n; i++) {
      const t = b.produce().token;
      out.push(t);
      await b.commit(t);
    }
    return out;
  } finally {
    await b.prune();
  }
}

/**
 * Teacher-forced ranks: after `prompt` (tokens), for each of `tokens` in turn, its rank among
 * plain one-branch decoding's logits (0: the argmax), then it is decoded. A greedy output made
 * in another batch shape should be all (or nearly all) rank 0: llama.cpp on CPU is not
 * batch-invariant, so near-ties may flip.
 */
async function greedyRanks(ctx, prompt, tokens) {
  const b = Branch.create(ctx, 0, { temperature: 0 });
  try {
    await b.prefill(prompt);
    const ranks = [];
    for (const t of tokens) {
      const logits = b.getLogits();
      let rank = 0;
      for (let i = 0; i < logits.length; i++) if (logits[i] > logits[t]) rank++;
      ranks.push(rank);
      await b.commit(t);
    }
    return ranks;
  } finally {
    await b.prune();
  }
}

/** Cosine similarity of two vectors. */
function cosine(a, b) {
  let dot = 0;
  let na = 0;
  let nb = 0;
  for (let i = 0; i < a.length; i++) {
    dot += a[i] * b[i];
    na += a[i] * a[i];
    nb += b[i] * b[i];
  }
  return dot / Math.sqrt(na * nb);
}

/** `n` tokens of `b`, each sampled by its own chain and committed alone (one batch shape). */
async function continueFor(b, n) {
  const out = [];
  for (let i = 0; i < n; i++) {
    const { token } = b.produce();
    out.push(token);
    await b.commit(token);
  }
  return out;
}

module.exports = { MODEL, cosine, open, rejects, throwsSync, argmax, topK, greedy, greedyRanks, continueFor };
