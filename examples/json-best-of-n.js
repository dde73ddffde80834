#!/usr/bin/env node
'use strict';

// Best-of-n under a JSON schema, as a branch program: n forks of one prompt each generate a JSON
// object under the schema's grammar, with per-token log-probabilities; the candidates that parse
// and pass the checks the grammar cannot express (here: the age range and a non-empty name) are
// kept, and the one with the lowest perplexity, exp(-mean log-probability), wins.

const { createContext, Scheduler } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/json-best-of-n.js [--jsonl] [--model path] [--n 6] [--max-tokens 64] [--seed 1]`;

const SCHEMA = {
  type: 'object',
  properties: {
    name: { type: 'string', maxLength: 24 },
    age: { type: 'integer' },
    city: { type: 'string', maxLength: 24 },
  },
  required: ['name', 'age', 'city'],
  additionalProperties: false,
};

/** What the grammar cannot check: returns the reason a parsed candidate is refused, or null. */
function refusal(value) {
  if (value.name.trim() === '') return 'empty name';
  if (value.age < 0 || value.age > 120) return `age ${value.age} out of range`;
  return null;
}

run(async () => {
  const flags = parseFlags(USAGE, { n: 6, maxTokens: 64, seed: 1 });
  const out = output(flags);
  const started = Date.now();
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: flags.n + 2 }));
  const scheduler = new Scheduler(ctx);
  out.trace(scheduler); // --jsonl: the requests' branch trees too, for the page of `llama-branch serve`
  out.emit('start', { n: flags.n, model: ctx.modelDescription });
  out.say(`best-of-${flags.n} JSON candidates on ${ctx.modelDescription}`);

  const candidates = await scheduler.run(
    async (s) => {
      s.append('A person from a novel, described as JSON with name, age and city:\n');
      const forks = s.fork(flags.n);
      const params = { temperature: 0.9, topP: 0.95 };
      return Promise.all(
        forks.map((f) => f.gen({ jsonSchema: SCHEMA, maxTokens: flags.maxTokens, params, logprobs: true })),
      );
    },
    { maxBranches: flags.n + 1, seed: flags.seed },
  );

  const judged = candidates.map((c, index) => {
    const mean = c.logprobs.reduce((sum, l) => sum + l.logprob, 0) / Math.max(1, c.logprobs.length);
    const perplexity = Math.exp(-mean);
    let reason = c.finishReason === 'length' ? 'cut at maxTokens' : null;
    let value = null;
    if (!reason) {
      try {
        value = JSON.parse(c.text);
        reason = refusal(value);
      } catch (e) {
        reason = `does not parse: ${e.message}`;
      }
    }
    out.emit('candidate', { index, text: c.text, perplexity: round(perplexity, 4), kept: !reason, reason });
    out.say(
      `#${index} ppl ${perplexity.toFixed(2).padStart(6)} ${reason ? `refused (${reason})` : 'kept   '} ${oneLine(c.text)}`,
    );
    return { index, perplexity, kept: !reason, value };
  });
  const kept = judged.filter((j) => j.kept);
  const best = kept.reduce((a, b) => (b.perplexity < a.perplexity ? b : a), kept[0] || null);
  await scheduler.close();
  out.emit('complete', {
    kept: kept.length,
    bestIndex: best ? best.index : null,
    best: best ? best.value : null,
    elapsedMs: Date.now() - started,
  });
  out.say(best ? `\nbest: #${best.index} ${JSON.stringify(best.value)}` : '\nno candidate passed');
  ctx.dispose();
});
