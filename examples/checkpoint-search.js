#!/usr/bin/env node
'use strict';

// Checkpoint a tree search and resume it in another process. A search expands every frontier
// node into B reseeded children, rolls them out L tokens (one batched commit per token) and
// keeps the M with the lowest path perplexity. After `--checkpoint-after` levels the whole live
// tree goes to one file with `store.saveTree` — KV cells (each shared prefix once), sampler
// state (seeds, RNG draws), logits snapshots — with the search's own bookkeeping as `meta`.
// A child process (this script with `--resume FILE`) restores it with
// `BranchStore.restoreTree` and finishes the search; this process finishes it too, from its
// live tree, and both must find the same best continuation, token for token. That needs
// `deterministic: true` (on by default here; `--deterministic=false` turns it off): the live
// tree's branches decode beside siblings that the restored tree no longer has, in other batch
// shapes and with their cells elsewhere in the KV buffer, and only a deterministic context
// gives a branch the same logits either way (docs/determinism.md).

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { createContext, Branch, BranchStore } = require('llama-branch');
const { parseFlags, contextOptions, output, run, oneLine, round } = require('./_common');

const USAGE = `usage: node examples/checkpoint-search.js [--jsonl] [--model path] [--depth 3] [--branching 3]
                                   [--keep 2] [--segment 6] [--seed 11] [--checkpoint-after 2]
                                   [--prompt text] [--resume file] [--file path]
                                   [--deterministic=false]`;

/** Levels `from`..`depth` of the search over `nodes` (id → { branch, parent, text, tokens }). */
async function search(store, state, flags, out) {
  const { depth: D, branching: B, keep: M, segment: L } = flags;
  for (let level = state.level + 1; level <= D; level++) {
    const children = [];
    for (const id of state.frontier) {
      const node = state.nodes.get(id);
      for (let c = 0; c < B; c++) {
        const childId = state.nextId++;
        const branch = node.branch.fork();
        branch.reseedSampler(flags.seed * 1000 + childId);
        const child = { id: childId, parent: id, branch, text: '', tokens: [] };
        state.nodes.set(childId, child);
        children.push(child);
      }
    }
    for (let t = 0; t < L; t++) {
      const produced = store.produce(children.map((c) => c.branch));
      produced.forEach((p, i) => {
        children[i].text += p.text;
        children[i].tokens.push(p.token);
      });
      await store.commit(produced.map((p, i) => [children[i].branch, p.token]));
    }
    const ranked = [...children].sort((a, b) => a.branch.perplexity - b.branch.perplexity);
    for (const c of ranked.slice(M)) {
      await c.branch.prune();
      state.nodes.delete(c.id);
    }
    state.frontier = ranked.slice(0, M).map((c) => c.id);
    state.level = level;
    out.emit('level', { level, kept: state.frontier, kvCellsUsed: store.kvPressure().cellsUsed });
  }
  const best = state.nodes.get(state.frontier[0]);
  const tokens = [];
  const texts = [];
  for (let n = best; n && n.parent !== null; n = state.nodes.get(n.parent)) {
    tokens.unshift(...n.tokens);
    texts.unshift(n.text);
  }
  return { bestId: best.id, ppl: best.branch.perplexity, tokens, text: texts.join('') };
}

/**
 * The order saveTree stores branches in: depth first from the root, each branch's children in
 * the order they were forked (`branch.children`), so the bookkeeping can name each node's
 * branch by its index before the file is written.
 */
function saveOrder(state, rootId) {
  const byHandle = new Map([...state.nodes.values()].map((n) => [n.branch.handle, n.branch]));
  const order = [];
  const visit = (branch) => {
    order.push(branch);
    for (const h of branch.children) visit(byHandle.get(h));
  };
  visit(state.nodes.get(rootId).branch);
  return order;
}

/** The search's bookkeeping without branches (the tree file carries those, in `order`). */
function bookkeeping(state, order) {
  const index = new Map(order.map((b, i) => [b, i]));
  return {
    level: state.level,
    nextId: state.nextId,
    frontier: state.frontier,
    nodes: [...state.nodes.values()].map((n) => ({
      id: n.id,
      parent: n.parent,
      text: n.text,
      tokens: n.tokens,
      branch: index.get(n.branch),
    })),
  };
}

