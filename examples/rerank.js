#!/usr/bin/env node
'use strict';

// Rerank as a branch program: the query is prefilled once, a fork per document appends the
// document and the question "Relevant?", and each fork's " yes" / " no" log-probabilities are
// read from the logits its own prefill left (no decode beyond the prefills). Every fork's
// document goes into the same store.prefill; the score is log p(yes) - log p(no).

const { createContext, Scheduler } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/rerank.js [--jsonl] [--model path] [--query text]`;

const DOCUMENTS = [
  'The Eiffel Tower is a wrought-iron tower in Paris, completed in 1889 for the World Fair.',
  'Bananas are rich in potassium and are one of the most widely eaten fruits in the world.',
  'Paris is the capital of France and its largest city, on the river Seine.',
  'The stock market closed higher today after a week of losses in technology shares.',
  'The Louvre in Paris is the most visited art museum in the world.',
  'Penguins live almost only in the southern hemisphere, most of them in Antarctica.',
];

run(async () => {
  const flags = parseFlags(USAGE, { query: 'What is there to see in Paris?' });
  const out = output(flags);
  const started = Date.now();
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: DOCUMENTS.length + 2 }));
  const prefills = [];
  const scheduler = new Scheduler(ctx, { onStep: (s) => s.prefillTokens > 0 && prefills.push(s.prefillTokens) });
  out.trace(scheduler); // --jsonl: the requests' branch trees too, for the page of `llama-branch serve`
  out.emit('start', { query: flags.query, documents: DOCUMENTS.length, model: ctx.modelDescription });
  out.say(`rerank ${DOCUMENTS.length} documents for ${oneLine(flags.query)}`);

  const ranked = await scheduler.run(
    async (s) => {
      s.append(`Query: ${flags.query}\n`);
      const forks = s.fork(DOCUMENTS.length);
      const scores = await Promise.all(
        forks.map(async (f, i) => {
          f.append(`Document: ${DOCUMENTS[i]}\nIs the document relevant to the query? Answer yes or no:`);
          const yes = await f.logprob(' yes');
          const no = await f.logprob(' no'); // the same logits: nothing is decoded for it
          return { index: i, yes: yes.logprob, no: no.logprob, score: yes.logprob - no.logprob };
        }),
      );
      return scores.sort((a, b) => b.score - a.score);
    },
    { maxBranches: DOCUMENTS.length + 1 },
  );
  ranked.forEach((r, rank) => {
    out.emit('document', { rank, index: r.index, score: round(r.score, 4), yes: round(r.yes, 4), no: round(r.no, 4) });
    out.say(`${rank + 1}. ${r.score.toFixed(2).padStart(6)}  ${DOCUMENTS[r.index]}`);
  });
  const stats = scheduler.stats();
  await scheduler.close();
  out.emit('complete', {
    prefillSteps: prefills.length,
    prefilledTokens: stats.prefilledTokens,
    generatedTokens: stats.generatedTokens,
    elapsedMs: Date.now() - started,
  });
  out.say(`\n${stats.prefilledTokens} prompt tokens in ${prefills.length} prefill steps, nothing generated`);
  ctx.dispose();
});
