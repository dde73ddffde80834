#!/usr/bin/env node
'use strict';

// Tree of thought (a beam over steps), as a branch program: at each of three levels every kept
// line forks k candidate next steps, all of them generated in the same decodes; each candidate
// is scored by its mean token log-probability, the best b are kept and the rest released (their
// leases come back at the next step). The tree never holds more than 1 + b + b·k lines.

const { createContext, Scheduler } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/tree-of-thought.js [--jsonl] [--model path] [--k 3] [--b 2] [--levels 3]
                                      [--max-tokens 16] [--seed 1] [--prompt text]`;

run(async () => {
  const flags = parseFlags(USAGE, {
    k: 3,
    b: 2,
    levels: 3,
    maxTokens: 16,
    seed: 1,
    prompt: 'Plan a short trip to the sea, one step per line.\nStep 1:',
  });
  const out = output(flags);
  const started = Date.now();
  const maxBranches = 1 + flags.b + flags.b * flags.k;
  const ctx = await createContext(contextOptions(flags, { nCtx: 4096, nSeqMax: maxBranches + 1 }));
  let mostRows = 0;
  const scheduler = new Scheduler(ctx, { onStep: (s) => (mostRows = Math.max(mostRows, s.rows)) });
  out.trace(scheduler); // --jsonl: the requests' branch trees too, for the page of `llama-branch serve`
  out.emit('start', { k: flags.k, b: flags.b, levels: flags.levels, maxBranches, model: ctx.modelDescription });
  out.say(`tree of thought: ${flags.levels} levels, ${flags.k} candidates per line, best ${flags.b} kept`);

  const best = await scheduler.run(
    async (root) => {
      root.append(flags.prompt);
      let beam = [{ line: root, score: 0, steps: [] }];
      for (let level = 1; level <= flags.levels; level++) {
        const candidates = [];
        await Promise.all(
          beam.map(async (node) => {
            const children = node.line.fork(flags.k);
            node.line.release(); // freed once its children have forked it
            const params = { temperature: 1.0, topP: 0.95 };
            const gens = children.map((c) => c.gen({ maxTokens: flags.maxTokens, params, logprobs: true }));
            (await Promise.all(gens)).forEach((g, i) => {
              const mean = g.logprobs.reduce((s, l) => s + l.logprob, 0) / Math.max(1, g.logprobs.length);
              candidates.push({ line: children[i], score: mean, steps: [...node.steps, g.text], parent: node });
            });
          }),
        );
        candidates.sort((a, b) => b.score - a.score);
        beam = candidates.slice(0, flags.b);
        for (const pruned of candidates.slice(flags.b)) pruned.line.release();
        out.emit('level', {
          level,
          candidates: candidates.length,
          kept: beam.map((n) => ({ score: round(n.score, 4), step: n.steps.at(-1) })),
          scores: candidates.map((n) => round(n.score, 4)),
        });
        out.say(
          `level ${level}: ${candidates.length} candidates, kept ${beam.map((n) => n.score.toFixed(2)).join(', ')}`,
        );
        if (level < flags.levels) for (const n of beam) n.line.append('\nStep:');
      }
      return { score: beam[0].score, steps: beam[0].steps, text: beam[0].line.text };
    },
    { maxBranches, seed: flags.seed },
  );
  await scheduler.close();
  out.emit('complete', {
    score: round(best.score, 4),
    steps: best.steps,
    mostRowsPerDecode: mostRows,
    elapsedMs: Date.now() - started,
  });
  out.say(`\nbest path (mean log-probability ${best.score.toFixed(3)}):\n${oneLine(best.text)}`);
  ctx.dispose();
});
