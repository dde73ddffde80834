#!/usr/bin/env node
'use strict';

// Beam search of width k with length-normalised log-probability scores. Each step: take the top-k
// next tokens of every beam (from its logits snapshot), keep the k best extensions overall, prune
// beams that got no survivor, fork beams that got several, then advance all k beams with ONE
// batched store.commit. Forks share their parent's KV cells, so a beam costs only its own suffix.

const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, topLogProbs, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/beam-search.js [--jsonl] [--model path] [--width 3] [--max-tokens 16]
                                   [--alpha 0.7] [--prompt text]
  score = (sum of token log-probs) / (length ^ alpha)`;

run(async () => {
  const flags = parseFlags(USAGE, {
    width: 3,
    maxTokens: 16,
    alpha: 0.7,
    prompt: 'The three most important inventions of the last century are',
  });
  const out = output(flags);
  const started = Date.now();
  const k = flags.width;

  // Each step prunes beams without survivors BEFORE forking, so at most k branches are alive.
  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: k }));
  const store = new BranchStore(ctx);
  const trace = out.trace(ctx); // --jsonl: the tree's events too, for the page of `llama-branch serve`
  const prompt = await ctx.tokenize(flags.prompt);
  out.emit('start', { width: k, maxTokens: flags.maxTokens, alpha: flags.alpha, promptTokens: prompt.length });
  out.say(`beam search, width ${k}, alpha ${flags.alpha}: ${oneLine(flags.prompt)}`);

  // Scores only use logits, so greedy chains are enough (the sampler is never asked to choose).
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(prompt);

  const score = (logProb, length) => logProb / Math.pow(length, flags.alpha);
  let beams = [{ branch: root, tokens: [], logProb: 0 }];
  const finished = []; // beams that produced an end-of-generation token
  let forks = 0;
  let prunes = 0;
  let decodes = 0;

  for (let step = 0; step < flags.maxTokens && beams.length > 0; step++) {
    // 1. Expand: every beam proposes its k most likely next tokens.
    const proposals = [];
    beams.forEach((beam, b) => {
      for (const { token, logProb } of topLogProbs(beam.branch.getLogits(), k)) {
        const total = beam.logProb + logProb;
        proposals.push({ from: b, token, logProb: total, score: score(total, beam.tokens.length + 1) });
      }
    });
    proposals.sort((x, y) => y.score - x.score);

    // 2. Select the k best; finished hypotheses leave the beam (they need no decode).
    const kept = [];
    for (const p of proposals) {
      if (kept.length === k) break;
      if (ctx.isStopToken(p.token)) {
        finished.push({ tokens: beams[p.from].tokens, logProb: p.logProb, score: p.score });
        continue;
      }
      kept.push(p);
    }

    // 3. Prune beams without survivors (frees their leases first), fork beams with several.
    const survivorsOf = beams.map((_, b) => kept.filter((p) => p.from === b));
    for (let b = 0; b < beams.length; b++) {
      if (survivorsOf[b].length === 0) {
        await beams[b].branch.prune();
        prunes++;
      }
    }
    const next = [];
    beams.forEach((beam, b) => {
      survivorsOf[b].forEach((p, j) => {
        const branch = j === 0 ? beam.branch : beam.branch.fork(); // the first survivor reuses the beam
        if (j > 0) forks++;
        next.push({ branch, tokens: [...beam.tokens, p.token], logProb: p.logProb, score: p.score });
      });
    });

    // 4. One batched decode advances every beam by its chosen token.
    if (next.length > 0) {
      await store.commit(next.map((beam) => [beam.branch, beam.tokens[beam.tokens.length - 1]]));
      decodes++;
    }
    beams = next;
    out.emit('beam', {
      step,
      beams: beams.map((beam) => ({
        score: round(beam.score, 4),
        text: ctx.tokenToText(beam.tokens[beam.tokens.length - 1]),
      })),
      liveBranches: k - store.available,
    });
    out.progress('searching', step + 1, flags.maxTokens);
  }

  const hypotheses = [
    ...beams.map((beam) => ({ tokens: beam.tokens, logProb: beam.logProb, score: beam.score, finished: false })),
    ...finished.map((f) => ({ ...f, finished: true })),
  ].sort((x, y) => y.score - x.score);
  const texts = await Promise.all(hypotheses.map((h) => ctx.detokenize(h.tokens)));

  out.say('');
  hypotheses.slice(0, k).forEach((h, i) => {
    out.say(
      `#${i} score ${h.score.toFixed(3).padStart(7)}  (${h.tokens.length} tokens${h.finished ? ', ended' : ''})  ${oneLine(texts[i])}`,
    );
  });
  out.say(`\n${decodes} batched decodes, ${forks} forks, ${prunes} prunes`);
  hypotheses.slice(0, k).forEach((h, i) =>
    out.emit('hypothesis', {
      rank: i,
      score: round(h.score, 4),
      logProb: round(h.logProb, 4),
      tokens: h.tokens.length,
      finished: h.finished,
      text: texts[i],
    }),
  );

  // Keep only the best live beam's branch (e.g. to continue generating from it).
  const bestLive = beams.length > 0 ? beams.reduce((a, b) => (b.score > a.score ? b : a)) : null;
  if (bestLive && trace) trace.finish(bestLive.branch, 'best');
  if (bestLive) await store.retainOnly(bestLive.branch);
  out.emit('complete', {
    width: k,
    steps: decodes,
    decodes,
    forks,
    prunes,
    bestScore: round(hypotheses[0].score, 4),
    bestText: texts[0],
    liveBranchesAfter: k - store.available,
    elapsedMs: Date.now() - started,
  });
  ctx.dispose();
});
