#!/usr/bin/env node
'use strict';

// A small tree search over continuations: expand every frontier node into B sampled children
// (forks share the path's KV cells), roll all children out by L tokens together (one batched
// commit per token), score them by path perplexity, keep the best M as the next frontier and
// prune the rest. At the end `store.retainOnly(best)` frees the whole tree except the best leaf
// in one pass.

const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/tree-search.js [--jsonl] [--model path] [--depth 3] [--branching 3]
                                   [--keep 2] [--segment 6] [--seed 11] [--prompt text]`;

run(async () => {
  const flags = parseFlags(USAGE, {
    depth: 3,
    branching: 3,
    keep: 2,
    segment: 6,
    seed: 11,
    prompt: 'A good name for a coffee shop next to a library would be',
  });
  const out = output(flags);
  const started = Date.now();
  const { depth: D, branching: B, keep: M, segment: L } = flags;

  // Alive at the widest point: the root, M kept nodes per finished level, M * B new children.
  const nSeqMax = 1 + M * (D - 1) + M * B;
  const ctx = await createContext(contextOptions(flags, { nCtx: 4096, nSeqMax }));
  const trace = out.trace(ctx); // --jsonl: the tree's events too, for the page of `llama-branch serve`
  const store = new BranchStore(ctx);
  const prompt = await ctx.tokenize(flags.prompt);
  out.emit('start', { depth: D, branching: B, keep: M, segment: L, nSeqMax, promptTokens: prompt.length });
  out.say(`tree search: depth ${D}, ${B} children per node, keep ${M}, ${L} tokens per edge: ${oneLine(flags.prompt)}`);

  const rootBranch = Branch.create(ctx, 0, { temperature: 1.0, topK: 40, seed: flags.seed });
  await rootBranch.prefill(prompt);
  const root = { id: 0, branch: rootBranch, text: '', ppl: NaN, depth: 0, children: [], alive: true };
  let nextId = 1;
  let frontier = [root];
  let expanded = 0;
  let pruned = 0;

  for (let level = 1; level <= D; level++) {
    // Expand: B forks per frontier node, each with its own RNG seed.
    const children = [];
    for (const node of frontier) {
      for (let c = 0; c < B; c++) {
        const branch = node.branch.fork();
        branch.reseedSampler(flags.seed * 1000 + nextId);
        const child = {
          id: nextId++,
          branch,
          parent: node,
          text: '',
          ppl: NaN,
          depth: level,
          children: [],
          alive: true,
          ended: false,
        };
        node.children.push(child);
        children.push(child);
      }
      expanded++;
    }

    // Roll out: L tokens for all children, ONE batched decode per token.
    for (let t = 0; t < L; t++) {
      const live = children.filter((c) => !c.ended);
      if (live.length === 0) break;
      const produced = store.produce(live.map((c) => c.branch));
      const pairs = [];
      produced.forEach((p, i) => {
        if (p.isStop) live[i].ended = true;
        else {
          live[i].text += p.text;
          pairs.push([live[i].branch, p.token]);
        }
      });
      await store.commit(pairs);
      out.progress(`level ${level}/${D}`, t + 1, L);
    }

    // Score by path perplexity (accepted tokens since the prompt), keep the best M.
    for (const c of children) c.ppl = c.branch.perplexity;
    const ranked = [...children].sort((a, b) => a.ppl - b.ppl);
    const kept = ranked.slice(0, M);
    for (const c of ranked.slice(M)) {
      await c.branch.prune();
      c.alive = false;
      pruned++;
    }
    out.emit('level', {
      level,
      expanded: children.length,
      kept: kept.map((c) => ({ id: c.id, parent: c.parent.id, ppl: round(c.ppl), text: c.text })),
      prunedIds: ranked.slice(M).map((c) => c.id),
      kvCellsUsed: store.kvPressure().cellsUsed,
    });
    frontier = kept;
  }

  const best = frontier[0];
  const path = [];
  for (let n = best; n && n !== root; n = n.parent) path.unshift(n);
  const bestText = path.map((n) => n.text).join('');

  if (!out.jsonl) {
    out.say('\nsearch tree (ppl = path perplexity; x = pruned, * = best path):');
    const show = (node, indent) => {
      for (const c of node.children) {
        const mark = path.includes(c) ? '*' : c.alive ? ' ' : 'x';
        out.say(`${indent}${mark} #${c.id} ppl ${c.ppl.toFixed(2).padStart(6)}  ${oneLine(c.text)}`);
        if (c.children.length) show(c, `${indent}    `);
      }
    };
    show(root, '  ');
  }

  const kvBefore = store.kvPressure();
  const liveBefore = nSeqMax - store.available;
  if (trace) trace.finish(best.branch, 'best');
  await store.retainOnly(best.branch); // the root, inner nodes and other leaves go in one pass
  const kvAfter = store.kvPressure();
  out.say(`\nbest: ${oneLine(flags.prompt + bestText)} (ppl ${best.ppl.toFixed(2)})`);
  out.say(
    `retainOnly: ${liveBefore} branches -> ${nSeqMax - store.available}, KV cells ${kvBefore.cellsUsed} -> ${kvAfter.cellsUsed}`,
  );
  out.emit('complete', {
    bestId: best.id,
    bestPpl: round(best.ppl),
    bestText,
    bestPosition: best.branch.position,
    nodesExpanded: expanded,
    pruned,
    liveBefore,
    liveAfter: nSeqMax - store.available,
    kvCellsBefore: kvBefore.cellsUsed,
    kvCellsAfter: kvAfter.cellsUsed,
    elapsedMs: Date.now() - started,
  });
  ctx.dispose();
});
