'use strict';

// Typed decisions (scheduler.decide, line.decide, line.logprobs) on the real model: the answers'
// shapes and invariants (never their quality: the default model is a small base model), that the
// state is decoded once however many questions there are, and coded errors for bad input.

const assert = require('node:assert/strict');
const { Scheduler } = require('..');
const { open, rejects } = require('./helpers');

const TICKET = {
  ticket: {
    from: 'dana@example.com',
    subject: 'Charged twice',
    body: 'I was charged twice for my subscription this month. Please refund one of the payments.',
  },
};

const QUESTIONS = {
  billing: { type: 'noul', instructions: 'Is this ticket about billing?' },
  team: {
    type: 'choice',
    instructions: 'Which team should handle this ticket?',
    criteria: { billing: 'Payments, invoices, refunds', technical: 'Bugs, errors, outages', sales: null },
  },
  urgency: { type: 'score', instructions: 'How urgent is this ticket?', criteria: ['low', 'medium', 'high'] },
};

const sum = (xs) => xs.reduce((a, b) => a + b, 0);

/** Every invariant of one answer to `question`. */
function checkAnswer(question, answer) {
  assert.equal(answer.type, question.type);
  if (question.type === 'noul') {
    assert.deepEqual(Object.keys(answer).sort(), ['noul', 'type']);
    assert.ok(answer.noul >= 0 && answer.noul <= 1, `noul ${answer.noul}`);
    return;
  }
  const names = question.type === 'choice' ? Object.keys(question.criteria) : question.criteria;
  assert.deepEqual(Object.keys(answer.probabilities), names);
  const p = names.map((n) => answer.probabilities[n]);
  for (const x of p) assert.ok(x >= 0 && x <= 1, `probability ${x}`);
  assert.ok(Math.abs(sum(p) - 1) < 1e-9, `probabilities sum to ${sum(p)}`);
  const n = p.length;
  assert.ok(Math.abs(answer.confidence - (Math.max(...p) - 1 / n) / (1 - 1 / n)) < 1e-9);
  if (question.type === 'choice') {
    assert.equal(answer.probabilities[answer.choice], Math.max(...p), 'the winner is the most likely option');
  } else {
    assert.deepEqual(answer.legend, Object.fromEntries(names.map((l, i) => [String(i), l])));
    assert.ok(Math.abs(answer.score - sum(p.map((x, i) => i * x))) < 1e-9, 'score = Σ i·p(i)');
    assert.ok(answer.score >= 0 && answer.score <= n - 1);
  }
}

function checkResult(questions, result) {
  assert.deepEqual(Object.keys(result.answers), Object.keys(questions));
  for (const [name, q] of Object.entries(questions)) checkAnswer(q, result.answers[name]);
  assert.equal(result.usage.outputTokens, 0);
  assert.ok(result.usage.stateTokens > 0 && result.usage.inputTokens > result.usage.stateTokens);
  assert.ok(result.latencyMs > 0);
}

