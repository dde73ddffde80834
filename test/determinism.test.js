'use strict';

// `deterministic: true` (issue 51, docs/determinism.md): one branch's logits at a position are
// the same bits however its decodes were shaped and wherever its prefix came from. Each case
// feeds the same tokens (teacher-forced, so a difference shows in the rows instead of moving
// the text) and compares every logits row byte for byte with the reference: the prompt in one
// decode, each token decoded alone. Without the option these rows differ (by up to ~1.5 logits
// on this model; bench/determinism-sources.js measures each source).

const assert = require('node:assert/strict');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, BranchStore, Scheduler } = require('..');
const { open, rejects, MODEL } = require('./helpers');

const FORCED = 4;
const PROMPT = 'The history of the printing press begins in the workshops of the fifteenth century, where';
const OTHER_PROMPTS = [
  'A recipe for bread: flour, water, salt and',
  'In 1969 the first people walked on',
  'The three primary colours are',
  'def fibonacci(n):\n    if n < 2:\n        return',
];

/** The rows' bytes, for a byte-for-byte comparison with a readable failure. */
const hex = (row) => Buffer.from(row.buffer, row.byteOffset, row.byteLength).toString('base64');

function assertSameRows(actual, expected, what) {
  assert.equal(actual.length, expected.length, `${what}: row count`);
  for (let i = 0; i < expected.length; i++) {
    if (hex(actual[i]) === hex(expected[i])) continue;
    let worst = 0;
    for (let j = 0; j < expected[i].length; j++) worst = Math.max(worst, Math.abs(actual[i][j] - expected[i][j]));
    assert.fail(`${what}: logits row ${i} differs from the reference (max |Δ| ${worst})`);
  }
}

function argmax(a) {
  let best = 0;
  for (let i = 1; i < a.length; i++) if (a[i] > a[best]) best = i;
  return best;
}

