'use strict';

// Branch trees whose branches hold an image (issue 49; docs/images.md, docs/api.md#branch-trees):
// each branch's image spans are saved beside its cells, and a restore gives them back. The tree
// is restored in another process by a context WITHOUT a projector (the KV cells hold the image:
// nothing is encoded again) and continues with the original's tokens; a fork inside the
// restored image is refused; a span spoiled in the file (its checksum made right again) is
// ERR_STATE_CORRUPT. The projector has random weights (test/helpers/make-mmproj.py), so only
// exact properties are checked.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const { execFile } = require('node:child_process');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, BranchStore } = require('..');
const { open, rejects, throwsSync, argmax, continueFor, MODEL } = require('./helpers');
const { projectorPath, projectorMissing, needWriter, png } = require('./helpers/images');

const STEPS = 4;
/** Image positions of the test projector: (128 / 8 / 4)². */
const IMAGE_TOKENS = 16;
const GREEDY = { temperature: 0 };

/**
 * Runs `body(ctx, lib, file, data)` (an async function using nothing but its arguments and
 * `require`: its source is copied into the child's script) in another node process on a context
 * created with `options` (no projector unless given); resolves what it returns, through JSON.
 */
function inChild(options, file, body, data = null) {
  const script = `
    const lib = require(${JSON.stringify(path.resolve(__dirname, '..'))});
    (async () => {
      const ctx = await lib.createContext(${JSON.stringify({ modelPath: MODEL, ...options })});
      const out = await (${body.toString()})(ctx, lib, ${JSON.stringify(file)}, ${JSON.stringify(data)});
      process.stdout.write(JSON.stringify(out));
      ctx.dispose();
    })().catch((e) => { console.error(e); process.exit(1); });`;
  return new Promise((resolve, reject) =>
    execFile(process.execPath, ['-e', script], { timeout: 240000 }, (err, out, errOut) =>
      err ? reject(new Error(`${err.message}\n${errOut}`)) : resolve(JSON.parse(out)),
    ),
  );
}

// The saved-state container (src/engine/saved_state/mod.rs), just enough to change a section
// and make the file's checksum right again, so that what is refused is the change itself.
const MASK = (1n << 64n) - 1n;
const P = 0x9e3779b97f4a7c15n;
const rotl = (x, r) => ((x << BigInt(r)) | (x >> BigInt(64 - r))) & MASK;

function checksum(buf) {
  const lanes = [0x243f6a8885a308d3n, 0x13198a2e03707344n, 0xa4093822299f31d0n, 0x082efa98ec4e6c89n];
  const full = buf.length - (buf.length % 32);
  for (let at = 0; at < full; at += 32)
    for (let i = 0; i < 4; i++) lanes[i] = rotl(((lanes[i] ^ buf.readBigUInt64LE(at + 8 * i)) * P) & MASK, 29);
  let h = BigInt(buf.length);
  for (const lane of lanes) h = rotl(((h ^ lane) * P) & MASK, 31);
  let fnv = 0xcbf29ce484222325n;
  for (let i = full; i < buf.length; i++) fnv = ((fnv ^ BigInt(buf[i])) * 0x100000001b3n) & MASK;
  return fnv ^ h;
}

/** Each section's offset and length in a container's bytes. */
function sectionsOf(bytes) {
  let at = 12; // magic, version
  const str = () => {
    const n = bytes.readUInt32LE(at);
    at += 4 + n;
    return bytes.toString('utf8', at - n, at);
  };
  str(); // payload
  at += 8; // model
  str(); // model name
  at += 4; // state format
  str(); // kv settings
  const table = [];
  for (let n = bytes.readUInt32LE((at += 4) - 4); n > 0; n--) {
    const name = str();
    table.push([name, Number(bytes.readBigUInt64LE(at))]);
    at += 8;
  }
  const out = {};
  for (const [name, len] of table) {
    out[name] = { at, len };
    at += len;
  }
  return out;
}

