'use strict';

// Decisions' answers checked against an independent computation, not only their shapes: for
// each question the test writes the prompt itself (the state, the question as docs/decisions.md
// lays it out, in the chat template or raw), decodes it on a plain Branch of its own context,
// reads the teacher-forced log-probability of each option's label (or of each token of its text),
// and takes the softmax over the options, averaged over the `permute` shifts with each rotated
// label mapped back to its option. A swapped Yes/No, a shifted permutation or a wrong prefix
// moves a probability by far more than the tolerance.
//
// TOLERANCE: measured on gemma-3-270m q4_k_m on CPU (2 threads, a loaded machine). The scheduler
// decodes the same tokens in the same pieces but beside other sequences' rows (the questions'
// forks share decodes, option texts are scored as a trie of forks), and the quantized kernels'
// sums then differ: the largest difference measured over these cases was 3.7e-2 in two runs (text reading,
// a score's level of p 0.13; label reading stayed under 1.5e-2; the run prints its own largest).
// 0.05 is the bound; a swapped label or a shifted permutation moves the decisive answers here
// (team: 0.83 on one option) by far more, and one test checks that such a mistake would fail.
// Under `deterministic: true` (both contexts) the rows are the same bits on both sides: the last
// describe asserts agreement within 1e-9 (measured: 1.1e-16).

const assert = require('node:assert/strict');
const { Scheduler, Branch } = require('..');
const { open } = require('./helpers');

const TOLERANCE = 0.05;
// Under deterministic: true the logits are the same bits on both sides; what remains is float rounding.
const EXACT = 1e-9;
const LETTERS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ';

const STATE = 'Ticket: I was charged twice for my subscription this month. Please refund one of the payments.';
const QUESTIONS = {
  billing: { type: 'noul', instructions: 'Is this ticket about billing?' },
  team: {
    type: 'choice',
    instructions: 'Which team should handle this ticket?',
    criteria: { billing: 'Payments, invoices, refunds', technical: 'Bugs, errors, outages', sales: null },
  },
  urgency: { type: 'score', instructions: 'How urgent is this ticket?', criteria: ['low', 'medium', 'high'] },
};

/** The question's options as the protocol orders them: noul true/false, a choice's names, a score's levels. */
function optionsOf(q) {
  if (q.type === 'noul') return [{ name: 'true' }, { name: 'false' }];
  if (q.type === 'choice') return Object.entries(q.criteria).map(([name, description]) => ({ name, description }));
  return q.criteria.map((name) => ({ name }));
}

/**
 * The question's text under `shift` (docs/decisions.md) and what each option is read by there:
 * its label (label reading) or its text (text reading), in option order.
 */
function questionOf(q, shift, reading, unmapped = false) {
  const options = optionsOf(q);
  const n = options.length;
  const order = options.map((_, p) => (p + shift) % n); // display position → option
  const lines = [`Question: ${q.instructions}`];
  const line = (head, o) => (o.description ? `${head}: ${o.description}` : head);
  if (q.type === 'noul') {
    lines.push(`Answer ${order.map((i) => (i === 0 ? 'Yes' : 'No')).join(' or ')}.`);
    return { text: lines.join('\n'), reads: ['Yes', 'No'] };
  }
  lines.push(q.type === 'score' ? 'Levels:' : 'Options:');
  if (reading === 'label') {
    const reads = new Array(n);
    order.forEach((i, p) => {
      const label = q.type === 'score' ? String(i) : LETTERS[p];
      reads[unmapped ? p : i] = unmapped ? LETTERS[p] : label; // unmapped: the mistake of reading letters as if unshifted
      lines.push(line(`${label}. ${options[i].name}`, options[i]));
    });
    lines.push(
      q.type === 'score' ? 'Answer with the number of the level.' : 'Answer with the letter of the best option.',
    );
    return { text: lines.join('\n'), reads };
  }
  for (const i of order) lines.push(line(`- ${options[i].name}`, options[i]));
  lines.push(`Answer with the ${q.type === 'score' ? 'level' : 'option'} exactly as written.`);
  return { text: lines.join('\n'), reads: options.map((o) => (q.type === 'noul' ? null : o.name)) };
}

const softmax = (xs) => {
  const m = Math.max(...xs);
  const e = xs.map((x) => Math.exp(x - m));
  const s = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / s);
};

