#!/usr/bin/env node
'use strict';

// Speculative decoding with a draft branch. Each round a draft branch (a fork of the main branch
// with a cheaper, noisier sampler) proposes up to K tokens; the main branch then checks ALL of
// them in one batched decode: verifier forks 1..m of the main branch prefill the drafted prefixes
// d[0..i) (a single store.prefill, bin-packed into one llama_decode), so fork i's logits are the
// main model's distribution after d[0..i). A draft token is accepted while it equals the main
// branch's own (greedy) choice; at the first mismatch the main branch's token is taken instead
// (the "bonus" token), so the output is what greedy decoding of the main branch would produce.
//
// Here the draft is the same model sampled at a high temperature, a stand-in for a small draft
// model: it shows the mechanics and the acceptance rate, not a speed-up.

const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/speculative.js [--jsonl] [--model path] [--draft-tokens 4] [--max-tokens 32]
                                   [--draft-temperature 1.0] [--seed 7] [--prompt text]`;

run(async () => {
  const flags = parseFlags(USAGE, {
    draftTokens: 4,
    maxTokens: 32,
    draftTemperature: 1.0,
    seed: 7,
    prompt: 'Here is a short recipe for pancakes. Ingredients:',
  });
  const out = output(flags);
  const started = Date.now();
  const K = flags.draftTokens;

  // Leases: the main branch plus either the draft or up to K verifier forks.
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: K + 1 }));
  const store = new BranchStore(ctx);
  const prompt = await ctx.tokenize(flags.prompt);
  out.emit('start', {
    draftCount: K,
    maxTokens: flags.maxTokens,
    draftTemperature: flags.draftTemperature,
    promptTokens: prompt.length,
  });
  out.say(`speculative decoding, ${K} draft tokens per round: ${oneLine(flags.prompt)}`);

  let main = Branch.create(ctx, 0, { temperature: 0 }); // the verifier: greedy
  await main.prefill(prompt);

  const output_ = [];
  let drafted = 0;
  let accepted = 0;
  let mainPasses = 0; // decodes that ran the main branch (verification + bonus token)
  let round_ = 0;
  let done = false;

  while (!done && output_.length < flags.maxTokens) {
    // 1. Draft: a fork with a noisy sampler proposes up to K tokens, one decode each.
    const draft = main.fork();
    draft.setSamplerParams({ temperature: flags.draftTemperature, topK: 40, seed: flags.seed + round_ });
    const proposal = [];
    while (proposal.length < Math.min(K, flags.maxTokens - output_.length)) {
      const p = draft.produce();
      if (p.isStop) break;
      proposal.push(p.token);
      if (proposal.length < K) await draft.commit(p.token); // the last one needs no decode
    }
    await draft.prune();

    // 2. Verify: fork i holds the main branch's prefix + proposal[0..i); ONE batched decode.
    const verifiers = proposal.map(() => main.fork());
    await store.prefill(verifiers.map((v, i) => [v, proposal.slice(0, i + 1)]));
    mainPasses++;
    const views = [main, ...verifiers]; // views[i] = main's distribution after proposal[0..i)
    const choices = store.produce(views); // the main branch's own (greedy) choice at each point

    // 3. Accept the longest agreeing prefix, then the main branch's token at the first mismatch
    //    (or after the whole proposal): every round yields at least one token.
    let n = 0;
    while (n < proposal.length && choices[n].token === proposal[n]) n++;
    drafted += proposal.length;
    accepted += n;
    const bonus = choices[n];

    // The view that already holds the accepted prefix becomes the main branch; no re-decode.
    const next = views[n];
    for (const v of views) if (v !== next) await v.prune();
    main = next;
    output_.push(...proposal.slice(0, n));
    if (bonus.isStop) {
      done = true;
    } else {
      output_.push(bonus.token);
      await main.commit(bonus.token);
      mainPasses++;
    }
    out.emit('iteration', {
      round: round_,
      drafted: proposal.length,
      accepted: n,
      bonus: bonus.isStop ? null : bonus.text,
    });
    out.progress('decoding', Math.min(output_.length, flags.maxTokens), flags.maxTokens);
    round_++;
  }

  const text = await ctx.detokenize(output_);
  const acceptRate = drafted === 0 ? 0 : accepted / drafted;

  // Reference: plain greedy decoding of the same prompt. CPU decodes are not bit-identical across
  // batch shapes, so the two can differ after a near-tie; report how long they agree.
  await main.prune();
  const reference = Branch.create(ctx, 0, { temperature: 0 });
  await reference.prefill(prompt);
  const greedy = [];
  for await (const { token } of reference) {
    greedy.push(token);
    if (greedy.length === output_.length) break;
  }
  await reference.prune();
  let agree = 0;
  while (agree < output_.length && output_[agree] === greedy[agree]) agree++;
  // And token by token on our own output (teacher-forced, one token per decode): where each
  // output token ranks in plain decoding's distribution. Greedy verification makes it rank 0
  // but for near-ties that another batch shape breaks the other way.
  const check = Branch.create(ctx, 0, { temperature: 0 });
  await check.prefill(prompt);
  const ranks = [];
  for (const token of output_) {
    const logits = check.getLogits();
    ranks.push(logits.reduce((n, l) => n + (l > logits[token] ? 1 : 0), 0));
    await check.commit(token);
  }
  await check.prune();

  out.say(`\n${oneLine(text)}`);
  out.say(
    `\n${round_} rounds: ${accepted}/${drafted} draft tokens accepted (${(acceptRate * 100).toFixed(0)} %),` +
      ` ${output_.length} tokens from ${mainPasses} main-branch decodes (${(output_.length / mainPasses).toFixed(2)} tokens per decode)`,
  );
  out.say(
    `agrees with plain greedy decoding for ${agree}/${output_.length} tokens; token by token, ` +
      `${ranks.filter((r) => r === 0).length}/${output_.length} are plain decoding's top choice, all within its top ${Math.max(...ranks) + 1}`,
  );
  out.emit('complete', {
    outputTokens: output_.length,
    iterations: round_,
    drafted,
    accepted,
    acceptRate: round(acceptRate, 4),
    mainPasses,
    tokensPerMainPass: round(output_.length / mainPasses, 3),
    greedyAgreement: agree,
    greedyRanks: ranks,
    text,
    elapsedMs: Date.now() - started,
  });
  ctx.dispose();
});
