'use strict';

// Images in the prefix cache (issue 49): a prompt's image is keyed by its bytes
// (lib/scheduler/image-keys.js), so the same image is found again — in the KV cells, in RAM, on
// disk after a restart — and never encoded twice; one changed pixel is another image. On the real
// default model and the random-weight test projector (16 positions an image). Exact properties
// only: encoder runs, cached and prefilled positions, tier hits, coded errors.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, Scheduler, readPrefixCacheFile } = require('..');
const { open, rejects } = require('./helpers');
const { projectorPath, projectorMissing, needWriter, png } = require('./helpers/images');

const IMAGE_TOKENS = 16;

/** A prompt of a long text, an image and a question: the text makes the shared start worth caching. */
const LEAD = 'A photograph from the archive, described for a catalogue. '.repeat(3);
const parts = (img, question = 'What is in the picture?') => [LEAD, img, `\nQuestion: ${question}\nAnswer:`];
const greedy = { maxTokens: 4, params: { temperature: 0 } };

/** Where the (first) image's positions start in the prompt `parts(img)` tokenizes to. */
async function imageStart(ctx, img) {
  const { pieces } = await ctx.tokenizeParts(parts(img));
  return pieces
    .slice(
      0,
      pieces.findIndex((p) => p.type === 'image'),
    )
    .reduce((n, p) => n + p.nPos, 0);
}

