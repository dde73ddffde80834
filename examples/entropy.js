#!/usr/bin/env node
'use strict';

// Entropy-driven control. Before every token the branch's next-token entropy (branch.entropy(),
// the same number ctx.modelEntropy() computes from a logits row) decides what to do:
//   - confident (low entropy): sample with a lower temperature, scaled by the entropy;
//   - uncertain (entropy above --fork-threshold): a branch point. Fork one child per top-F token,
//     look ahead L tokens with all children in one batched commit per step, continue with the
//     child whose lookahead has the lowest perplexity and prune the others.

const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, topLogProbs, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/entropy.js [--jsonl] [--model path] [--max-tokens 40] [--fork-threshold 3.0]
                                [--fan-out 3] [--lookahead 4] [--max-forks 3] [--temperature 0.9]
                                [--seed 5] [--prompt text]
  entropies are in nats`;

run(async () => {
  const flags = parseFlags(USAGE, {
    maxTokens: 40,
    forkThreshold: 3.0,
    fanOut: 3,
    lookahead: 4,
    maxForks: 3,
    temperature: 0.9,
    seed: 5,
    prompt: 'My favourite way to spend a rainy afternoon is',
  });
  const out = output(flags);
  const started = Date.now();

  const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: flags.fanOut + 1 }));
  out.trace(ctx); // --jsonl: the branch tree's events too, for the page of `llama-branch serve`
  const store = new BranchStore(ctx);
  const prompt = await ctx.tokenize(flags.prompt);
  out.emit('start', {
    maxTokens: flags.maxTokens,
    forkThreshold: flags.forkThreshold,
    fanOut: flags.fanOut,
    lookahead: flags.lookahead,
  });
  out.say(`entropy-driven generation (fork above ${flags.forkThreshold} nats): ${oneLine(flags.prompt)}`);

  let main = Branch.create(ctx, 0, { temperature: flags.temperature, seed: flags.seed });
  await main.prefill(prompt);

  // branch.entropy() reads the branch's own snapshot; ctx.modelEntropy(base, logits) takes any row.
  const check = ctx.modelEntropy('nats', main.getLogits());
  out.emit('entropy_check', { branchEntropy: round(main.entropy(), 6), modelEntropy: round(check, 6) });

  let text = '';
  let tokens = 0;
  let forks = 0;
  let entropySum = 0;
  let decisions = 0;
  let temperatureSum = 0;
  let sampledSteps = 0;
  let currentTemperature = null;

  while (tokens < flags.maxTokens) {
    const entropy = main.entropy('nats');
    entropySum += entropy;
    decisions++;

    if (entropy > flags.forkThreshold && forks < flags.maxForks && tokens + flags.lookahead <= flags.maxTokens) {
      // Branch point: one child per top-F token, greedy lookahead for all of them together.
      forks++;
      const firsts = topLogProbs(main.getLogits(), flags.fanOut);
      const children = firsts.map(() => {
        const child = main.fork();
        child.setSamplerParams({ temperature: 0 });
        return child;
      });
      const texts = firsts.map((f) => ctx.tokenToText(f.token));
      const runs = firsts.map((f) => [f.token]);
      await store.commit(children.map((c, i) => [c, firsts[i].token]));
      for (let t = 1; t < flags.lookahead; t++) {
        const produced = store.produce(children);
        const pairs = [];
        produced.forEach((p, i) => {
          if (p.isStop) return;
          texts[i] += p.text;
          runs[i].push(p.token);
          pairs.push([children[i], p.token]);
        });
        await store.commit(pairs);
      }
      const ppls = children.map((c) => c.perplexity);
      const best = ppls.indexOf(Math.min(...ppls));
      for (let i = 0; i < children.length; i++) if (i !== best) await children[i].prune();
      await main.prune(); // the winner lives on (re-parented), with the shared prefix intact
      main = children[best];
      currentTemperature = null; // the winner's chain is greedy; rebuild it at the next sampled step
      text += texts[best];
      tokens += runs[best].length;
      out.emit('branch_point', {
        step: tokens - runs[best].length,
        entropy: round(entropy),
        candidates: texts.map((t, i) => ({ text: t, ppl: round(ppls[i]) })),
        chosen: best,
      });
      out.say(
        `  [H ${entropy.toFixed(2)}] branch point: ${texts.map((t, i) => `${i === best ? '*' : ' '}${oneLine(t)} (ppl ${ppls[i].toFixed(2)})`).join('  ')}`,
      );
      if (runs[best].length < flags.lookahead) break; // the winner ended inside the lookahead
      continue;
    }

    // Confident enough: temperature scaled by entropy (bucketed, so the chain is rebuilt rarely).
    const temperature = Math.round(10 * flags.temperature * Math.min(1, entropy / flags.forkThreshold)) / 10;
    if (temperature !== currentTemperature) {
      main.setSamplerParams({ temperature, seed: flags.seed + tokens });
      currentTemperature = temperature;
    }
    const p = main.produce();
    if (p.isStop) break;
    await main.commit(p.token);
    text += p.text;
    tokens++;
    sampledSteps++;
    temperatureSum += temperature;
    out.emit('sample', { step: tokens - 1, entropy: round(entropy), temperature, text: p.text });
    out.progress('generating', tokens, flags.maxTokens);
  }

  out.say(`\n${oneLine(flags.prompt + text)}`);
  const avgEntropy = entropySum / Math.max(1, decisions);
  const avgTemp = sampledSteps ? temperatureSum / sampledSteps : 0;
  out.say(
    `\n${tokens} tokens, ${forks} branch points, mean entropy ${avgEntropy.toFixed(2)} nats, mean sampling temperature ${avgTemp.toFixed(2)}`,
  );
  out.emit('complete', {
    tokens,
    branchPoints: forks,
    sampledSteps,
    avgEntropy: round(avgEntropy),
    avgTemp: round(avgTemp),
    perplexity: round(main.perplexity),
    liveBranches: flags.fanOut + 1 - store.available,
    text,
    elapsedMs: Date.now() - started,
  });
  ctx.dispose();
});
