#!/usr/bin/env node
'use strict';

// Speculative decoding through branches. `branch.generate({ speculative })` drafts the tokens
// that may follow each sampled token and verifies the whole draft in ONE decode with a logits row
// per token: the branch keeps the longest prefix its own (here greedy) sampler agrees with, so
// every accepted draft token saves a decode. Two draft sources:
//   lookup  prompt lookup: what followed the last few tokens earlier in the prompt (no second
//           model); it pays when the output quotes the input, as in this copy-editing prompt
//   draft   a draft model: a second context with the same vocabulary drafts greedily (here the
//           same model, which shows the machinery and a high acceptance, not a speed-up)
// The same prompt is then decoded plainly for the speed ratio and the agreement check.

const { createContext, Branch, DraftModel } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/speculative.js [--jsonl] [--model path] [--source lookup|draft]
                                   [--max-draft 8] [--max-tokens 64]`;

const TEXT =
  'The old lighthouse stood at the edge of the cliff for more than two hundred years. Every night its keeper climbed the narrow stairs, trimmed the wick and polished the great lens until it shone. Ships passing in the dark relied on its steady beam to avoid the rocks below.';

run(async () => {
  const flags = parseFlags(USAGE, { source: 'lookup', maxDraft: 8, maxTokens: 64 });
  if (!['lookup', 'draft'].includes(flags.source)) throw new Error(`--source must be lookup or draft\n${USAGE}`);
  const out = output(flags);
  const started = Date.now();

  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: 4 }));
  out.trace(ctx); // --jsonl: the branch tree's events too, for the page of `llama-branch serve`
  // The draft model's context: three sequences per line that speculates.
  const draftCtx =
    flags.source === 'draft' ? await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: 3 })) : null;
  const prompt = await ctx.tokenize(
    `Original text:\n${TEXT}\n\nCorrected copy (typos fixed, otherwise identical):\nThe old lighthouse stood at the edge of the cliff for`,
  );
  out.emit('start', {
    source: flags.source,
    maxDraft: flags.maxDraft,
    maxTokens: flags.maxTokens,
    promptTokens: prompt.length,
  });
  out.say(`speculative decoding (${flags.source}, drafts up to ${flags.maxDraft} tokens) on a copy-editing prompt`);

  const speculative =
    flags.source === 'lookup'
      ? { lookup: true, maxDraft: flags.maxDraft }
      : { draft: new DraftModel(draftCtx, ctx), maxDraft: flags.maxDraft };

  async function generate(options) {
    const branch = Branch.create(ctx, 0, { temperature: 0 });
    await branch.prefill(prompt);
    const t0 = performance.now();
    const result = await branch.generate({ maxTokens: flags.maxTokens, history: prompt, ...options });
    const ms = performance.now() - t0;
    await branch.prune();
    return { ...result, tokS: (result.tokens.length / ms) * 1000 };
  }

  let shown = 0;
  const spec = await generate({
    speculative,
    onToken: () => out.progress('decoding', ++shown, flags.maxTokens),
  });
  const plain = await generate({});

  // CPU decodes are not bit-identical across batch shapes, so the two may part at a near-tie:
  // report how long they agree, and where each speculative token ranks in plain decoding.
  let agree = 0;
  while (agree < spec.tokens.length && spec.tokens[agree] === plain.tokens[agree]) agree++;
  const check = Branch.create(ctx, 0, { temperature: 0 });
  await check.prefill(prompt);
  const ranks = [];
  for (const token of spec.tokens) {
    const logits = check.getLogits();
    ranks.push(logits.reduce((n, l) => n + (l > logits[token] ? 1 : 0), 0));
    await check.commit(token);
  }
  await check.prune();

  const { drafted, accepted, steps } = spec.speculative;
  const acceptRate = drafted === 0 ? 0 : accepted / drafted;
  out.say(`\n${oneLine(spec.text)}`);
  out.say(
    `\n${spec.tokens.length} tokens from ${steps} decodes (${(spec.tokens.length / steps).toFixed(2)} per decode); ` +
      `${accepted}/${drafted} draft tokens accepted (${(acceptRate * 100).toFixed(0)} %)`,
  );
  out.say(
    `${spec.tokS.toFixed(1)} tok/s with speculation vs ${plain.tokS.toFixed(1)} plain (${(spec.tokS / plain.tokS).toFixed(2)} ×); ` +
      `agrees with plain greedy decoding for ${agree}/${spec.tokens.length} tokens`,
  );
  out.emit('complete', {
    outputTokens: spec.tokens.length,
    decodes: steps,
    drafted,
    accepted,
    acceptRate: round(acceptRate, 4),
    tokensPerDecode: round(spec.tokens.length / steps, 3),
    tokS: round(spec.tokS, 1),
    plainTokS: round(plain.tokS, 1),
    greedyAgreement: agree,
    greedyRanks: ranks,
    text: spec.text,
    elapsedMs: Date.now() - started,
  });
  if (draftCtx) draftCtx.dispose();
  ctx.dispose();
});