describe('decisions: scheduler.decide', function () {
  let ctx;
  let scheduler;
  before(async () => {
    ctx = await open({ nCtx: 4096, nSeqMax: 16 });
  });
  beforeEach(() => {
    scheduler = new Scheduler(ctx);
  });
  afterEach(() => scheduler.close());
  after(() => ctx.dispose());

  it('answers noul, choice and score in the protocol shapes (chat template, labels read from one row)', async () => {
    const result = await scheduler.decide({ state: TICKET, questions: QUESTIONS });
    checkResult(QUESTIONS, result);
  });

  it('raw template, option texts scored as a trie, and permute give the same shapes', async () => {
    for (const settings of [{ template: 'raw' }, { read: 'text' }, { permute: 3 }, { template: 'raw', permute: 2 }]) {
      const result = await scheduler.decide({ state: TICKET, questions: QUESTIONS, ...settings });
      checkResult(QUESTIONS, result);
    }
  });

  it("read: 'text' and 'label' both answer a choice, with probabilities that differ by reading", async () => {
    const q = { team: QUESTIONS.team };
    const byLabel = await scheduler.decide({ state: TICKET, questions: q, read: 'label' });
    const byText = await scheduler.decide({ state: TICKET, questions: q, read: 'text' });
    checkResult(q, byLabel);
    checkResult(q, byText);
    assert.notDeepEqual(byLabel.answers.team.probabilities, byText.answers.team.probabilities);
  });

  it('decodes the state once for eight questions, and its reads share steps with one question', async () => {
    const state = `Shift log.\n${Array.from({ length: 40 }, (_, i) => `Line ${i}: the pump in hall ${i % 7} was checked and its pressure noted as normal.`).join('\n')}`;
    const one = { q0: { type: 'noul', instructions: 'Was a pump checked?' } };
    const eight = {};
    for (let i = 0; i < 8; i++) {
      eight[`q${i}`] =
        i % 3 === 0
          ? { type: 'noul', instructions: `Is hall ${i} mentioned?` }
          : i % 3 === 1
            ? { type: 'choice', instructions: `What was checked in hall ${i}?`, criteria: { pump: null, door: null } }
            : { type: 'score', instructions: `How busy was hall ${i}?`, criteria: ['quiet', 'normal', 'busy'] };
    }
    const measure = async (questions, s, settings = {}) => {
      const before = s.stats();
      const result = await s.decide({ state, questions, ...settings });
      const after = s.stats();
      return { result, prefilled: after.prefilledTokens - before.prefilledTokens, steps: after.steps - before.steps };
    };
    const single = await measure(one, scheduler);
    const fresh = new Scheduler(ctx); // nothing cached: the state is decoded again
    try {
      const many = await measure(eight, fresh);
      checkResult(eight, many.result);
      const { stateTokens, inputTokens } = many.result.usage;
      assert.ok(stateTokens > 400, `state of ${stateTokens} tokens`);
      // What was decoded: the state once plus each question's own tokens (not 8 × the state).
      assert.equal(many.prefilled, inputTokens, `prefilled ${many.prefilled}, input ${inputTokens}`);
      assert.ok(inputTokens < stateTokens + 8 * 80);
      // The eight forks were prefilled and read in the steps one question takes, plus at most
      // one more prefill chunk for their texts.
      assert.ok(many.steps <= single.steps + 1, `8 questions: ${many.steps} steps, 1 question: ${single.steps}`);
    } finally {
      await fresh.close();
    }
    // The same decision again: the state and the question's fork (its text after the state)
    // are both prefix-cache entries now, logits included: nothing is decoded.
    const again = await measure(one, scheduler);
    assert.equal(again.prefilled, 0, `again: prefilled ${again.prefilled}`);
    assert.ok(Math.abs(again.result.answers.q0.noul - single.result.answers.q0.noul) < 1e-6);
    // Eight questions on the cached state decode only their own texts; asked again, nothing.
    // (Caching a fork takes a sequence nobody reserved: with 4 lines at once, this context's 16
    // leave one for every question; at the default half of nSeqMax, 8, two of them found none.)
    const narrow = { maxBranches: 4 };
    const eightOnCached = await measure(eight, scheduler, narrow);
    const own = eightOnCached.result.usage.inputTokens - eightOnCached.result.usage.stateTokens;
    assert.ok(eightOnCached.prefilled <= own, `prefilled ${eightOnCached.prefilled}, questions ${own}`);
    const eightAgain = await measure(eight, scheduler, narrow);
    assert.equal(eightAgain.prefilled, 0, `eight again: prefilled ${eightAgain.prefilled}`);
    // The reads come from the logits the first asking left in the cache: the same answers.
    assert.deepEqual(eightAgain.result.answers, eightOnCached.result.answers);
  });

  it('scores a choice of more options than letters through option texts, in chunks of the lines it may hold', async () => {
    const criteria = Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`category-${i}`, null]));
    const questions = { category: { type: 'choice', instructions: 'Which category fits?', criteria } };
    const result = await scheduler.decide({ state: 'A short note about a category.', questions, maxBranches: 8 });
    checkResult(questions, result);
  });

  it('refuses bad input with ERR_INVALID_ARG, a param and the protocol reason', async () => {
    const choice = (n) => ({
      type: 'choice',
      instructions: 'Pick one',
      criteria: Object.fromEntries(Array.from({ length: n }, (_, i) => [`o${i}`, null])),
    });
    const cases = [
      [{ state: 'x', questions: { a: { type: 'maybe', instructions: 'x' } } }, 'invalid_request', /type/],
      [{ state: 'x', questions: { a: choice(1) } }, 'invalid_request', /at least 2/],
      [{ state: 'x', questions: { a: choice(256) } }, 'too_many_options', /at most 255/],
      [
        {
          state: 'x',
          questions: {
            a: { type: 'score', instructions: 'x', criteria: Array.from({ length: 11 }, (_, i) => `l${i}`) },
          },
        },
        'too_many_options',
        /at most 10/,
      ],
      [{ state: 'x', questions: { 'bad name!': QUESTIONS.billing } }, 'invalid_request', /question name/],
      [{ state: 'x', questions: { ['n'.repeat(65)]: QUESTIONS.billing } }, 'invalid_request', /question name/],
      [{ state: 'x', questions: {} }, 'invalid_request', /at least one/],
      [{ state: 42, questions: QUESTIONS }, 'invalid_request', /state/],
      [{ state: 'word '.repeat(5000), questions: QUESTIONS }, 'state_too_long', /KV cells/],
      [{ state: 'x', questions: QUESTIONS, permute: 0 }, 'invalid_request', /permute/],
      [{ state: 'x', questions: QUESTIONS, template: 'jinja' }, 'invalid_request', /template/],
      [{ state: 'x', questions: QUESTIONS, colour: 'red' }, 'invalid_request', /unknown field/],
      [{ state: 'x', questions: { a: { ...QUESTIONS.billing, extra: 1 } } }, 'invalid_request', /unknown field/],
      [{ state: 'x', questions: { a: choice(30) }, read: 'label' }, 'invalid_request', /single tokens/],
      [
        { state: 'x', questions: { a: QUESTIONS.billing, b: QUESTIONS.team }, maxQuestions: 1 },
        'too_many_questions',
        /at most 1/,
      ],
      [
        { state: 'x', questions: { a: { type: 'score', instructions: 'x', criteria: ['a', 'a'] } } },
        'invalid_request',
        /distinct/,
      ],
      [{ state: 'x', questions: { a: { type: 'noul', instructions: '  ' } } }, 'invalid_request', /instructions/],
    ];
    for (const [request, reason, message] of cases) {
      const err = await rejects(() => scheduler.decide(request), 'ERR_INVALID_ARG', message);
      assert.equal(err.reason, reason, `${err.message}: reason ${err.reason}`);
    }
    await rejects(() => scheduler.decide(null), 'ERR_INVALID_ARG');
    // The scheduler still answers after all of that.
    checkResult({ b: QUESTIONS.billing }, await scheduler.decide({ state: 'x', questions: { b: QUESTIONS.billing } }));
  });
});

