#!/usr/bin/env node
'use strict';

// Grammar-constrained JSON with branching at a decision point. A JSON schema becomes a GBNF
// grammar (jsonSchemaToGrammar); one branch generates under it until the value of "city" is
// about to start, then forks. Each fork inherits the grammar state at that point, so every
// completion is valid JSON. To make the forks take different values, each one bans (steer) the
// first tokens its earlier siblings chose before sampling its own; then all forks finish
// together with one batched commit per step.

const { createContext, Branch, BranchStore, jsonSchemaToGrammar } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine } = require('./_common');

const USAGE = `usage: node examples/grammar-json.js [--jsonl] [--model path] [--forks 3] [--max-tokens 80]
                                    [--seed 3]`;

const SCHEMA = {
  type: 'object',
  properties: {
    city: { type: 'string', minLength: 2 },
    country: { type: 'string', minLength: 2 },
    population: { type: 'integer', minimum: 1000, maximum: 99999999 },
  },
  required: ['city', 'country', 'population'],
  additionalProperties: false,
};
const PROMPT = 'A JSON record describing a large city:\n';
// The decision point: the generated text has just opened the city's string value.
const DECISION_POINT = /"city"\s*:\s*"$/;

run(async () => {
  const flags = parseFlags(USAGE, { forks: 3, maxTokens: 80, seed: 3 });
  const out = output(flags);
  const started = Date.now();

  const grammar = await jsonSchemaToGrammar(SCHEMA);
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: flags.forks + 1 }));
  out.trace(ctx); // --jsonl: the branch tree's events too, for the page of `llama-branch serve`
  const store = new BranchStore(ctx);
  out.emit('start', { forks: flags.forks, schema: SCHEMA, grammarBytes: grammar.length });
  out.say(`schema ${JSON.stringify(SCHEMA)}\n-> GBNF grammar of ${grammar.length} bytes`);

  const trunk = Branch.create(ctx, 0, { temperature: 0.7, seed: flags.seed, grammar });
  await trunk.prefill(await ctx.tokenize(PROMPT));

  // 1. Generate the shared prefix up to the decision point.
  let prefix = '';
  for (let i = 0; i < flags.maxTokens && !DECISION_POINT.test(prefix); i++) {
    const p = trunk.produce();
    if (p.isStop) throw new Error(`the object ended before "city": ${prefix}`);
    await trunk.commit(p.token);
    prefix += p.text;
  }
  if (!DECISION_POINT.test(prefix)) throw new Error(`no "city" field within ${flags.maxTokens} tokens: ${prefix}`);
  out.emit('branch_point', { prefix, position: trunk.position });
  out.say(`\nshared prefix (decoded once): ${prefix}`);

  // 2. Fork; each fork bans its siblings' first tokens, so they start different values.
  const forks = [];
  const firstTokens = [];
  for (let i = 0; i < flags.forks; i++) {
    const fork = trunk.fork();
    fork.reseedSampler(flags.seed + 100 + i);
    fork.steer(firstTokens.map((token) => ({ token, bias: -Infinity })));
    const p = fork.produce(); // grammar-valid, and none of the siblings' choices
    fork.clearSteer();
    firstTokens.push(p.token);
    forks.push({ branch: fork, text: prefix + p.text, first: p.token, done: false });
  }
  await store.commit(forks.map((f) => [f.branch, f.first])); // one decode for all first tokens

  // 3. Finish every fork, ONE batched decode per step.
  for (let step = 1; step < flags.maxTokens; step++) {
    const live = forks.filter((f) => !f.done);
    if (live.length === 0) break;
    const produced = store.produce(live.map((f) => f.branch));
    const pairs = [];
    produced.forEach((p, i) => {
      if (p.isStop)
        live[i].done = true; // the grammar is complete: only end-of-generation is allowed
      else {
        live[i].text += p.text;
        pairs.push([live[i].branch, p.token]);
      }
    });
    await store.commit(pairs);
    out.progress('completing', step, flags.maxTokens);
  }

  let valid = 0;
  forks.forEach((f, i) => {
    let value = null;
    try {
      value = JSON.parse(f.text);
      valid++;
    } catch {
      // reported below as invalid
    }
    out.emit('branch_complete', { index: i, text: f.text, validJson: value !== null, value, finished: f.done });
    out.say(`\nfork #${i} (${value ? 'valid JSON' : 'NOT valid JSON'}): ${f.text.trim()}`);
  });
  const cities = forks.map((f) => {
    try {
      return JSON.parse(f.text).city;
    } catch {
      return null;
    }
  });
  const distinctCities = new Set(cities.filter((c) => c !== null)).size;
  out.say(
    `\n${valid}/${forks.length} valid JSON, ${distinctCities} distinct cities: ${cities.map(oneLine).join(', ')}`,
  );
  out.emit('complete', {
    validJsonCount: valid,
    branches: forks.length,
    distinctCities,
    elapsedMs: Date.now() - started,
  });
  ctx.dispose();
});
