#!/usr/bin/env node
'use strict';

/**
 * Where one branch's logits depend on the rest of the decode (issue 51, docs/determinism.md).
 * For each kernel setting and thread count, one branch ("the target") is prefilled with a prompt
 * and then fed the same 4 tokens (teacher-forced, so a difference cannot cascade into other
 * tokens) in many situations; every logits row it gets is compared with the row of the
 * reference run (the prompt in one decode, each token decoded alone). The table prints, per
 * situation, the largest |Δlogit| over the rows: `0` means bitwise identical.
 *
 * Settings: the defaults, flash attention off, a q8_0 KV cache; with LLAMA_BRANCH_DIAG_KERNELS
 * (read by createContext) only the repacked weights off ('norepack'), only the CPU backend's
 * reference kernels on ('ref'), both; and `deterministic: true` (f16 and q8_0 KV). Each setting
 * runs in its own process, with nThreads 1 and 2; the last table compares the reference rows
 * across the two thread counts.
 *
 * Usage: node bench/determinism-sources.js [--prompt=200] [--only=<setting name>] [--threads=1,2]
 * Timing is not measured here; bench/determinism.js measures the cost.
 */

const { execFileSync } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const crypto = require('node:crypto');
const { args, modelPath } = require('./common');

const SETTINGS = [
  { name: 'default', options: {} },
  { name: 'fa-off', options: { flashAttention: 'off' } },
  { name: 'kv-q8_0', options: { typeK: 'q8_0', typeV: 'q8_0' } },
  { name: 'norepack', options: {}, diag: 'norepack' },
  { name: 'ref', options: {}, diag: 'ref' },
  { name: 'norepack+ref', options: {}, diag: 'norepack,ref' },
  { name: 'norepack+ref fa-off', options: { flashAttention: 'off' }, diag: 'norepack,ref' },
  { name: 'deterministic', options: { deterministic: true } },
  { name: 'deterministic q8_0', options: { deterministic: true, typeK: 'q8_0', typeV: 'q8_0' } },
];
const PROMPT_TOKENS = Number(args.prompt || 200);
const STEPS = 4;
const TEXT =
  'The history of the city began with a small settlement by the river, where traders met every spring to exchange grain, cloth and stories about the lands beyond the mountains. ';
const OTHER_TEXTS = [
  'In mathematics, a prime number is a natural number greater than one that has no divisors other than one and itself. ',
  'Recipe: whisk two eggs with a cup of milk, add flour slowly, and let the batter rest before frying. ',
  'The committee met on Tuesday to discuss the budget, the new library wing and the winter schedule. ',
  'Photosynthesis turns light, water and carbon dioxide into sugar and oxygen inside the leaves. ',
];

/** max |a - b| over two rows (0 only when every element is equal). */
function maxDiff(a, b) {
  let m = 0;
  for (let i = 0; i < a.length; i++) {
    const d = Math.abs(a[i] - b[i]);
    if (d > m || Number.isNaN(d)) m = Number.isNaN(d) ? Infinity : d;
  }
  return m;
}

