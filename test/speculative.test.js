'use strict';

// Speculative decoding through branches: BranchStore.commitDrafts (one decode verifies a draft),
// Branch.generate({ speculative }) with prompt lookup and with a draft model (the same 270M model
// as its own draft: high acceptance, a valid test of the machinery, not a speed-up). Greedy output
// with speculation is compared token by token with plain greedy output; CPU batch shapes may flip
// a near-tie, so a divergence must be one (top-2 margin under MARGIN).

const assert = require('node:assert/strict');
const { Branch, BranchStore, DraftModel, PromptLookup } = require('..');
const { MODEL, open, rejects, throwsSync, greedyRanks } = require('./helpers');

/** Top-2 logit margin under which a greedy divergence counts as a batch-shape tie. */
const MARGIN = 0.5;

const STORY =
  'The old lighthouse stood at the edge of the cliff for more than two hundred years. Every night its keeper climbed the narrow stairs, trimmed the wick and polished the great lens until it shone. Ships passing in the dark relied on its steady beam to avoid the rocks below.';
const COPY_PROMPT = `Original text:\n${STORY}\n\nCorrected copy (typos fixed, otherwise identical):\nThe old lighthouse stood at the edge of the cliff for`;

describe('speculative decoding through branches', function () {
  this.timeout(300000);
  let ctx;
  let store;
  let prompt;

  before(async () => {
    ctx = await open({ nCtx: 2048, nSeqMax: 8 });
    store = new BranchStore(ctx);
    prompt = await ctx.tokenize(COPY_PROMPT);
  });

  after(() => ctx && ctx.dispose());

  async function started(params = { temperature: 0 }) {
    const b = Branch.create(ctx, 0, params);
    await b.prefill(prompt);
    return b;
  }

  /** Greedy tokens of a plain one-branch loop. */
  async function plainGreedy(n) {
    const b = await started();
    try {
      return (await b.generate({ maxTokens: n })).tokens;
    } finally {
      await b.prune();
    }
  }

  /** Equal, or the first divergence is a near-tie of plain decoding (top-2 margin < MARGIN). */
  async function assertGreedyAgrees(got, want) {
    let i = 0;
    while (i < want.length && got[i] === want[i]) i++;
    if (i === want.length) return assert.equal(got.length, want.length);
    const b = await started();
    try {
      if (i > 0) await b.prefill(want.slice(0, i));
      const logits = b.getLogits();
      const sorted = [logits[want[i]], logits[got[i]]];
      assert.ok(
        Math.abs(sorted[0] - sorted[1]) < MARGIN,
        `diverged at ${i} of ${want.length}: ${got[i]} vs ${want[i]} with logits ${sorted}`,
      );
    } finally {
      await b.prune();
    }
  }

  it('greedy with prompt lookup gives plain greedy output, with most drafts accepted on a copy', async () => {
    const want = await plainGreedy(60);
    const b = await started();
    const seen = [];
    const r = await b.generate({
      maxTokens: 60,
      history: prompt,
      // A fixed draft length: the step count asserted below depends on it, and adaptive lengths
      // follow measured step times (machine load).
      speculative: { lookup: true, maxDraft: 6, adaptive: false },
      onToken: (t) => seen.push(t.token),
    });
    await assertGreedyAgrees(r.tokens, want);
    assert.deepEqual(seen, r.tokens, 'onToken saw every token in order');
    assert.equal(r.finishReason, 'length');
    assert.ok(r.speculative.drafted > 20, `drafted ${r.speculative.drafted}`);
    assert.ok(r.speculative.accepted / r.speculative.drafted > 0.7, JSON.stringify(r.speculative));
    assert.ok(r.speculative.steps < 40, `60 tokens in ${r.speculative.steps} decodes`);
    // The branch ends where plain generation ends: the last token accepted, not decoded.
    assert.equal(b.position, prompt.length + 59);
    assert.equal(ctx.kvSeqPosMax(b.seqId), prompt.length + 58);
    await b.prune();
  });

  it('greedy with a draft model (the same model) gives plain greedy output', async () => {
    const draftCtx = await open({ nCtx: 2048, nSeqMax: 4 });
    try {
      const want = await plainGreedy(40);
      const b = await started();
      const r = await b.generate({
        maxTokens: 40,
        history: prompt,
        speculative: { draft: new DraftModel(draftCtx, ctx), maxDraft: 4 },
      });
      await assertGreedyAgrees(r.tokens, want);
      assert.ok(r.speculative.accepted / r.speculative.drafted > 0.8, JSON.stringify(r.speculative));
      assert.equal(draftCtx.nSeqMax - new BranchStore(draftCtx).available, 0, 'the drafter freed its branches');
      await b.prune();
    } finally {
      draftCtx.dispose();
    }
  });

  it('a rejected draft leaves position, KV and perplexity as plain commits of the kept tokens', async () => {
    const a = await started();
    const b = await started();
    const t0 = a.produce().token;
    assert.equal(b.produce().token, t0);
    await a.commit(t0);
    const t1 = a.produce().token;
    const wrong = (t1 + 1) % ctx.vocabSize;
    const [v] = await store.commitDrafts([[b, t0, [t1, wrong, t1, t1]]]);
    assert.deepEqual(
      v.accepted.map((p) => p.token),
      [t1],
    );
    await a.commit(t1);
    assert.equal(b.position, a.position);
    assert.equal(ctx.kvSeqPosMax(b.seqId), ctx.kvSeqPosMax(a.seqId));
    // b's perplexity comes from the 5-row verify decode, a's from one-row commits: batch shapes
    // differ, so a tolerance (0.25 % seen); counting the rejected `wrong` token would move it by far more.
    assert.ok(Math.abs(b.perplexity - a.perplexity) < 1e-2 * a.perplexity, `${b.perplexity} vs ${a.perplexity}`);
    assert.equal(v.next.token, a.produce().token, 'next is what the branch samples there');
    assert.equal(typeof v.accepted[0].text, 'string');
    await a.prune();
    await b.prune();
  });

  it('a draft stays in its own branch: a sibling and the parent are untouched', async () => {
    const root = await started();
    const [x, y] = [root.fork(), root.fork()];
    const before = ctx.kvSeqPosMax(y.seqId);
    const t = x.produce().token;
    await store.commitDrafts([[x, t, [t, t, t]]]);
    assert.equal(ctx.kvSeqPosMax(y.seqId), before);
    assert.equal(y.position, root.position);
    assert.equal(ctx.kvSeqPosMax(root.seqId), before);
    assert.equal(x.position, ctx.kvSeqPosMax(x.seqId) + 1);
    await root.pruneSubtree();
  });

  it('sampling with a fixed seed is reproducible with speculation', async () => {
    const run = async () => {
      const b = await started({ temperature: 0.8, seed: 42 });
      try {
        // A fixed draft length: adaptive lengths follow measured step times, and a different
        // draft length is a different batch shape, whose logits differ in the last bits.
        return await b.generate({
          maxTokens: 40,
          history: prompt,
          speculative: { lookup: true, maxDraft: 4, adaptive: false },
        });
      } finally {
        await b.prune();
      }
    };
    const [r1, r2] = [await run(), await run()];
    assert.deepEqual(r1.tokens, r2.tokens);
    assert.deepEqual(r1.speculative, r2.speculative);
    assert.ok(r1.speculative.drafted > 0);
  });

  it('bad options, a foreign vocabulary and oversized drafts get coded errors', async () => {
    const b = await started();
    for (const maxDraft of [0, 33, 1.5, '4']) {
      await rejects(() => b.generate({ speculative: { lookup: true, maxDraft } }), 'ERR_INVALID_ARG', /maxDraft/);
    }
    await rejects(() => b.generate({ speculative: {} }), 'ERR_INVALID_ARG', /exactly one/);
    await rejects(() => b.generate({ speculative: { lookup: true, draft: ctx } }), 'ERR_INVALID_ARG');
    throwsSync(() => new PromptLookup({ ngramMin: 5, ngramMax: 2 }), 'ERR_INVALID_ARG');
    // No second GGUF with another tokenizer is available offline: the check runs against a
    // target that reports a different vocabulary size and different token text.
    const draft = new DraftModel(ctx);
    const foreign = { vocabSize: ctx.vocabSize - 1, tokenToText: (/** @type {number} */ t) => `<${t}>` };
    throwsSync(() => draft.checkVocabulary(/** @type {any} */ (foreign)), 'ERR_VOCAB_MISMATCH');
    const sameSize = { vocabSize: ctx.vocabSize, tokenToText: (/** @type {number} */ t) => `<${t}>` };
    throwsSync(() => draft.checkVocabulary(/** @type {any} */ (sameSize)), 'ERR_VOCAB_MISMATCH');
    draft.checkVocabulary(ctx); // the same model passes
    const t = b.produce().token;
    const position = b.position;
    await rejects(() => store.commitDrafts([[b, t, new Array(ctx.nOutputs).fill(t)]]), 'ERR_INVALID_ARG', /draft/);
    await rejects(() => store.commitDrafts([[b, t, [ctx.vocabSize]]]), 'ERR_TOKEN_OUT_OF_RANGE');
    await rejects(
      () =>
        store.commitDrafts([
          [b, t, [1]],
          [b, t, [2]],
        ]),
      'ERR_INVALID_ARG',
      /more than once/,
    );
    await rejects(() => store.commitDrafts([[b, t]]), 'ERR_INVALID_ARG');
    assert.equal(b.position, position, 'nothing was applied');
    await b.prune();
  });

  it('drafts are clamped to the rows one decode returns', async () => {
    const small = await open({ nCtx: 1024, nSeqMax: 1, nOutputs: 3 });
    try {
      const tokens = await small.tokenize(COPY_PROMPT);
      const b = Branch.create(small, 0, { temperature: 0 });
      await b.prefill(tokens);
      const r = await b.generate({
        maxTokens: 24,
        history: tokens,
        speculative: { lookup: true, maxDraft: 32, adaptive: false },
      });
      assert.equal(r.tokens.length, 24);
      assert.ok(r.speculative.drafted > 0 && r.speculative.drafted <= 2 * r.speculative.steps);
    } finally {
      small.dispose();
    }
  });

  it('a draft context disposed mid-generation fails the generation with a coded error', async () => {
    const draftCtx = await open({ nCtx: 2048, nSeqMax: 4 });
    const b = await started();
    let n = 0;
    const failed = await rejects(
      () =>
        b.generate({
          maxTokens: 40,
          history: prompt,
          speculative: { draft: draftCtx, maxDraft: 4 },
          onToken: () => {
            if (++n === 5) draftCtx.dispose();
          },
        }),
      'ERR_CONTEXT_DISPOSED',
    );
    assert.ok(failed);
    // The target branch is consistent and goes on without speculation.
    assert.equal(b.position, ctx.kvSeqPosMax(b.seqId) + 1);
    const r = await b.generate({ maxTokens: 3 });
    assert.equal(r.tokens.length, 3);
    await b.prune();
  });

  it('an abort during a speculative step rolls it back like any commit', async () => {
    const b = await started();
    const position = b.position;
    const ppl = b.perplexity;
    const t = b.produce().token;
    const controller = new AbortController();
    const pending = store.commitDrafts([[b, t, [t, t, t, t]]], { signal: controller.signal });
    controller.abort();
    await rejects(() => pending, 'ERR_ABORTED');
    assert.equal(b.position, position);
    assert.equal(ctx.kvSeqPosMax(b.seqId), position - 1);
    assert.ok(Object.is(b.perplexity, ppl) || b.perplexity === ppl);
    const aborted = new AbortController();
    aborted.abort();
    await rejects(
      () => b.generate({ maxTokens: 5, signal: aborted.signal, speculative: { lookup: true } }),
      'ERR_ABORTED',
    );
    await b.prune();
  });
});