describe('deterministic: true', function () {
  this.timeout(300000);
  let ctx;
  let store;
  let prompt;
  let others;
  /** The reference: rows[0] after the prompt, rows[i] after forced[i - 1]. */
  let reference;
  let forced;
  const tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-determinism-'));

  const greedy = () => Branch.create(ctx, 0, { temperature: 0 });
  /** Feeds the forced tokens to `b`, each in a decode of its own. */
  const alone = async (b) => {
    const rows = [b.getLogits()];
    for (const t of forced) {
      await b.commit(t);
      rows.push(b.getLogits());
    }
    return rows;
  };

  before(async () => {
    ctx = await open({ deterministic: true, nCtx: 2048, nSeqMax: 16 });
    store = new BranchStore(ctx);
    prompt = await ctx.tokenize(PROMPT);
    others = await Promise.all(OTHER_PROMPTS.map((p) => ctx.tokenize(p)));
    const b = greedy();
    await b.prefill(prompt);
    reference = [b.getLogits()];
    forced = [];
    for (let i = 0; i < FORCED; i++) {
      forced.push(argmax(reference[i]));
      await b.commit(forced[i]);
      reference.push(b.getLogits());
    }
    await b.prune();
  });
  after(() => {
    if (ctx) ctx.dispose();
    fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('is reported by the context, needs flash attention and is checked', async () => {
    assert.equal(ctx.deterministic, true);
    assert.equal(ctx.flashAttention, 'on', "'auto' becomes 'on'");
    await rejects(() => open({ deterministic: true, flashAttention: 'off' }), 'ERR_INVALID_ARG', /flash attention/);
    await rejects(() => open({ deterministic: 'yes' }), 'ERR_INVALID_ARG', /deterministic/);
    const plain = await open();
    try {
      assert.equal(plain.deterministic, false);
    } finally {
      plain.dispose();
    }
  });

  it('the prompt in chunks, or its last token alone, gives the same rows', async () => {
    const chunked = greedy();
    for (let i = 0; i < prompt.length; i += 5) await chunked.prefill(prompt.slice(i, i + 5));
    assertSameRows(await alone(chunked), reference, 'prompt in chunks of 5');
    await chunked.prune();
    const lastAlone = greedy();
    await lastAlone.prefill(prompt.slice(0, -1));
    await lastAlone.commit(prompt[prompt.length - 1]);
    assertSameRows(await alone(lastAlone), reference, 'last prompt token decoded alone');
    await lastAlone.prune();
  });

  it('decoded with 7 other branches in the same decode, in several orders, gives the same rows', async () => {
    const rest = [];
    for (let i = 0; i < 7; i++) {
      const o = greedy();
      await o.prefill(others[i % others.length].slice(0, 3 + i));
      rest.push(o);
    }
    for (const where of [0, 3, 7]) {
      const b = greedy();
      await b.prefill(prompt);
      const rows = [b.getLogits()];
      for (const [step, t] of forced.entries()) {
        const entries = rest.map((o, i) => [o, others[(i + step) % others.length][step]]);
        // the order of the other rows changes every step too
        if (step % 2) entries.reverse();
        entries.splice(where, 0, [b, t]);
        await store.commit(entries);
        rows.push(b.getLogits());
      }
      assertSameRows(rows, reference, `target at row ${where} of 8`);
      await b.prune();
    }
    // Beside other branches' prompt rows in one decode: the prompt itself, then each token.
    const b = greedy();
    await store.prefill([
      [rest[0], others[1]],
      [b, prompt],
      [rest[1], others[2]],
    ]);
    const rows = [b.getLogits()];
    for (const t of forced) {
      await store.prefill([
        [rest[2], others[3]],
        [b, [t]],
      ]);
      rows.push(b.getLogits());
    }
    assertSameRows(rows, reference, 'beside prefill rows');
    await Promise.all([b, ...rest].map((x) => x.prune()));
  });

  it('a fork of the prompt, and a fork in its middle, give the same rows', async () => {
    const parent = greedy();
    await parent.prefill(prompt);
    const child = parent.fork();
    assertSameRows(await alone(child), reference, 'fork of the prompt');
    const half = greedy();
    await half.prefill(prompt.slice(0, 9));
    const grandchild = half.fork();
    await grandchild.prefill(prompt.slice(9));
    assertSameRows(await alone(grandchild), reference, 'fork at 9, the rest prefilled');
    await Promise.all([parent, child, half, grandchild].map((x) => x.prune()));
  });

  it("gives the same rows wherever the branch's cells sit, also when later cells come before earlier ones", async () => {
    // Cells in use before the prompt, then freed: llama.cpp goes back to cell 0 for the next
    // tokens, so they sit before the prompt's cells in the buffer.
    const junk = greedy();
    await junk.prefill([...others[0], ...others[1], ...others[2]]);
    const b = greedy();
    await b.prefill(prompt);
    await junk.prune();
    assertSameRows(await alone(b), reference, 'later cells before the prompt');
    await b.prune();
  });

  it('a tree restored in this process and in another process gives the same rows', async () => {
    const b = greedy();
    await b.prefill(prompt);
    const file = path.join(tmp, 'prompt.lbt');
    await store.saveTree(b, file);
    await b.prune();
    // Other cells in use first, so the restored cells sit elsewhere in the buffer.
    const junk = greedy();
    await junk.prefill(others[0]);
    const { root } = await BranchStore.restoreTree(ctx, file);
    assertSameRows(await alone(root), reference, 'tree restored here');
    await Promise.all([root, junk].map((x) => x.prune()));

    const script = `
      const { BranchStore, createContext } = require(${JSON.stringify(path.resolve(__dirname, '..'))});
      (async () => {
        const ctx = await createContext({ modelPath: ${JSON.stringify(MODEL)}, nCtx: 1024, nThreads: 2, nSeqMax: 4, deterministic: true });
        const { root } = await BranchStore.restoreTree(ctx, ${JSON.stringify(file)});
        const rows = [root.getLogits()];
        for (const t of ${JSON.stringify(forced)}) {
          await root.commit(t);
          rows.push(root.getLogits());
        }
        process.stdout.write(JSON.stringify(rows.map((r) => Buffer.from(r.buffer, r.byteOffset, r.byteLength).toString('base64'))));
        ctx.dispose();
      })().catch((e) => { console.error(e); process.exit(1); });`;
    const stdout = await new Promise((resolve, reject) =>
      execFile(process.execPath, ['-e', script], { timeout: 240000, maxBuffer: 1 << 26 }, (err, out, errOut) =>
        err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(out),
      ),
    );
    const rows = JSON.parse(stdout).map((s) => {
      const buf = Buffer.from(s, 'base64');
      return new Float32Array(buf.buffer, buf.byteOffset, buf.byteLength / 4);
    });
    assertSameRows(rows, reference, 'tree restored in another process (another nCtx and nSeqMax)');
  });

  it('the prefix cache, its RAM tier and its disk tier give the same answers as a cold prefill', async () => {
    // A small context of its own, so that prompts evict each other into the tiers.
    const small = await open({ deterministic: true, nCtx: 256, nSeqMax: 8 });
    const dir = path.join(tmp, 'tiers');
    fs.mkdirSync(dir);
    // Four prompts of ~110 tokens: the KV cells hold two, RAM about one, the oldest goes to disk.
    const prompts = ['apples', 'rivers', 'engines', 'castles'].map(
      (topic) =>
        `Here is a long note about ${topic}. ` +
        `It talks about ${topic} in detail, one sentence after another, so that the prompt is long. `.repeat(5) +
        `Question: what is the single most important fact about ${topic}? Answer:`,
    );
    const ask = async (s, p) => {
      const r = await s.generate({ prompt: p, maxTokens: 3, params: { temperature: 0 }, logprobs: 5 });
      return { cached: r.usage.cachedPromptTokens, logprobs: r.choices[0].logprobs };
    };
    try {
      const coldScheduler = new Scheduler(small);
      const cold = [];
      for (const p of prompts) cold.push(await ask(coldScheduler, p));
      await coldScheduler.close();
      // RAM for about one prompt's state: the older evicted prefix goes to disk.
      const s = new Scheduler(small, { cacheRam: '2.5MB', cacheDir: dir });
      for (const p of prompts) await ask(s, p);
      for (let i = prompts.length - 1; i >= 0; i--) {
        const again = await ask(s, prompts[i]);
        assert.ok(again.cached > 0, `prompt ${i} should start from a cached prefix`);
        assert.deepEqual(again.logprobs, cold[i].logprobs, `prompt ${i} from the cache`);
      }
      const tiers = /** @type {any} */ (s.stats().cacheTiers);
      assert.ok(tiers.ramHits >= 1 && tiers.diskHits >= 1, `RAM hits ${tiers.ramHits}, disk hits ${tiers.diskHits}`);
      await s.close();
      // A restart: a new scheduler finds the prefix in the folder's files.
      const restarted = new Scheduler(small, { cacheDir: dir });
      const r = await ask(restarted, prompts[0]);
      assert.ok(r.cached > 0);
      assert.equal(/** @type {any} */ (restarted.stats().cacheTiers).diskHits, 1);
      assert.deepEqual(r.logprobs, cold[0].logprobs, 'prompt 0 from the disk after a restart');
      await restarted.close();
    } finally {
      small.dispose();
    }
  });

  it('the states it writes are refused by a context without the option, and the other way round', async () => {
    const b = greedy();
    await b.prefill(prompt);
    const file = path.join(tmp, 'det.lbt');
    await store.saveTree(b, file);
    await b.prune();
    const plain = await open({ nSeqMax: 4 });
    try {
      await rejects(() => BranchStore.restoreTree(plain, file), 'ERR_STATE_MISMATCH', /deterministic/);
    } finally {
      plain.dispose();
    }
  });
});