/** The checksum of `bytes` made right again after a change. */
function reseal(bytes) {
  const end = bytes.length - 8;
  bytes.writeBigUInt64LE(checksum(bytes.subarray(0, end)), end);
  return bytes;
}

describe('branch trees holding an image: saveTree / restoreTree', function () {
  this.timeout(300000);
  if (projectorMissing()) return;

  const image = png(64, 48, { seed: 1 });
  let ctx;
  let tmp;
  let file;
  let prompt;
  /** The image's positions in the root: [start, end). */
  let start;
  let end;
  let saved;
  let cellsSaved;
  let original;

  before(async () => {
    needWriter();
    ctx = await open({ mmprojPath: projectorPath(), nSeqMax: 12, nThreads: 1 });
    tmp = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-image-trees-'));
    file = path.join(tmp, 'tree.lbt');
    // root (the image prompt) → a (greedy, 2 tokens) → a2 (1 token); root → b (seeded, 3
    // tokens); root → before (forked at the image's start, text of its own).
    prompt = await ctx.tokenizeParts(['Look at this picture: ', image, ' It shows']);
    start = prompt.pieces[0].tokens.length;
    end = start + IMAGE_TOKENS;
    const root = Branch.create(ctx, 0, GREEDY);
    await root.prefill(prompt);
    const a = root.fork();
    const b = root.fork();
    b.setSamplerParams({ temperature: 0.9, seed: 7 });
    const beforeImage = root.forkAt(start);
    await beforeImage.prefill(await ctx.tokenize(' a drawing of', false));
    await continueFor(a, 2);
    await continueFor(b, 3);
    const a2 = a.fork();
    await continueFor(a2, 1);
    const encodes = ctx.imageStats().encodes;
    saved = await new BranchStore(ctx).saveTree(root, file, { meta: JSON.stringify({ start, end }) });
    assert.deepEqual(saved.branches, [root, a, a2, b, beforeImage], 'depth first, parents first');
    assert.equal(ctx.imageStats().encodes, encodes, 'saving encodes nothing');
    cellsSaved = new BranchStore(ctx).kvPressure().cellsUsed;
    original = [];
    for (const br of saved.branches) original.push({ position: br.position, tokens: await continueFor(br, STEPS) });
    await Promise.all(saved.branches.map((br) => br.prune()));
  });
  after(() => {
    ctx?.dispose();
    if (tmp) fs.rmSync(tmp, { recursive: true, force: true });
  });

  it('saves every branch with its prefix once, the image cells included', () => {
    assert.equal(saved.sharedBranches, 4, 'every child leaves its parent prefix out');
    assert.equal(fs.statSync(file).size, saved.bytes);
    assert.equal(original[0].position, prompt.nPos);
    assert.equal(original[4].position, start + 3, 'forked before the image: none of it');
  });

  it('restored in another process without a projector, every branch continues with the same tokens', async () => {
    const child = await inChild({ nCtx: 1024, nThreads: 1, nSeqMax: 8 }, file, async (ctx, lib, file) => {
      const restored = await lib.BranchStore.restoreTree(ctx, file);
      const { start, end } = JSON.parse(restored.meta);
      const cells = new lib.BranchStore(ctx).kvPressure().cellsUsed;
      const positions = restored.branches.map((b) => b.position);
      const tokens = [];
      for (const b of restored.branches) {
        const out = [];
        for (let i = 0; i < 4; i++) {
          const { token } = b.produce();
          out.push(token);
          await b.commit(token);
        }
        tokens.push(out);
      }
      const forks = [];
      const refused = (b, at) => {
        try {
          forks.push(b.forkAt(at));
          return null;
        } catch (e) {
          return e.code;
        }
      };
      const [root, a, a2, , beforeImage] = restored.branches;
      const after = a2.forkAt(end);
      await after.prefill(await ctx.tokenize(' Then', false));
      const afterToken = after.produce().token;
      const afterPosition = after.position;
      await Promise.all([after, ...forks].map((b) => b.prune()));
      return {
        hasProjector: ctx.hasProjector,
        encodes: ctx.imageStats().encodes,
        parents: restored.parents,
        cells,
        positions,
        tokens,
        inside: [refused(root, start + 1), refused(a, end - 1), refused(a2, start + 7)],
        edges: [refused(root, start), refused(a, end)],
        beforeImage: refused(beforeImage, start + 1),
        afterPosition,
        afterToken,
      };
    });
    assert.equal(child.hasProjector, false);
    assert.equal(child.encodes, 0, 'nothing encoded: the cells hold the image');
    assert.deepEqual(child.parents, [-1, 0, 1, 0, 0]);
    assert.equal(child.cells, cellsSaved, 'the image cells once, shared again');
    assert.deepEqual(
      child.positions,
      original.map((o) => o.position),
    );
    assert.deepEqual(
      child.tokens,
      original.map((o) => o.tokens),
      'the same tokens, each side committing one token per decode',
    );
    assert.deepEqual(child.inside, ['ERR_IMAGE_POSITIONS', 'ERR_IMAGE_POSITIONS', 'ERR_IMAGE_POSITIONS']);
    assert.deepEqual(child.edges, [null, null], "at the image's start or end a fork is fine");
    assert.equal(child.beforeImage, null, 'a branch forked before the image holds none of it');
    assert.equal(child.afterPosition, end + 1);
    assert.ok(child.afterToken >= 0, 'a fork after the restored image goes on');
  });

  it('restored here, forks keep the image below them and never start inside it', async () => {
    const restored = await BranchStore.restoreTree(ctx, file);
    try {
      const [root, a, , , beforeImage] = restored.branches;
      throwsSync(() => root.forkAt(start + 1), 'ERR_IMAGE_POSITIONS');
      throwsSync(() => a.forkAt(end - 1), 'ERR_IMAGE_POSITIONS');
      const after = a.forkAt(end);
      const edge = root.forkAt(start);
      const text = beforeImage.forkAt(start + 1);
      const grandchild = after.fork();
      throwsSync(() => grandchild.forkAt(start + 2), 'ERR_IMAGE_POSITIONS');
      await grandchild.prune();
      // Saved again, the restored tree gives back the same spans (a tree of one branch here).
      const again = path.join(tmp, 'again.lbt');
      await new BranchStore(ctx).saveTree(after, again);
      const { root: reread, branches } = await BranchStore.restoreTree(ctx, again);
      assert.equal(branches.length, 1);
      throwsSync(() => reread.forkAt(start + 3), 'ERR_IMAGE_POSITIONS');
      const atEnd = reread.forkAt(end);
      assert.equal(atEnd.position, end);
      await Promise.all([after, edge, text, reread, atEnd].map((b) => b.prune()));
    } finally {
      await Promise.all(restored.branches.map((b) => b.prune()));
    }
  });

  it('a spoiled image span is ERR_STATE_CORRUPT (checksum made right), and nothing is restored', async () => {
    const one = Branch.create(ctx, 0, GREEDY);
    await one.prefill(prompt);
    const small = path.join(tmp, 'one.lbt');
    await new BranchStore(ctx).saveTree(one, small);
    await one.prune();
    const bytes = fs.readFileSync(small);
    assert.equal(checksum(bytes.subarray(0, bytes.length - 8)), bytes.readBigUInt64LE(bytes.length - 8));
    const { images } = sectionsOf(bytes);
    assert.ok(images, 'a tree holding an image has an images section');
    // One branch with one image: u32 branches, u32 images, u32 start, u32 positions, str id.
    const at = images.at;
    assert.deepEqual(
      [0, 4, 8, 12, 16].map((o) => bytes.readUInt32LE(at + o)),
      [1, 1, start, IMAGE_TOKENS, 64],
    );
    assert.equal(bytes.toString('latin1', at + 20, at + 84), prompt.pieces[1].id);
    const spoil = (fn) => {
      const b = Buffer.from(bytes);
      fn(b);
      return reseal(b);
    };
    const id = prompt.pieces[1].id;
    assert.notEqual(id.toUpperCase(), id);
    const flipped = Buffer.from(bytes);
    flipped[at + 30] ^= 1;
    const cases = [
      ['an id not in lowercase hex', spoil((b) => (b[at + 20] = 0x47)), /not a SHA-256/],
      ['an uppercase id', spoil((b) => b.write(id.toUpperCase(), at + 20, 'latin1')), /not a SHA-256/],
      ['an image past the branch', spoil((b) => b.writeUInt32LE(prompt.nPos - 4, at + 8)), /inside the \d+ positions/],
      ['an empty image', spoil((b) => b.writeUInt32LE(0, at + 12)), /not ordered, apart and inside/],
      ['images for 2 branches', spoil((b) => b.writeUInt32LE(2, at)), /images for 2 branches/],
      ['not resealed', flipped, /checksum/],
    ];
    const store = new BranchStore(ctx);
    const before = { available: store.available, cells: store.kvPressure().cellsUsed };
    for (const [what, data, message] of cases) {
      const bad = path.join(tmp, 'bad.lbt');
      fs.writeFileSync(bad, data);
      await rejects(() => BranchStore.restoreTree(ctx, bad), 'ERR_STATE_CORRUPT', message);
      assert.deepEqual({ available: store.available, cells: store.kvPressure().cellsUsed }, before, what);
    }
    const { root } = await BranchStore.restoreTree(ctx, small);
    throwsSync(() => root.forkAt(start + 1), 'ERR_IMAGE_POSITIONS');
    await root.prune();
  });

  describe('deterministic: true', () => {
    it("a restored tree's rows are the original's bit for bit, in another process and another batch shape", async () => {
      const det = await open({ deterministic: true, mmprojPath: projectorPath(), nSeqMax: 4, nThreads: 1 });
      const hash = (row) =>
        crypto
          .createHash('sha256')
          .update(new Uint8Array(row.buffer, row.byteOffset, row.byteLength))
          .digest('hex');
      try {
        const root = Branch.create(det, 0, GREEDY);
        await root.prefill(await det.tokenizeParts(['Look at this picture: ', image, ' It shows']));
        const fork = root.fork();
        await fork.prefill(await det.tokenize(' a', false));
        const detFile = path.join(tmp, 'det.lbt');
        await new BranchStore(det).saveTree(root, detFile);
        // The reference: each branch's rows as the original commits its own argmax alone.
        const forced = [];
        const reference = [];
        for (const b of [root, fork]) {
          const tokens = [];
          const rows = [hash(b.getLogits())];
          for (let i = 0; i < STEPS; i++) {
            tokens.push(argmax(b.getLogits()));
            await b.commit(tokens[i]);
            rows.push(hash(b.getLogits()));
          }
          forced.push(tokens);
          reference.push(rows);
        }
        const child = await inChild(
          { nCtx: 1024, nThreads: 1, nSeqMax: 4, deterministic: true },
          detFile,
          async (ctx, lib, file, forced) => {
            const crypto = require('node:crypto');
            const hash = (row) =>
              crypto
                .createHash('sha256')
                .update(new Uint8Array(row.buffer, row.byteOffset, row.byteLength))
                .digest('hex');
            const { branches } = await lib.BranchStore.restoreTree(ctx, file);
            const store = new lib.BranchStore(ctx);
            const rows = branches.map((b) => [hash(b.getLogits())]);
            for (let i = 0; i < forced[0].length; i++) {
              // Both branches in ONE decode: another batch shape than the original's.
              await store.commit(branches.map((b, k) => [b, forced[k][i]]));
              branches.forEach((b, k) => rows[k].push(hash(b.getLogits())));
            }
            return { hasProjector: ctx.hasProjector, rows };
          },
          forced,
        );
        assert.equal(child.hasProjector, false);
        assert.deepEqual(child.rows, reference);
      } finally {
        det.dispose();
      }
    });
  });
});