describe('speculative decoding in the Scheduler and the server', function () {
  this.timeout(300000);
  const { Scheduler } = require('..');
  let ctx;

  before(async () => {
    ctx = await open({ nCtx: 4096, nSeqMax: 24, nOutputs: 40 });
  });

  after(() => ctx && ctx.dispose());

  /** Three copy prompts that differ in their first line, greedy, with and without speculation. */
  async function copies(options, request = {}) {
    const scheduler = new Scheduler(ctx, options);
    let steps = 0;
    const prompts = [1, 2, 3].map((i) => `Document ${i}.\n${COPY_PROMPT}`);
    try {
      const results = await Promise.all(
        prompts.map((prompt) => scheduler.generate({ prompt, maxTokens: 48, params: { temperature: 0 }, ...request })),
      );
      steps = scheduler.stats().steps;
      return { results, stats: scheduler.stats(), steps, prompts };
    } finally {
      await scheduler.close();
    }
  }

  it('requests speculate together in the step: greedy output as without, in fewer steps', async () => {
    const plain = await copies({});
    // A fixed draft length: the step count compared below depends on it (adaptive lengths
    // follow measured step times, i.e. machine load).
    const spec = await copies({ speculative: { lookup: true, maxDraft: 6, adaptive: false } });
    for (let i = 0; i < 3; i++) {
      const tokens = spec.results[i].choices[0].tokens;
      // The Scheduler's rows run in other batch shapes than a lone branch, so no exact equality:
      // every one of the 48 tokens is ranked under plain one-branch decoding, teacher-forced (as
      // the programs tests do): nearly all its argmax, none below a near-tie.
      const prompt = ctx.tokenizeSync(spec.prompts[i], true);
      const ranks = await greedyRanks(ctx, prompt, tokens);
      const top1 = ranks.filter((r) => r === 0).length;
      assert.ok(
        top1 >= Math.ceil(tokens.length * 0.8),
        `request ${i}: ${top1}/${tokens.length} top-1 (ranks ${ranks})`,
      );
      assert.ok(
        ranks.every((r) => r < 3),
        `request ${i}: ranks ${ranks}`,
      );
      assert.equal(spec.results[i].choices[0].finishReason, 'length');
      assert.equal(spec.results[i].choices[0].tokens.length, 48);
      const usage = spec.results[i].usage;
      assert.ok(usage.draftTokens > 0 && usage.acceptedDraftTokens > 0, JSON.stringify(usage));
      assert.equal(plain.results[i].usage.draftTokens, undefined);
    }
    assert.ok(spec.stats.acceptedDraftTokens > 30, JSON.stringify(spec.stats));
    assert.ok(spec.steps < plain.steps, `${spec.steps} steps with speculation vs ${plain.steps} without`);
  });

  it("a program's gen speculates as a request does: greedy output as without, drafts accepted", async () => {
    // A program line's gen is the same GenJob as a request's choice, so it drafts and verifies
    // in the scheduler's step whenever the scheduler speculates.
    const prompt = `Document 1.\n${COPY_PROMPT}`;
    const program = async (s) => {
      s.append(prompt);
      return s.gen({ maxTokens: 48, params: { temperature: 0 } });
    };
    const runOnce = async (options) => {
      const scheduler = new Scheduler(ctx, options);
      try {
        const result = await scheduler.run(program);
        return { result, stats: scheduler.stats() };
      } finally {
        await scheduler.close();
      }
    };
    const plain = await runOnce({});
    const spec = await runOnce({ speculative: { lookup: true, maxDraft: 6, adaptive: false } });
    assert.equal(plain.stats.draftTokens, 0);
    assert.ok(spec.stats.acceptedDraftTokens > 10, JSON.stringify(spec.stats));
    assert.ok(spec.stats.steps < plain.stats.steps, `${spec.stats.steps} steps vs ${plain.stats.steps}`);
    assert.equal(spec.result.tokens.length, 48);
    const ranks = await greedyRanks(ctx, ctx.tokenizeSync(prompt, true), spec.result.tokens);
    assert.ok(ranks.filter((r) => r === 0).length >= Math.ceil(48 * 0.8), `ranks ${ranks}`);
    assert.ok(
      ranks.every((r) => r < 3),
      `ranks ${ranks}`,
    );
  });

  it('stop strings, n choices and sampling work with speculation; logprobs requests do not speculate', async () => {
    const scheduler = new Scheduler(ctx, { speculative: { lookup: true, adaptive: false } });
    try {
      const stopped = await scheduler.generate({
        prompt: COPY_PROMPT,
        maxTokens: 64,
        params: { temperature: 0 },
        stop: ['stairs'],
      });
      assert.equal(stopped.choices[0].finishReason, 'stop');
      assert.ok(!stopped.choices[0].text.includes('stairs'));
      assert.match(stopped.choices[0].text, /keeper climbed the narrow $/);
      const seeded = { prompt: COPY_PROMPT, maxTokens: 24, n: 3, params: { temperature: 0.7 }, seed: 5 };
      const sampled = await scheduler.generate(seeded);
      assert.equal(sampled.choices.length, 3);
      for (const c of sampled.choices) assert.equal(c.tokens.length, 24);
      const again = await scheduler.generate(seeded);
      assert.deepEqual(
        again.choices.map((c) => c.tokens),
        sampled.choices.map((c) => c.tokens),
        'a fixed seed gives the same choices',
      );
      const withLogprobs = await scheduler.generate({
        prompt: COPY_PROMPT,
        maxTokens: 8,
        logprobs: 2,
        params: { temperature: 0 },
      });
      assert.equal(withLogprobs.usage.draftTokens, undefined);
      assert.equal(withLogprobs.choices[0].logprobs.length, 8);
    } finally {
      await scheduler.close();
    }
  });

  it('a draft model in the Scheduler; its disposal fails the requests that draft with a coded error', async () => {
    const draftCtx = await open({ nCtx: 4096, nSeqMax: 12 });
    // Fixed-length drafts: the same model as its own draft costs more than it saves, and adaptive
    // drafting would rightly stop drafting after the first request (docs/speculative.md).
    const scheduler = new Scheduler(ctx, { speculative: { draft: draftCtx, maxDraft: 4, adaptive: false } });
    try {
      const r = await scheduler.generate({ prompt: COPY_PROMPT, maxTokens: 24, params: { temperature: 0 } });
      assert.equal(r.choices[0].tokens.length, 24);
      assert.ok(r.usage.acceptedDraftTokens > 0, JSON.stringify(r.usage));
      const gen = scheduler.generate({ prompt: COPY_PROMPT, maxTokens: 200, params: { temperature: 0 } });
      let n = 0;
      const failed = await rejects(async () => {
        for await (const event of gen) if (event.token !== null && ++n === 3) draftCtx.dispose();
      }, 'ERR_CONTEXT_DISPOSED');
      assert.ok(failed);
      // The scheduler goes on for requests that do not need the draft model.
      const plain = await scheduler.generate({ prompt: COPY_PROMPT, maxTokens: 4, logprobs: 1 });
      assert.equal(plain.choices[0].tokens.length, 4);
    } finally {
      await scheduler.close();
      draftCtx.dispose();
    }
  });

  it('llama-branch serve --spec lookup: the official client sees accepted prediction tokens', async () => {
    const { default: OpenAI } = await import('openai');
    const { startServer, stopServer } = require('./serve-helpers');
    const server = await startServer(['--spec', 'lookup', '--spec-max-draft', '6', '--ctx-size', '2048']);
    try {
      const client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0 });
      const r = await client.completions.create({
        model: require('node:path')
          .basename(MODEL)
          .replace(/\.gguf$/, ''),
        prompt: COPY_PROMPT,
        max_tokens: 32,
        temperature: 0,
      });
      assert.equal(r.usage.completion_tokens, 32);
      const details = /** @type {any} */ (r.usage).completion_tokens_details;
      assert.ok(details.accepted_prediction_tokens > 10, JSON.stringify(r.usage));
      assert.ok(details.rejected_prediction_tokens >= 0);
      const metrics = await (await fetch(`${server.url}/metrics`)).text();
      const counter = (name) => Number(new RegExp(`^llamabranch_${name} (\\S+)$`, 'm').exec(metrics)[1]);
      assert.equal(counter('draft_tokens_accepted_total'), details.accepted_prediction_tokens);
      assert.equal(
        counter('draft_tokens_total'),
        details.accepted_prediction_tokens + details.rejected_prediction_tokens,
      );
      const bad = await startServer(['--spec', 'draft']).catch((e) => e);
      assert.match(String(bad.message), /modelDraft|model-draft/);
    } finally {
      await stopServer(server.child);
    }
  });
});