describe('images in the prefix cache', function () {
  this.timeout(240000);
  if (projectorMissing()) return;

  let ctx;
  let opened = [];
  const scheduler = (c, options) => {
    const s = new Scheduler(c, options);
    opened.push(s);
    return s;
  };
  const encodes = (c = ctx) => c.imageStats().encodes;
  afterEach(async () => {
    for (const s of opened) await s.close();
    opened = [];
  });
  before(async function () {
    needWriter();
    ctx = await open({ mmprojPath: projectorPath(), nSeqMax: 8, nCtx: 512 });
  });
  after(() => ctx?.dispose());

  it('the same image bytes hit the cache (no encode); one changed pixel misses (one encode)', async () => {
    const s = scheduler(ctx);
    const image = png(64, 48, { seed: 11 });
    const base = (x, y) => [(x * 7 + y * 3 + 11 * 41) & 255, (x * y + 11 * 97) & 255, (x * 13 + y * 29 + 11) & 255];
    const changed = png(64, 48, { pixel: (x, y) => (x === 5 && y === 7 ? [1, 2, 3] : base(x, y)) });
    assert.deepEqual(png(64, 48, { pixel: base }), image, 'the helper draws the same image from the same pixels');

    const e0 = encodes();
    const first = await s.generate({ prompt: parts(image), ...greedy });
    assert.equal(encodes(), e0 + 1);
    assert.equal(first.usage.cachedPromptTokens, 0);

    const again = await s.generate({ prompt: parts(Buffer.from(image)), ...greedy });
    assert.equal(encodes(), e0 + 1, 'the same bytes: the image is not encoded again');
    assert.equal(again.usage.cachedPromptTokens, again.usage.promptTokens, 'the whole prompt came from the cache');
    assert.deepEqual(again.choices[0].tokens, first.choices[0].tokens, 'its cached logits give the same greedy text');

    const before = s.stats().prefilledTokens;
    const other = await s.generate({ prompt: parts(changed), ...greedy });
    assert.equal(encodes(), e0 + 2, 'one changed pixel: another image, encoded');
    const start = await imageStart(ctx, changed);
    assert.ok(
      other.usage.cachedPromptTokens <= start,
      `cached ${other.usage.cachedPromptTokens} positions, the image starts at ${start}`,
    );
    assert.equal(s.stats().prefilledTokens - before, other.usage.promptTokens - other.usage.cachedPromptTokens);
  });

  it('another question about a cached image forks it: the image is neither encoded nor prefilled again', async () => {
    const s = scheduler(ctx);
    const image = png(64, 48, { seed: 12 });
    const e0 = encodes();
    const a = await s.generate({ prompt: parts(image, 'What colour dominates?'), ...greedy });
    const before = s.stats().prefilledTokens;
    const b = await s.generate({ prompt: parts(image, 'How many objects are there?'), ...greedy });
    assert.equal(encodes(), e0 + 1, 'one encode for both questions');
    const start = await imageStart(ctx, image);
    assert.ok(
      b.usage.cachedPromptTokens >= start + IMAGE_TOKENS,
      `cached ${b.usage.cachedPromptTokens}: the text and the image's ${IMAGE_TOKENS} positions`,
    );
    assert.equal(s.stats().prefilledTokens - before, b.usage.promptTokens - b.usage.cachedPromptTokens);
    assert.ok(a.choices[0].tokens.length > 0 && b.choices[0].tokens.length > 0);
  });

  it('an image prefix evicted to RAM is restored, not encoded; the same on disk after a restart', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-img-cache-'));
    // 256 cells (llama.cpp's least) hold the shared text and about seven of these prompts' images
    // and questions: ten evict the first ones.
    const small = await open({ mmprojPath: projectorPath(), nSeqMax: 8, nCtx: 256 });
    try {
      const images = Array.from({ length: 10 }, (_, i) => png(64, 48, { seed: 21 + i }));
      const s = scheduler(small, { cacheRam: '64MB', cacheDir: dir });
      for (const img of images) await s.generate({ prompt: parts(img), ...greedy });
      assert.equal(encodes(small), images.length);
      assert.ok(s.stats().evictions >= 1, `the KV cells should have evicted (evictions ${s.stats().evictions})`);
      // Ask again, oldest first, until a prompt is restored from RAM (which entries the cells
      // evicted depends on the LRU order of the shared text's forks).
      let restored = null;
      for (const img of images) {
        const before = encodes(small);
        const r = await s.generate({ prompt: parts(img), ...greedy });
        if (/** @type {any} */ (s.stats().cacheTiers).ramHits === 0) continue;
        restored = { r, encoded: encodes(small) - before };
        break;
      }
      assert.ok(restored, `no prompt came back from RAM: ${JSON.stringify(s.stats().cacheTiers)}`);
      assert.equal(restored.encoded, 0, 'restored from RAM: not encoded again');
      // Restored one position short: the prompt's last token is decoded again for its logits.
      assert.equal(restored.r.usage.cachedPromptTokens, restored.r.usage.promptTokens - 1);
      await s.close();

      const files = fs.readdirSync(dir).filter((f) => f.endsWith('.lbkv'));
      assert.ok(files.length >= images.length, `${files.length} files`);
      const read = await readPrefixCacheFile(small, path.join(dir, files[0]));
      assert.equal(read.images.length, 1);
      assert.equal(read.images[0].nPos, IMAGE_TOKENS);
      assert.match(read.images[0].id, /^[0-9a-f]{64}$/);

      // A restart: another context on the same folder finds the image prefix on disk.
      const ctx2 = await open({ mmprojPath: projectorPath(), nSeqMax: 8, nCtx: 512 });
      try {
        const s2 = scheduler(ctx2, { cacheDir: dir });
        const r2 = await s2.generate({ prompt: parts(images[1]), ...greedy });
        assert.equal(/** @type {any} */ (s2.stats().cacheTiers).diskHits, 1);
        assert.equal(encodes(ctx2), 0, 'restored from disk: the new context never ran its encoder');
        assert.equal(r2.usage.cachedPromptTokens, r2.usage.promptTokens - 1);
        await s2.close();
      } finally {
        ctx2.dispose();
      }
    } finally {
      for (const s of opened) await s.close();
      opened = [];
      small.dispose();
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('a branch prefills a MediaPrompt in ranges; a range that cuts an image is refused, nothing written', async () => {
    const prompt = await ctx.tokenizeParts(parts(png(32, 32, { seed: 31 })));
    const start = prompt.pieces.findIndex((p) => p.type === 'image');
    const at = prompt.pieces.slice(0, start).reduce((n, p) => n + p.nPos, 0);
    const b = Branch.create(ctx, 0, { temperature: 0 });
    try {
      await rejects(() => b.prefill(prompt, { from: 0, to: at + 1 }), 'ERR_IMAGE_POSITIONS');
      await rejects(() => b.prefill(prompt, { from: 0, to: prompt.nPos + 1 }), 'ERR_INVALID_ARG');
      await rejects(() => b.prefill(prompt, { from: 2.5 }), 'ERR_INVALID_ARG');
      assert.equal(b.position, 0, 'nothing was written');
      const e0 = encodes();
      await b.prefill(prompt, { from: 0, to: at });
      assert.equal(b.position, at);
      await b.prefill(prompt, { from: at, to: at + IMAGE_TOKENS });
      assert.equal(encodes(), e0 + 1);
      await b.prefill(prompt, { from: at + IMAGE_TOKENS });
      assert.equal(b.position, prompt.nPos);
      await rejects(() => b.forkAt(at + 3), 'ERR_IMAGE_POSITIONS');
    } finally {
      await b.prune();
    }
  });
});