function argmax(a) {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

/** One setting at one thread count, in this process: `{ situations: {name: maxDiff}, refHash }` on stdout. */
async function one(setting, nThreads) {
  const { createContext, Branch, BranchStore } = require('..');
  const ctx = await createContext({
    modelPath: modelPath(),
    nCtx: 8192,
    nBatch: 512,
    nSeqMax: 72,
    nThreads,
    ...setting.options,
  });
  const store = new BranchStore(ctx);
  const tokenize = async (text, n) => {
    let t = await ctx.tokenize(text.repeat(Math.ceil((n * 6) / text.length) + 1));
    return t.slice(0, n);
  };
  const prompt = await tokenize(TEXT, PROMPT_TOKENS);
  const others = await Promise.all(OTHER_TEXTS.map((t, i) => tokenize(t, 40 + 37 * i)));
  const newBranch = () => Branch.create(ctx, 0, { temperature: 0 });

  // The reference: the prompt in one decode, then each forced token decoded alone.
  const ref = newBranch();
  await ref.prefill(prompt);
  const refRows = [ref.getLogits()];
  const forced = [];
  for (let s = 0; s < STEPS; s++) {
    const t = argmax(refRows[refRows.length - 1]);
    forced.push(t);
    await ref.commit(t);
    refRows.push(ref.getLogits());
  }
  await ref.prune();
  const compare = (rows) => Math.max(...rows.map((r, i) => (r ? maxDiff(r, refRows[i]) : 0)));
  const results = {};

  /** Feeds the forced tokens to `b` alone, one decode each; rows[0] is what it holds now. */
  const alone = async (b) => {
    const rows = [b.getLogits()];
    for (const t of forced) {
      await b.commit(t);
      rows.push(b.getLogits());
    }
    return rows;
  };
  /** Makes `n` other branches, each prefilled with its own text (varied lengths). */
  const makeOthers = async (n) => {
    const bs = [];
    for (let i = 0; i < n; i++) {
      const b = newBranch();
      await b.prefill(others[i % others.length].slice(0, 20 + ((i * 13) % 100)));
      bs.push(b);
    }
    return bs;
  };

  {
    const b = newBranch();
    await b.prefill(prompt);
    results['again (same path)'] = compare(await alone(b));
    await b.prune();
  }
  {
    const b = newBranch();
    await b.prefill(prompt.slice(0, -1));
    await b.commit(prompt[prompt.length - 1]);
    const rows = await alone(b);
    results['prompt: last token alone'] = compare(rows);
    await b.prune();
  }
  {
    const b = newBranch();
    for (let i = 0; i < prompt.length; i += 64) await b.prefill(prompt.slice(i, i + 64));
    results['prompt: chunks of 64'] = compare(await alone(b));
    await b.prune();
  }
  {
    const b = newBranch();
    for (let i = 0; i < prompt.length; i += 7) await b.prefill(prompt.slice(i, i + 7));
    results['prompt: chunks of 7'] = compare(await alone(b));
    await b.prune();
  }
  // Batched decode steps: the target among n-1 other branches, at the front, back or middle.
  // The others are made once and only grow; each target is a fork of one prefilled prompt
  // (its cells are the prompt's own: 'fork of the prompt' below checks that a fork is exact).
  const template = newBranch();
  await template.prefill(prompt);
  const pool = await makeOthers(63);
  for (const n of [2, 4, 8, 64]) {
    let worst = 0;
    for (const where of ['first', 'last', 'middle']) {
      const b = template.fork();
      const rest = pool.slice(0, n - 1);
      const rows = [b.getLogits()];
      for (const t of forced) {
        const entries = rest.map((o, i) => [o, others[i % others.length][i % 7]]);
        const at = where === 'first' ? 0 : where === 'last' ? entries.length : entries.length >> 1;
        entries.splice(at, 0, [b, t]);
        await store.commit(entries);
        rows.push(b.getLogits());
      }
      worst = Math.max(worst, compare(rows));
      await b.prune();
    }
    results[`decode among ${n} rows (3 orders)`] = worst;
  }
  await Promise.all([template, ...pool].map((x) => x.prune()));
  {
    // The prompt's own decode shared with other prompts (prefill rows of several sequences).
    const b = newBranch();
    const rest = await makeOthers(7);
    await store.prefill([...rest.map((o, i) => [o, others[i % others.length].slice(0, 30)]), [b, prompt]]);
    results['prompt prefilled beside 7 others'] = compare(await alone(b));
    await Promise.all([b, ...rest].map((x) => x.prune()));
  }
  {
    // Each forced token decoded in the same decode as other branches' multi-token prefills.
    const b = newBranch();
    await b.prefill(prompt);
    const rest = await makeOthers(3);
    const rows = [b.getLogits()];
    for (const t of forced) {
      await store.prefill([
        [rest[0], others[1].slice(0, 50)],
        [b, [t]],
        [rest[1], others[2].slice(0, 9)],
      ]);
      rows.push(b.getLogits());
    }
    results['decode row beside prefill rows'] = compare(rows);
    await Promise.all([b, ...rest].map((x) => x.prune()));
  }
  {
    const parent = newBranch();
    await parent.prefill(prompt);
    const child = parent.fork();
    await parent.prune();
    results['fork of the prompt'] = compare(await alone(child));
    await child.prune();
  }
  {
    // A fork in the middle of the prompt: the shared prefix, then the child's own prefill.
    const parent = newBranch();
    await parent.prefill(prompt.slice(0, 100));
    const child = parent.fork();
    await child.prefill(prompt.slice(100));
    results['fork at 100, rest prefilled'] = compare(await alone(child));
    await Promise.all([parent, child].map((x) => x.prune()));
  }
  {
    // The target's cells start at another place in the buffer (37 cells in use before it).
    const junk = newBranch();
    await junk.prefill(others[0].slice(0, 37));
    const b = newBranch();
    await b.prefill(prompt);
    await junk.prune();
    results['cells at buffer offset 37'] = compare(await alone(b));
    await b.prune();
  }
  {
    // Cells out of position order: 300 cells in use, the target's prompt after them, then those
    // cells freed, so the target's next cells come BEFORE its prompt's (llama.cpp restarts its
    // search at cell 0 once enough cells before its head are free).
    const junk = newBranch();
    await junk.prefill(await tokenize(OTHER_TEXTS[3], 300));
    const b = newBranch();
    await b.prefill(prompt);
    await junk.prune();
    results['later cells before the prompt'] = compare(await alone(b));
    await b.prune();
  }
  {
    const file = path.join(os.tmpdir(), `det-sources-${process.pid}.tree`);
    const b = newBranch();
    await b.prefill(prompt);
    await store.saveTree(b, file);
    await b.prune();
    const { root } = await BranchStore.restoreTree(ctx, file);
    fs.rmSync(file, { force: true });
    results['tree saved and restored'] = compare(await alone(root));
    await root.prune();
  }
  const refHash = crypto.createHash('sha256');
  for (const r of refRows) refHash.update(Buffer.from(r.buffer, r.byteOffset, r.byteLength));
  await ctx.dispose();
  process.stdout.write(JSON.stringify({ results, refHash: refHash.digest('hex').slice(0, 16) }) + '\n');
}

async function main() {
  if (args.child) {
    const setting = SETTINGS.find((s) => s.name === args.child);
    await one(setting, Number(args.threads));
    return;
  }
  const chosen = args.only ? SETTINGS.filter((s) => s.name === args.only) : SETTINGS;
  const table = {};
  const hashes = {};
  const threadCounts = args.threads ? String(args.threads).split(',').map(Number) : [1, 2];
  for (const setting of chosen) {
    for (const threads of threadCounts) {
      const out = execFileSync(
        process.execPath,
        [__filename, `--child=${setting.name}`, `--threads=${threads}`, `--prompt=${PROMPT_TOKENS}`],
        {
          env: { ...process.env, LLAMA_BRANCH_DIAG_KERNELS: setting.diag || '' },
          encoding: 'utf8',
          maxBuffer: 1 << 24,
        },
      );
      const { results, refHash } = JSON.parse(out.trim().split('\n').pop());
      const col = `${setting.name} t${threads}`;
      for (const [k, v] of Object.entries(results)) (table[k] ??= {})[col] = v === 0 ? '0' : v.toPrecision(2);
      hashes[setting.name] = [...(hashes[setting.name] || []), refHash];
      process.stderr.write(`${col}: ${JSON.stringify(results)} ref ${refHash}\n`);
    }
  }
  console.log(`max |Δlogit| against the reference run (prompt ${PROMPT_TOKENS} tokens, ${STEPS} forced tokens)`);
  console.table(table);
  if (threadCounts.length < 2) return;
  console.log('reference rows identical across nThreads 1 and 2:');
  console.table(Object.fromEntries(Object.entries(hashes).map(([k, [a, b]]) => [k, { identical: a === b }])));
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
