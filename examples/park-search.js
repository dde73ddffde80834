#!/usr/bin/env node
'use strict';

// A best-first search over a tree of continuations that is bigger than the context: every node is
// a branch (a fork of its parent, one greedy-ranked token further); after a node is expanded its
// children and the node itself are parked (branch.park(): the sequence and the own cells given
// back, the state kept in RAM or a spill file), and the next node to expand, wherever it is in
// the tree, is resumed (with its parked ancestors) exactly where it was. The context holds only
// the path being expanded: nSeqMax 16 serves thousands of nodes, and under `deterministic: true`
// the best path is the one a context keeping every node live finds (test/park.test.js).

const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/park-search.js [--jsonl] [--model path] [--width 4] [--depth 5]
                                   [--n-seq-max 16] [--spill-dir dir] [--ram-mib 64] [--prompt text]`;

/** The `k` highest logits' token ids, best first (ties by id). */
function topTokens(logits, k) {
  const ids = [];
  for (let i = 0; i < logits.length; i++) {
    if (ids.length === k && logits[i] <= logits[ids[k - 1]]) continue;
    ids.push(i);
    ids.sort((a, b) => logits[b] - logits[a] || a - b);
    if (ids.length > k) ids.pop();
  }
  return ids;
}

/** Lower first: the path's perplexity, then its tokens (a total order, so both runs agree). */
function better(x, y) {
  if (x.score !== y.score) return x.score - y.score;
  for (let i = 0; i < Math.min(x.tokens.length, y.tokens.length); i++)
    if (x.tokens[i] !== y.tokens[i]) return x.tokens[i] - y.tokens[i];
  return x.tokens.length - y.tokens.length;
}

/**
 * Expands every node up to `depth` into its `width` most likely next tokens, best node first;
 * with `park`, each expanded node and its children are parked until they are needed again.
 * Resolves the best leaf `{ tokens, score }`, the node count and the peak leases and KV cells.
 */
async function search(ctx, { prompt, width, depth, park, onNode = () => {} }) {
  const store = new BranchStore(ctx);
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(await ctx.tokenize(prompt));
  const frontier = [{ branch: root, depth: 0, tokens: [], score: 0 }];
  const peak = { leases: 0, cells: 0 };
  const measure = () => {
    peak.leases = Math.max(peak.leases, ctx.nSeqMax - store.available);
    peak.cells = Math.max(peak.cells, store.kvPressure().cellsUsed);
  };
  // Every node's Branch object stays reachable until the end: a wrapper the GC collects frees
  // its branch, and a search that keeps its nodes live must keep them (so does the parked one,
  // whose nodes come back later).
  const all = [root];
  let nodes = 0;
  let best = null;
  while (frontier.length > 0) {
    frontier.sort(better);
    const node = frontier.shift();
    const resumed = node.branch.parked ? await store.resume([node.branch]) : [];
    const children = [];
    for (const token of topTokens(node.branch.getLogits(), width)) {
      const branch = node.branch.fork();
      all.push(branch);
      await branch.commit(token);
      nodes++;
      measure();
      const child = { branch, depth: node.depth + 1, tokens: [...node.tokens, token], score: branch.perplexity };
      onNode(child);
      if (child.depth < depth) {
        children.push(child);
        if (park) await branch.park(); // before the next sibling takes a sequence
      } else {
        if (!best || better(child, best) < 0) best = { tokens: child.tokens, score: child.score };
        if (park) await branch.prune(); // a leaf is never expanded: nothing to keep
      }
    }
    frontier.push(...children);
    // The path resumed for this node goes back too (the root, never parked, stays).
    const path = resumed.filter((b) => b !== root);
    if (park && path.length > 0) await store.park(path);
  }
  await root.pruneSubtree(); // parked nodes too: their spill files go with them
  all.length = 0;
  const stats = store.parkStats();
  return { best, nodes, peakLeases: peak.leases, peakCells: peak.cells, parkStats: stats };
}

module.exports = { search, topTokens };

if (require.main === module)
  run(async () => {
    const flags = parseFlags(USAGE, {
      width: 4,
      depth: 5,
      nSeqMax: 16,
      spillDir: '',
      ramMib: 64,
      prompt: 'The three most useful things to pack for a week of hiking are',
    });
    const out = output(flags);
    const started = Date.now();
    const ctx = await createContext(contextOptions(flags, { nCtx: 2048, nSeqMax: flags.nSeqMax, deterministic: true }));
    const store = new BranchStore(ctx);
    if (flags.spillDir) store.setParkSpill({ ramBytes: flags.ramMib * 2 ** 20, dir: flags.spillDir });
    out.emit('start', { width: flags.width, depth: flags.depth, nSeqMax: flags.nSeqMax });
    out.say(`best-first search, ${flags.width} children per node, depth ${flags.depth}, nSeqMax ${flags.nSeqMax}`);
    let shown = 0;
    let total = 0;
    for (let d = 1, n = 1; d <= flags.depth; d++) total += n *= flags.width;
    const result = await search(ctx, {
      prompt: flags.prompt,
      width: flags.width,
      depth: flags.depth,
      park: true,
      onNode: () => out.progress('nodes', ++shown, total),
    });
    const text = await ctx.detokenize(result.best.tokens);
    const done = {
      nodes: result.nodes,
      bestText: text,
      bestPerplexity: round(result.best.score, 4),
      peakLeases: result.peakLeases,
      peakCells: result.peakCells,
      parkedBytesAtEnd: result.parkStats.ramBytes,
      spilledAtEnd: result.parkStats.spilled,
      seconds: round((Date.now() - started) / 1000, 2),
    };
    out.emit('complete', done);
    out.say(
      `${done.nodes} nodes on ${flags.nSeqMax} sequences (peak ${done.peakLeases} leases, ${done.peakCells} KV cells)`,
    );
    out.say(`best path (perplexity ${done.bestPerplexity}): ${oneLine(flags.prompt)}${oneLine(text)}`);
    ctx.dispose();
  });
