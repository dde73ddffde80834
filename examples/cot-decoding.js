#!/usr/bin/env node
'use strict';

// CoT-decoding (Wang & Zhou, 2024) as a branch program: instead of the greedy path alone, fork on
// the top-k first tokens, continue each path greedily (all k in the same decodes), and rank the
// paths by the model's confidence in its answer: the mean, over the answer's tokens, of the
// probability margin between the top-1 and top-2 tokens, read from per-token logprobs.

const { createContext, Scheduler } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/cot-decoding.js [--jsonl] [--model path] [--k 5] [--max-tokens 40] [--question text]`;

/** The answer's token indices in a path: its digits if it has any, else every token. */
function answerSpan(logprobs) {
  const digits = logprobs.map((l, i) => (/\d/.test(l.text) ? i : -1)).filter((i) => i >= 0);
  return digits.length > 0 ? digits : logprobs.map((_, i) => i);
}

/** Mean of p(top-1) - p(top-2) over the answer's tokens (0 when the path generated nothing). */
function confidence(logprobs) {
  if (logprobs.length === 0) return 0;
  const span = answerSpan(logprobs);
  const margins = span.map((i) => {
    const [a, b] = logprobs[i].top;
    return Math.exp(a.logprob) - (b ? Math.exp(b.logprob) : 0);
  });
  return margins.reduce((s, m) => s + m, 0) / margins.length;
}

run(async () => {
  const flags = parseFlags(USAGE, {
    k: 5,
    maxTokens: 40,
    question: 'I have 3 apples, my dad has 2 more apples than me. How many apples do we have in total?',
  });
  const out = output(flags);
  const started = Date.now();
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: flags.k + 2 }));
  let mostRows = 0;
  const scheduler = new Scheduler(ctx, { onStep: (s) => (mostRows = Math.max(mostRows, s.rows)) });
  out.trace(scheduler); // --jsonl: the requests' branch trees too, for the page of `llama-branch serve`
  out.emit('start', { k: flags.k, question: flags.question, model: ctx.modelDescription });
  out.say(`CoT-decoding over the top-${flags.k} first tokens: ${oneLine(flags.question)}`);

  const paths = await scheduler.run(
    async (s) => {
      s.append(`Q: ${flags.question}\nA:`);
      // The top-k first tokens, read from the prompt's logits (any token will do as the probe).
      const { top } = await s.logprob([0], { top: flags.k });
      const forks = s.fork(flags.k);
      return Promise.all(
        forks.map(async (f, i) => {
          f.append([top[i].token]);
          const g = await f.gen({ maxTokens: flags.maxTokens, stop: '\n', params: { temperature: 0 }, logprobs: 2 });
          const first = ctx.tokenToText(top[i].token);
          return {
            index: i,
            first,
            firstLogprob: top[i].logprob,
            text: first + g.text,
            confidence: confidence(g.logprobs),
          };
        }),
      );
    },
    { maxBranches: flags.k + 1 },
  );
  for (const p of paths) {
    out.emit('path', { ...p, firstLogprob: round(p.firstLogprob, 4), confidence: round(p.confidence, 4) });
    out.say(`#${p.index} confidence ${p.confidence.toFixed(3)}  ${oneLine(p.text)}`);
  }
  const best = paths.reduce((a, b) => (b.confidence > a.confidence ? b : a));
  await scheduler.close();
  out.emit('complete', { bestIndex: best.index, mostRowsPerDecode: mostRows, elapsedMs: Date.now() - started });
  out.say(`\nmost confident: #${best.index} ${oneLine(best.text)} (greedy alone is #0)`);
  ctx.dispose();
});
