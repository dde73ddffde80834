#!/usr/bin/env node
'use strict';

// Best-first tree of thought with backtracking, as a branch program holding more lines than it
// has leases: every candidate step is a line; the best-scored line of the whole frontier is
// expanded next, wherever it is in the tree (the search backtracks when a deeper step scores
// worse than a shallower one), and every line waiting in the frontier is parked (line.park():
// its lease and own KV cells given back, its state kept in host memory) until it is chosen,
// then resumed exactly where it was. The program declares 1 + k leases; the frontier grows to
// about expansions × (k − 1) parked lines.

const { createContext, Scheduler, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/backtrack-search.js [--jsonl] [--model path] [--k 3] [--expansions 6]
                                         [--max-tokens 12] [--seed 1] [--prompt text]`;

/** A frontier line's score: the mean log-probability of every token of its steps. */
const meanOf = (node) => node.sum / Math.max(1, node.count);

run(async () => {
  const flags = parseFlags(USAGE, {
    k: 3,
    expansions: 6,
    maxTokens: 12,
    seed: 1,
    prompt: 'Plan a short trip to the sea, one step per line.\nStep 1:',
  });
  const out = output(flags);
  const started = Date.now();
  const maxBranches = 1 + flags.k; // the line expanded and its k candidates
  const ctx = await createContext(contextOptions(flags, { nCtx: 4096, nSeqMax: maxBranches + 1 }));
  const store = new BranchStore(ctx);
  const scheduler = new Scheduler(ctx);
  let [peakLeases, peakParked] = [0, 0];
  const gauge = () => {
    peakLeases = Math.max(peakLeases, ctx.nSeqMax - store.available);
    peakParked = Math.max(peakParked, store.parkStats().parked);
  };
  out.trace(scheduler);
  out.emit('start', { k: flags.k, expansions: flags.expansions, maxBranches, model: ctx.modelDescription });
  out.say(`best-first search: ${flags.expansions} expansions of ${flags.k} candidates, ${maxBranches} leases`);

  const best = await scheduler.run(
    async (root) => {
      root.append(flags.prompt);
      const frontier = [{ line: root, sum: 0, count: 0, steps: [], depth: 0 }];
      for (let expansion = 1; expansion <= flags.expansions && frontier.length > 0; expansion++) {
        frontier.sort((a, b) => meanOf(b) - meanOf(a));
        const node = frontier.shift();
        const backtracked = frontier.some((n) => n.depth > node.depth);
        if (node.line.parked) await node.line.resume();
        if (node.depth > 0) node.line.append('\nStep:');
        const children = node.line.fork(flags.k);
        node.line.release(); // freed once its children have forked it
        const params = { temperature: 1.0, topP: 0.95 };
        const gens = await Promise.all(
          children.map((c) => c.gen({ maxTokens: flags.maxTokens, params, logprobs: true })),
        );
        gauge();
        const made = gens.map((g, i) => ({
          line: children[i],
          sum: node.sum + g.logprobs.reduce((s, l) => s + l.logprob, 0),
          count: node.count + g.logprobs.length,
          steps: [...node.steps, g.text],
          depth: node.depth + 1,
        }));
        await Promise.all(made.map((n) => n.line.park())); // parked in one step, until chosen
        frontier.push(...made);
        gauge();
        out.emit('expand', {
          expansion,
          depth: node.depth,
          score: round(meanOf(node), 4),
          backtracked,
          frontier: frontier.length,
          parked: store.parkStats().parked,
        });
        out.say(
          `expansion ${expansion}: depth ${node.depth}${backtracked ? ' (backtracked)' : ''}, frontier ${frontier.length}`,
        );
      }
      frontier.sort((a, b) => meanOf(b) - meanOf(a));
      const top = frontier[0];
      return { score: meanOf(top), steps: top.steps, depth: top.depth, text: top.line.text };
    },
    { maxBranches, seed: flags.seed },
  );
  await scheduler.close();
  out.emit('complete', {
    score: round(best.score, 4),
    depth: best.depth,
    steps: best.steps,
    peakLeases,
    peakParked,
    parkedAtEnd: store.parkStats().parked,
    elapsedMs: Date.now() - started,
  });
  out.say(`\nbest line (depth ${best.depth}, mean log-probability ${best.score.toFixed(3)}):\n${oneLine(best.text)}`);
  out.say(`peak leases ${peakLeases} of ${maxBranches}; peak parked lines ${peakParked}`);
  ctx.dispose();
});
