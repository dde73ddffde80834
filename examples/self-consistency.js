#!/usr/bin/env node
'use strict';

// Self-consistency as branch programs: for each question, a program appends a few-shot prompt,
// forks N chains of thought that share its KV prefix, generates them, extracts each chain's
// answer and takes the majority vote. The programs run concurrently on one Scheduler: every
// chain of every question advances in the same decode, one step at a time.

const { createContext, Scheduler } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine } = require('./_common');

const USAGE = `usage: node examples/self-consistency.js [--jsonl] [--model path] [--paths 8] [--max-tokens 48]
                                       [--questions 2] [--temperature 0.8] [--seed 1]`;

const FEW_SHOT = `Q: Tom has 3 apples and buys 2 more. How many apples does he have?
A: Tom starts with 3 apples. He buys 2 more, so 3 + 2 = 5. The answer is 5.

Q: A box holds 4 pens. How many pens are in 3 boxes?
A: Each box holds 4 pens, and there are 3 boxes, so 4 * 3 = 12. The answer is 12.

`;

const QUESTIONS = [
  'Sara has 7 sweets and eats 3. How many sweets are left?',
  'A farmer has 5 cows and buys 4 more. How many cows does he have?',
  'There are 6 birds on a tree and 2 fly away. How many birds are on the tree?',
  'A bag has 2 red balls and 5 blue balls. How many balls are in the bag?',
];

/** The number a chain of thought ends on: after "The answer is", else its last number. */
function extractAnswer(text) {
  const stated = /answer is\s*(-?\d+)/i.exec(text);
  if (stated) return stated[1];
  const numbers = text.match(/-?\d+/g);
  return numbers ? numbers[numbers.length - 1] : null;
}

/** The most frequent non-null answer (ties: the one seen first), with its vote count. */
function majority(answers) {
  const votes = new Map();
  for (const a of answers) if (a !== null) votes.set(a, (votes.get(a) || 0) + 1);
  let best = null;
  for (const [answer, count] of votes) if (best === null || count > best.votes) best = { answer, votes: count };
  return best || { answer: null, votes: 0 };
}

run(async () => {
  const flags = parseFlags(USAGE, { paths: 8, maxTokens: 48, questions: 2, temperature: 0.8, seed: 1 });
  const out = output(flags);
  const questions = QUESTIONS.slice(0, Math.max(1, Math.min(flags.questions, QUESTIONS.length)));
  const started = Date.now();
  // Leases: each program holds its root and its N chains.
  const perProgram = flags.paths + 1;
  const ctx = await createContext(
    contextOptions(flags, { nCtx: 4096, nSeqMax: perProgram * questions.length, nBatch: 512 }),
  );
  const rowsPerStep = [];
  const scheduler = new Scheduler(ctx, { onStep: (s) => rowsPerStep.push(s.rows) });
  out.trace(scheduler); // --jsonl: the requests' branch trees too, for the page of `llama-branch serve`
  const prompts = questions.map((question) => `${FEW_SHOT}Q: ${question}\nA:`);
  const promptTokens = prompts.map((p) => ctx.tokenizeSync(p, true).length);
  out.emit('start', { paths: flags.paths, questions: questions.length, promptTokens, model: ctx.modelDescription });
  out.say(`self-consistency, ${flags.paths} paths per question, ${questions.length} questions at once`);

  const program = (prompt, q) => async (s) => {
    s.append(prompt); // decoded once, when the chains first need it; the chains share its cells
    const chains = s.fork(flags.paths);
    const params = { temperature: flags.temperature, topP: 0.95 };
    const outs = await Promise.all(chains.map((c) => c.gen({ maxTokens: flags.maxTokens, stop: '\n', params })));
    const answers = outs.map((o) => extractAnswer(o.text));
    outs.forEach((o, i) => {
      out.emit('path', { question: q, index: i, answer: answers[i], finishReason: o.finishReason, text: o.text });
    });
    return { answers, ...majority(answers) };
  };
  const results = await Promise.all(
    prompts.map((prompt, q) =>
      scheduler.run(program(prompt, q), { maxBranches: perProgram, seed: flags.seed + 1000 * q }),
    ),
  );
  results.forEach((r, q) => {
    out.emit('vote', { question: q, answer: r.answer, votes: r.votes, answers: r.answers });
    out.say(
      `\nQ: ${questions[q]}\n  answers ${oneLine(r.answers.join(' '))} → ${r.answer} (${r.votes}/${flags.paths})`,
    );
  });
  const stats = scheduler.stats();
  await scheduler.close();
  const complete = {
    steps: stats.steps,
    maxRowsPerStep: Math.max(...rowsPerStep),
    generatedTokens: stats.generatedTokens,
    prefilledTokens: stats.prefilledTokens,
    elapsedMs: Date.now() - started,
  };
  out.emit('complete', complete);
  out.say(
    `\n${complete.generatedTokens} tokens in ${complete.steps} steps, up to ${complete.maxRowsPerStep} chains in one decode`,
  );
  ctx.dispose();
});