/** Sum of the teacher-forced log-probabilities of `tokens` after what `from` holds (one fork of it). */
async function textLogprob(from, tokens) {
  const b = from.fork();
  try {
    let sum = 0;
    for (let i = 0; i < tokens.length; i++) {
      sum += b.logprob(tokens[i]).logprob;
      if (i < tokens.length - 1) await b.decodeAndCaptureOne(tokens[i]);
    }
    return sum;
  } finally {
    await b.prune();
  }
}

/**
 * The prompt of `q` under `shift`, split where the question starts: `head` (the state, with the
 * template's opening) and `rest` (the question and what opens the answer), both as tokens.
 */
function promptOf(ctx, text, template) {
  if (template === 'raw')
    return { head: ctx.tokenizeSync(`${STATE}\n\n`, true), rest: ctx.tokenizeSync(`${text}\nAnswer:`, false) };
  const prompt = ctx.formatChatSync([{ role: 'user', content: `${STATE}\n\n${text}` }]).prompt;
  const at = prompt.indexOf(text);
  return { head: ctx.tokenizeSync(prompt.slice(0, at), true), rest: ctx.tokenizeSync(prompt.slice(at), false) };
}

/**
 * Each option's probability for `q`, computed on plain branches of `ctx`. The prompt is decoded
 * in the pieces the scheduler decodes it in (the state once; a fork of it one token back, then
 * that token and the question), so that only the batches' other rows differ.
 */
async function independent(ctx, q, { template, reading, permute, unmapped = false }) {
  const n = optionsOf(q).length;
  const runs = [];
  for (let shift = 0; shift < Math.min(permute, n); shift++) {
    const { text, reads } = questionOf(q, shift, reading, unmapped);
    const { head, rest } = promptOf(ctx, text, template);
    const prefix = template === 'chat' ? '' : ' ';
    const root = Branch.create(ctx, 0, { temperature: 0 });
    try {
      await root.prefill(head);
      const question = root.forkAt(head.length - 1);
      try {
        await question.prefill([head[head.length - 1], ...rest]);
        const scores = [];
        for (const r of reads) scores.push(await textLogprob(question, ctx.tokenizeSync(prefix + r, false)));
        runs.push(softmax(scores));
      } finally {
        await question.prune();
      }
    } finally {
      await root.prune();
    }
  }
  return runs[0].map((_, i) => runs.reduce((s, r) => s + r[i], 0) / runs.length);
}

/** Whether every label of `q` (after the space of a raw prompt) is one distinct token. */
function labelsAreTokens(ctx, q, template) {
  const prefix = template === 'chat' ? '' : ' ';
  const { reads } = questionOf(q, 0, 'label');
  const ids = reads.map((r) => ctx.tokenizeSync(prefix + r, false));
  return ids.every((t) => t.length === 1) && new Set(ids.map((t) => t[0])).size === ids.length;
}

/** The library's probabilities of `answer` in option order. */
function probabilitiesOf(q, answer) {
  if (q.type === 'noul') return [answer.noul, 1 - answer.noul];
  return optionsOf(q).map((o) => answer.probabilities[o.name]);
}

/**
 * Asks `scheduler` every question in case `c` and checks each option's probability against the
 * independent computation on `plain`: every difference below `bound`. Returns the largest.
 */
async function compareWithIndependent(scheduler, plain, c, bound) {
  const { answers } = await scheduler.decide({
    state: STATE,
    questions: QUESTIONS,
    template: c.template,
    read: c.reading,
    permute: c.permute,
  });
  let largest = 0;
  for (const [name, q] of Object.entries(QUESTIONS)) {
    const reading = c.reading !== 'auto' ? c.reading : labelsAreTokens(plain, q, c.template) ? 'label' : 'text';
    const expected = await independent(plain, q, { ...c, reading });
    const got = probabilitiesOf(q, answers[name]);
    expected.forEach((p, i) => {
      const diff = Math.abs(p - got[i]);
      largest = Math.max(largest, diff);
      assert.ok(diff < bound, `${name} option ${i}: library ${got[i]}, independent ${p} (${JSON.stringify(c)})`);
    });
  }
  return largest;
}