run(async () => {
  const flags = parseFlags(USAGE, {
    depth: 3,
    branching: 3,
    keep: 2,
    segment: 6,
    seed: 11,
    checkpointAfter: 2,
    prompt: 'A good name for a coffee shop next to a library would be',
    resume: '',
    file: '',
    deterministic: true,
  });
  const out = output(flags);
  const started = Date.now();
  const { depth: D, branching: B, keep: M } = flags;
  const nSeqMax = 2 + M * D + M * B; // every kept node, the widest level, and saveTree's scratch
  const ctx = await createContext(contextOptions(flags, { nCtx: 4096, nSeqMax, deterministic: flags.deterministic }));
  const store = new BranchStore(ctx);

  if (flags.resume) {
    // The child: the tree and the search's bookkeeping come from the file.
    const t0 = Date.now();
    const restored = await BranchStore.restoreTree(ctx, flags.resume);
    const saved = JSON.parse(restored.meta);
    const state = { level: saved.level, nextId: saved.nextId, frontier: saved.frontier, nodes: new Map() };
    for (const n of saved.nodes) state.nodes.set(n.id, { ...n, branch: restored.branches[n.branch] });
    const restoreMs = Date.now() - t0;
    const result = await search(store, state, flags, out);
    out.emit('resumed', { pid: process.pid, restoreMs, branches: restored.branches.length, ...result });
    out.say(`resumed in process ${process.pid}: ${oneLine(result.text)}`);
    ctx.dispose();
    return;
  }

  const root = Branch.create(ctx, 0, { temperature: 1.0, topK: 40, seed: flags.seed });
  await root.prefill(await ctx.tokenize(flags.prompt));
  const state = {
    level: 0,
    nextId: 1,
    frontier: [0],
    nodes: new Map([[0, { id: 0, parent: null, branch: root, text: '', tokens: [] }]]),
  };
  out.emit('start', {
    depth: D,
    branching: B,
    keep: M,
    checkpointAfter: flags.checkpointAfter,
    nSeqMax,
    deterministic: ctx.deterministic,
  });
  out.say(`tree search: depth ${D}, ${B} children per node, keep ${M}: ${oneLine(flags.prompt)}`);
  await search(store, state, { ...flags, depth: flags.checkpointAfter }, out);

  // Checkpoint: the live tree (root, kept inner nodes, frontier) and the bookkeeping.
  const file = flags.file || path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'checkpoint-search-')), 'search.lbt');
  const order = saveOrder(state, 0);
  let t0 = Date.now();
  const saved = await store.saveTree(root, file, { meta: JSON.stringify(bookkeeping(state, order)) });
  const saveMs = Date.now() - t0;
  if (saved.branches.some((b, i) => b !== order[i])) throw new Error('saveTree stored another order');
  out.emit('checkpoint', {
    level: state.level,
    branches: saved.branches.length,
    live: order.length,
    bytes: saved.bytes,
    kvBytes: saved.kvBytes,
    logitsBytes: saved.logitsBytes,
    kvCellsUsed: store.kvPressure().cellsUsed,
    saveMs,
  });
  out.say(
    `checkpoint after level ${state.level}: ${saved.branches.length} branches, ${(saved.bytes / 1e6).toFixed(1)} MB (KV ${(saved.kvBytes / 1e6).toFixed(1)} MB, logits ${(saved.logitsBytes / 1e6).toFixed(1)} MB)`,
  );

  // Another process resumes from the file ...
  t0 = Date.now();
  const childArgs = [__filename, '--jsonl', '--resume', file, '--model', flags.model];
  childArgs.push(`--deterministic=${flags.deterministic}`);
  for (const k of ['depth', 'branching', 'keep', 'segment', 'seed', 'threads'])
    childArgs.push(`--${k}`, String(flags[k]));
  const child = execFileSync(process.execPath, childArgs, { encoding: 'utf8' });
  const resumed = child
    .split('\n')
    .filter(Boolean)
    .map((l) => JSON.parse(l))
    .find((e) => e.event === 'resumed');
  const childMs = Date.now() - t0;

  // ... and this one goes on from its live tree: the same search, the same result.
  const here = await search(store, state, flags, out);
  const same = JSON.stringify(here.tokens) === JSON.stringify(resumed.tokens);
  out.say(`\nbest here:    ${oneLine(here.text)} (ppl ${here.ppl.toFixed(2)})`);
  out.say(`best resumed: ${oneLine(resumed.text)} (child process, restore ${resumed.restoreMs} ms)`);
  out.say(same ? 'the resumed search found the same continuation, token for token' : 'the two searches differ');
  out.emit('complete', {
    bestId: here.bestId,
    bestPpl: round(here.ppl),
    bestText: here.text,
    resumedBestId: resumed.bestId,
    resumedText: resumed.text,
    restoreMs: resumed.restoreMs,
    childMs,
    same,
    elapsedMs: Date.now() - started,
  });
  if (!flags.file) fs.rmSync(path.dirname(file), { recursive: true, force: true });
  ctx.dispose();
});