describe('decisions: inside a program (line.decide, line.logprobs)', function () {
  let ctx;
  let scheduler;
  before(async () => {
    ctx = await open({ nCtx: 2048, nSeqMax: 8 });
    scheduler = new Scheduler(ctx);
  });
  after(async () => {
    await scheduler.close();
    ctx.dispose();
  });

  it('line.logprobs reads several tokens from one row, as logprob reads each', async () => {
    const [yes, no, maybe] = [' yes', ' no', ' maybe'].map((t) => ctx.tokenizeSync(t, false)[0]);
    const { many, single } = await scheduler.run(async (s) => {
      s.append('Question: is the sky blue? Answer:');
      const many = await s.logprobs([yes, no, maybe]);
      const single = [];
      for (const t of [yes, no, maybe]) single.push((await s.logprob([t])).logprob);
      return { many, single };
    });
    assert.equal(many.length, 3);
    for (let i = 0; i < 3; i++) {
      assert.ok(many[i] < 0, `a log-probability: ${many[i]}`);
      assert.ok(Math.abs(many[i] - single[i]) < 1e-3, `${many[i]} vs ${single[i]}`);
    }
    await rejects(() => scheduler.run((s) => s.append('x').logprobs([])), 'ERR_INVALID_ARG');
    await rejects(() => scheduler.run((s) => s.append('x').logprobs([-1])), 'ERR_INVALID_ARG');
  });

  it('line.decide answers about the line so far and leaves the line as it was', async () => {
    const { answers, before, after } = await scheduler.run(async (s) => {
      s.append('Ticket: my invoice shows the wrong amount.');
      const before = s.tokens.length;
      const answers = await s.decide(QUESTIONS, { permute: 2 });
      return { answers, before, after: s.tokens.length };
    });
    assert.equal(after, before);
    for (const [name, q] of Object.entries(QUESTIONS)) checkAnswer(q, answers[name]);
    await rejects(
      () => scheduler.run((s) => s.append('x').decide(QUESTIONS, { template: 'chat' })),
      'ERR_INVALID_ARG',
      /unknown option/,
    );
  });
});

describe('decisions: promptCacheKey keeps the state warm', function () {
  let ctx;
  before(async () => {
    ctx = await open({ nCtx: 1024, nSeqMax: 8 });
  });
  after(() => ctx.dispose());

  it("a decision asked with a promptCacheKey keeps its state cached when an older one's would go first", async () => {
    const scheduler = new Scheduler(ctx);
    try {
      const state = (topic) =>
        `A report on ${topic}. ${`It notes each ${topic} event with its date and place. `.repeat(10)}`;
      const questions = [{ type: 'predicate', instructions: 'Is this a report?' }];
      const held = () => scheduler.cachedPrefixes().map((p) => p.tokens.join(','));
      // The key on the first (oldest) decision: without it, least recently used goes first.
      await scheduler.decide({ input: state('harbour'), questions, promptCacheKey: 'tenant-1' });
      const keyed = held();
      await scheduler.decide({ input: state('railway station'), questions });
      const plain = held().filter((k) => !keyed.includes(k));
      assert.ok(keyed.length > 0 && plain.length > 0, 'each state is cached');
      // A long unrelated prompt needs the cells of one of the two cached states.
      await scheduler.generate({
        prompt: `A log of the weather. ${'Rain in the morning, wind at noon. '.repeat(88)}`,
        maxTokens: 1,
      });
      assert.ok(scheduler.stats().evictions > 0, 'the prompt made the cache evict');
      const after = held();
      assert.ok(
        keyed.every((k) => after.includes(k)),
        'the keyed state is still cached',
      );
      assert.ok(!plain.some((k) => after.includes(k)), 'the unkeyed, more recent state went first');
    } finally {
      await scheduler.close();
    }
  });
});