describe('decisions: answers checked against an independent computation', function () {
  let ctx;
  let plain;
  let scheduler;
  let worst = 0;
  before(async () => {
    ctx = await open({ nCtx: 4096, nSeqMax: 16 });
    plain = await open({ nCtx: 1024, nSeqMax: 4 });
    scheduler = new Scheduler(ctx);
  });
  after(async () => {
    await scheduler.close();
    ctx.dispose();
    plain.dispose();
    console.log(`      largest difference from the independent computation: ${worst.toExponential(2)}`);
  });

  const cases = [
    { template: 'chat', reading: 'label', permute: 1 },
    // Raw, a score's digits after a space are not single tokens for this model: 'auto' reads its
    // levels as texts and the rest by label, and so does the check (labelsAreTokens).
    { template: 'raw', reading: 'auto', permute: 1 },
    { template: 'chat', reading: 'text', permute: 1 },
    { template: 'raw', reading: 'text', permute: 1 },
    { template: 'chat', reading: 'label', permute: 3 },
    { template: 'raw', reading: 'text', permute: 2 },
  ];
  for (const c of cases) {
    it(`${c.template} template, ${c.reading} reading, permute ${c.permute}`, async () => {
      worst = Math.max(worst, await compareWithIndependent(scheduler, plain, c, TOLERANCE));
    });
  }

  it('would catch a permutation whose rotated labels are not mapped back (the check can fail)', async () => {
    const c = { template: 'chat', reading: 'label', permute: 3 };
    const { answers } = await scheduler.decide({
      state: STATE,
      questions: { team: QUESTIONS.team },
      read: 'label',
      permute: 3,
    });
    const got = probabilitiesOf(QUESTIONS.team, answers.team);
    const wrong = await independent(plain, QUESTIONS.team, { ...c, unmapped: true });
    const off = Math.max(...wrong.map((p, i) => Math.abs(p - got[i])));
    assert.ok(off > TOLERANCE, `a wrong mapping is only ${off} away: the tolerance could not tell`);
  });

  it('the OpenAI shape gives the same probabilities as the System One shape for the same questions', async () => {
    const sys = await scheduler.decide({ state: STATE, questions: QUESTIONS });
    const oa = await scheduler.decide({
      input: STATE,
      questions: [
        { type: 'predicate', instructions: QUESTIONS.billing.instructions },
        {
          type: 'choice',
          instructions: QUESTIONS.team.instructions,
          choices: Object.entries(QUESTIONS.team.criteria).map(([value, d]) =>
            d ? { value, description: d } : { value },
          ),
        },
        {
          type: 'score',
          instructions: QUESTIONS.urgency.instructions,
          levels: QUESTIONS.urgency.criteria.map((label) => ({ label })),
        },
      ],
    });
    assert.equal(oa.answers[0].probability, sys.answers.billing.noul);
    assert.deepEqual(
      oa.answers[1].probabilities.map((p) => p.probability),
      Object.values(sys.answers.team.probabilities),
    );
    assert.deepEqual(
      oa.answers[2].probabilities.map((p) => p.probability),
      Object.values(sys.answers.urgency.probabilities),
    );
  });
});

describe('decisions under deterministic: true: the independent computation agrees to rounding', function () {
  let ctx;
  let plain;
  let scheduler;
  let worst = 0;
  before(async () => {
    // Both contexts deterministic: the library's rows (beside other forks' rows, options as a
    // trie) and the plain branch's rows are then the same bits, and only the arithmetic after the
    // logits (log-softmax, the softmax over options, the average over shifts) may differ.
    ctx = await open({ nCtx: 4096, nSeqMax: 16, deterministic: true });
    plain = await open({ nCtx: 1024, nSeqMax: 4, deterministic: true });
    scheduler = new Scheduler(ctx);
  });
  after(async () => {
    await scheduler.close();
    ctx.dispose();
    plain.dispose();
    console.log(`      largest difference, deterministic: ${worst.toExponential(2)}`);
  });

  for (const c of [
    { template: 'chat', reading: 'label', permute: 3 },
    { template: 'raw', reading: 'text', permute: 1 },
  ]) {
    it(`${c.template} template, ${c.reading} reading, permute ${c.permute}: within ${EXACT}`, async () => {
      worst = Math.max(worst, await compareWithIndependent(scheduler, plain, c, EXACT));
    });
  }
});
