'use strict';

// Images through llama.cpp's mtmd (issue 49), on the real default model and a projector with
// random weights written for it (test/helpers/make-mmproj.py: type gemma3, 16 image tokens). Its
// outputs mean nothing, so every assertion is an exact property: positions, encoder runs, equal
// or different logits, coded errors, branches unchanged after a failure.

const assert = require('node:assert/strict');
const crypto = require('node:crypto');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { Branch, BranchStore, Scheduler } = require('..');
const { open, rejects, throwsSync, argmax, topK } = require('./helpers');
const { projectorPath, projectorMissing, needWriter, png, bmp, jpeg } = require('./helpers/images');

/** Image tokens (and positions) of the test projector: (128 / 8 / 4)². */
const IMAGE_TOKENS = 16;
const GREEDY = { temperature: 0 };

/** The logits a fresh branch holds after prefilling `prompt` (the branch pruned). */
async function logitsAfter(ctx, prompt) {
  const b = Branch.create(ctx, 0, GREEDY);
  try {
    await b.prefill(prompt);
    return Float32Array.from(b.getLogits());
  } finally {
    await b.prune();
  }
}

/** A WebP file of test/fixtures (`kind`: lossless, lossy, lossy-alpha). */
const webpFixture = (kind) => fs.readFileSync(path.join(__dirname, 'fixtures', `seed77-40x32-${kind}.webp`));

function maxAbsDiff(a, b) {
  let m = 0;
  for (let i = 0; i < a.length; i++) m = Math.max(m, Math.abs(a[i] - b[i]));
  return m;
}

describe('images (mtmd, random-weight gemma3 projector)', function () {
  // CI installs the writer (scripts/setup.js), so there these tests must run. Elsewhere, without
  // it, one test says why they do not run and checks that reason.
  if (projectorMissing()) return;

  let ctx;
  const image = png(64, 48, { seed: 1 });
  const other = png(64, 48, { seed: 2 });

  before(async function () {
    needWriter();
    ctx = await open({ mmprojPath: projectorPath(), nSeqMax: 8, nCtx: 1024 });
  });
  after(() => ctx?.dispose());

  it('an image takes the positions the projector declares, and one encoder run', async () => {
    assert.equal(ctx.hasProjector, true);
    const before = ctx.imageStats();
    const prompt = await ctx.tokenizeParts(['Look: ', image, ' What is it?']);
    assert.equal(prompt.nImages, 1);
    const kinds = prompt.pieces.map((p) => p.type);
    assert.deepEqual(kinds, ['text', 'image', 'text']);
    const img = prompt.pieces[1];
    assert.equal(img.nTokens, IMAGE_TOKENS);
    assert.equal(img.nPos, IMAGE_TOKENS);
    assert.match(img.id, /^[0-9a-f]{64}$/, 'the SHA-256 of the file bytes');
    // Gemma 3 wraps the image in <start_of_image> … <end_of_image>.
    assert.equal(ctx.tokenToText(prompt.pieces[0].tokens.at(-1)), '<start_of_image>');
    assert.equal(ctx.tokenToText(prompt.pieces[2].tokens[0]), '<end_of_image>');
    const textTokens = prompt.pieces[0].tokens.length + prompt.pieces[2].tokens.length;
    assert.equal(prompt.nPos, textTokens + IMAGE_TOKENS);
    assert.equal(ctx.imageStats().encodes, before.encodes, 'tokenizing encodes nothing');

    const b = Branch.create(ctx, 0, GREEDY);
    await b.prefill(prompt);
    assert.equal(b.position, prompt.nPos);
    assert.equal(ctx.kvSeqPosMax(b.seqId), prompt.nPos - 1);
    assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, prompt.nPos);
    const after = ctx.imageStats();
    assert.equal(after.encodes, before.encodes + 1);
    assert.ok(after.encodeMs > before.encodeMs);
    // Generation goes on after the image like after any prompt.
    const { tokens } = await b.generate({ maxTokens: 3 });
    assert.equal(tokens.length, 3);
    await b.prune();
    assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, 0);
  });

  it('the same image gives the same logits (bitwise, also as a file or a BMP), a different one (or one changed pixel) others', async () => {
    const first = await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', image]));
    const again = await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', { imagePath: writeTemp(image) }]));
    assert.equal(maxAbsDiff(first, again), 0, 'the same bytes (as bytes and as a file): the same logits');
    const different = await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', other]));
    assert.ok(maxAbsDiff(first, different) > 1e-3, `another image moved the logits by ${maxAbsDiff(first, different)}`);

    const asBmp = await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', bmp(64, 48, { seed: 1 })]));
    assert.equal(maxAbsDiff(first, asBmp), 0, 'the same pixels as a BMP: the same logits');

    const pixel = png(64, 48, { seed: 1, pixel: (x, y) => (x === 5 && y === 7 ? [0, 0, 0] : patternOf(1)(x, y)) });
    const [a, b] = await Promise.all([ctx.tokenizeParts([image]), ctx.tokenizeParts([pixel])]);
    assert.notEqual(a.pieces[1].id, b.pieces[1].id, 'one changed pixel: another id');
    const [c] = [await ctx.tokenizeParts([png(64, 48, { seed: 1 })])];
    assert.equal(a.pieces[1].id, c.pieces[1].id, 'the same bytes: the same id');
  });

  it("WebP (decoded in Rust): lossless gives the PNG's logits bitwise; lossy and extended (alpha) decode", async () => {
    // test/fixtures/seed77-40x32-*.webp were written by Pillow from png(40, 32, { seed: 77 }).
    const fromPng = await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', png(40, 32, { seed: 77 })]));
    const lossless = await ctx.tokenizeParts(['Look: ', webpFixture('lossless')]);
    assert.equal(lossless.pieces[1].nPos, IMAGE_TOKENS);
    assert.equal(
      lossless.pieces[1].id,
      crypto.createHash('sha256').update(webpFixture('lossless')).digest('hex'),
      "its id is the SHA-256 of the file's bytes, as for the other formats",
    );
    assert.equal(maxAbsDiff(fromPng, await logitsAfter(ctx, lossless)), 0, 'the same pixels: the same logits');
    for (const kind of ['lossy', 'lossy-alpha']) {
      const prompt = await ctx.tokenizeParts(['Look: ', webpFixture(kind)]);
      assert.equal(prompt.pieces[1].nPos, IMAGE_TOKENS, kind);
      const d = maxAbsDiff(fromPng, await logitsAfter(ctx, prompt));
      assert.ok(d > 0, `${kind}: lossy pixels are not the PNG's, so neither are the logits`);
    }
  });

  it("a JPEG (baseline, made by test/helpers/images.js) decodes: 8×8 blocks of one grey give the PNG's logits bitwise", async () => {
    // A block of one grey is its DC coefficient alone, which the encoder's quantization keeps
    // exactly, and Y = grey, Cb = Cr = 128 converts back to the same RGB: the decoder's pixels are
    // the PNG's, so the logits are too (a decoder that got the file wrong would move them).
    const blocks = { pixel: (x, y) => new Array(3).fill(((x >> 3) * 37 + (y >> 3) * 71) & 255) };
    const fromPng = await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', png(64, 48, blocks)]));
    const asJpeg = await ctx.tokenizeParts(['Look: ', jpeg(64, 48, blocks)]);
    assert.equal(asJpeg.pieces[1].nPos, IMAGE_TOKENS);
    assert.equal(maxAbsDiff(fromPng, await logitsAfter(ctx, asJpeg)), 0, 'the same pixels as a JPEG: the same logits');
    // A photo-like pattern whose edge blocks are partial (61×45): lossy, so near, not equal.
    const colour = await ctx.tokenizeParts(['Look: ', jpeg(61, 45, { seed: 2 })]);
    assert.equal(colour.pieces[1].nPos, IMAGE_TOKENS);
    const near = maxAbsDiff(
      await logitsAfter(ctx, colour),
      await logitsAfter(ctx, await ctx.tokenizeParts(['Look: ', png(61, 45, { seed: 2 })])),
    );
    const far = maxAbsDiff(fromPng, await logitsAfter(ctx, colour));
    assert.ok(near < far, `the JPEG's logits are nearer its PNG's (${near}) than another image's (${far})`);
  });

  it('N forks after one image: one encoder run, each fork equals a fresh branch that encoded it', async () => {
    const questions = [' What colour is it?', ' Describe the shapes.', ' Is there text?', ' Count the dots.'];
    const encodes0 = ctx.imageStats().encodes;
    const prompt = await ctx.tokenizeParts(['Look at this: ', image]);
    const root = Branch.create(ctx, 0, GREEDY);
    await root.prefill(prompt);
    const cellsAfterImage = new BranchStore(ctx).kvPressure().cellsUsed;
    const forks = questions.map(() => root.fork());
    const asked = await Promise.all(questions.map((q) => ctx.tokenize(q, false)));
    await Promise.all(forks.map((f, i) => f.prefill(asked[i])));
    assert.equal(ctx.imageStats().encodes, encodes0 + 1, 'the forks encoded nothing');
    const added = asked.reduce((n, q) => n + q.length, 0);
    assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, cellsAfterImage + added, 'the image cells are shared');

    for (const [i, q] of questions.entries()) {
      const fresh = await ctx.tokenizeParts(['Look at this: ', image, q]);
      // The same tokens, so the only difference is the batch shape (the question decoded apart).
      assert.deepEqual(fresh.pieces[2].tokens, [...prompt.pieces[2].tokens, ...asked[i]]);
      const cold = await logitsAfter(ctx, fresh);
      const warm = forks[i].getLogits();
      assert.equal(forks[i].position, fresh.nPos);
      assert.equal(argmax(warm), argmax(cold), `question ${i}: the same greedy token`);
      const overlap = topK(warm, 10).filter((t) => topK(cold, 10).includes(t)).length;
      assert.ok(overlap >= 8, `question ${i}: top-10 overlap ${overlap}`);
      let maxDelta = 0;
      for (const t of topK(cold, 50)) maxDelta = Math.max(maxDelta, Math.abs(warm[t] - cold[t]));
      assert.ok(maxDelta < 1.5, `question ${i}: max |Δlogit| over the top 50: ${maxDelta}`);
    }
    assert.equal(ctx.imageStats().encodes, encodes0 + 1 + questions.length, 'each fresh branch encoded once');
    const scheduler = new Scheduler(ctx);
    assert.equal(scheduler.stats().imageEncodes, ctx.imageStats().encodes, 'the Scheduler (and /metrics) report it');
    await scheduler.close();
    await Promise.all([...forks, root].map((b) => b.prune()));
  });

  it('a fork cannot start inside an image, and the refusal leaves the branch intact', async () => {
    // Saved trees of such branches: test/images-trees.test.js.
    const prompt = await ctx.tokenizeParts(['Look: ', image]);
    const start = prompt.pieces[0].tokens.length;
    const root = Branch.create(ctx, 0, GREEDY);
    await root.prefill(prompt);
    const logits = Float32Array.from(root.getLogits());
    throwsSync(() => root.forkAt(start + 1), 'ERR_IMAGE_POSITIONS');
    throwsSync(() => root.forkAt(start + IMAGE_TOKENS - 1), 'ERR_IMAGE_POSITIONS');
    const before = root.forkAt(start);
    const after = root.forkAt(start + IMAGE_TOKENS);
    assert.equal(after.position, start + IMAGE_TOKENS);
    // A fork before the image holds none of it: it forks anywhere in its own text.
    await before.prefill(await ctx.tokenize(' text only', false));
    await before.forkAt(start + 1).prune();
    assert.equal(root.position, prompt.nPos);
    assert.equal(maxAbsDiff(root.getLogits(), logits), 0);
    await Promise.all([root, before, after].map((b) => b.prune()));
  });

  it('BranchStore.prefillMedia: many branches in one job, each as its own prefill; a failing entry fails alone', async () => {
    const store = new BranchStore(ctx);
    const p1 = await ctx.tokenizeParts(['One: ', image, ' the end.']);
    const p2 = await ctx.tokenizeParts(['Two: ', other]);
    const textBefore = p1.pieces[0].tokens.length;
    const [a, b, c, d] = [0, 1, 2, 3].map(() => Branch.create(ctx, 0, GREEDY));
    const encodes0 = ctx.imageStats().encodes;
    const cut = { from: 0, to: p2.pieces[0].tokens.length + 1 }; // ends inside the image
    const failures = await store.prefillMedia([
      [a, p1],
      [b, p2, cut],
      [c, p2],
      [d, p1, { to: textBefore }],
    ]);
    assert.equal(failures.length, 4);
    assert.deepEqual([failures[0], failures[2], failures[3]], [null, null, null]);
    assert.ok(failures[1] instanceof Error);
    assert.equal(failures[1].code, 'ERR_IMAGE_POSITIONS', failures[1].message);
    assert.deepEqual([a.position, b.position, c.position, d.position], [p1.nPos, 0, p2.nPos, textBefore]);
    assert.equal(ctx.kvSeqPosMax(b.seqId), -1, 'the failed entry wrote nothing');
    assert.equal(ctx.imageStats().encodes, encodes0 + 2, 'one encoder run per image prefilled');
    // The rest of a prompt whose text this branch holds: from where it ends.
    assert.deepEqual(await store.prefillMedia([[d, p1, { from: textBefore }]]), [null]);
    assert.equal(d.position, p1.nPos);
    for (const [branch, prompt] of [
      [a, p1],
      [c, p2],
      [d, p1],
    ]) {
      const alone = await logitsAfter(ctx, prompt);
      const got = branch.getLogits();
      assert.equal(argmax(got), argmax(alone), 'the same greedy token as a prefill of its own');
      const overlap = topK(got, 10).filter((t) => topK(alone, 10).includes(t)).length;
      assert.ok(overlap >= 8, `top-10 overlap ${overlap}`);
    }
    // Malformed entries throw before anything runs; nothing changed.
    await rejects(() => store.prefillMedia([[b, 'not a prompt']]), 'ERR_INVALID_ARG');
    await rejects(() => store.prefillMedia([[{}, p2]]), 'ERR_INVALID_ARG');
    await rejects(() => store.prefillMedia(/** @type {any} */ ('x')), 'ERR_INVALID_ARG');
    await rejects(() => store.prefillMedia([[b, p2, { from: 0.5 }]]), 'ERR_INVALID_ARG');
    await rejects(() => store.prefillMedia([[b, p2, /** @type {any} */ ('all')]]), 'ERR_INVALID_ARG');
    assert.equal(b.position, 0);
    assert.deepEqual(await store.prefillMedia([]), []);
    await Promise.all([a, b, c, d].map((x) => x.prune()));
  });

  describe('formatChat with image parts', () => {
    const user = (...content) => [{ role: 'user', content }];
    const text = (t) => ({ type: 'text', text: t });

    it('text messages: the result is what it was (no parts), for strings and text-part arrays alike', async () => {
      const plain = await ctx.formatChat(user(text('Hello '), text('there')));
      assert.equal(plain.parts, undefined);
      assert.deepEqual(plain, ctx.formatChatSync(user(text('Hello '), text('there'))));
      const asString = await ctx.formatChat([{ role: 'user', content: 'Hello there' }]);
      assert.equal('parts' in asString, false);
    });

    it('an image in its place: parts for tokenizeParts, the prompt showing <__media__>, like the Scheduler', async () => {
      const messages = user(text('Look: '), { type: 'image', image }, text(' What is it?'));
      const chat = await ctx.formatChat(messages);
      assert.equal(chat.parts.length, 3);
      assert.equal(chat.parts[1], image, 'the image bytes as given');
      // The text around the image is the template's rendering of the message with the image's
      // marker in its place.
      const shown = await ctx.formatChat(user(text('Look: <__media__> What is it?')));
      assert.equal(chat.prompt, shown.prompt);
      assert.equal(`${chat.parts[0]}<__media__>${chat.parts[2]}`, shown.prompt);
      assert.deepEqual(chat.stopTokens, shown.stopTokens);
      const sync = ctx.formatChatSync(messages);
      assert.deepEqual(sync, chat);

      // The parts tokenize to one image of 16 positions between Gemma's markers; greedy text
      // after them equals the Scheduler's for the same messages (one rendering path).
      const prompt = await ctx.tokenizeParts(chat.parts);
      assert.equal(prompt.nImages, 1);
      assert.equal(prompt.pieces[1].nPos, IMAGE_TOKENS);
      const b = Branch.create(ctx, 0, GREEDY);
      await b.prefill(prompt);
      const own = await b.generate({ maxTokens: 6 });
      await b.prune();
      const scheduler = new Scheduler(ctx);
      try {
        const res = await scheduler.generate({ messages, maxTokens: 6, params: { temperature: 0 } });
        assert.deepEqual(res.choices[0].tokens, own.tokens);
        assert.equal(res.usage.promptTokens, prompt.nPos);
      } finally {
        await scheduler.close();
      }
    });

    it('{ imagePath } parts stay paths (read by tokenizeParts: the same image id as the bytes)', async () => {
      const file = path.join(fs.mkdtempSync(path.join(os.tmpdir(), 'lb-chat-img-')), 'a.png');
      fs.writeFileSync(file, image);
      const chat = await ctx.formatChat(
        user({ type: 'image', imagePath: file }, text('and '), { type: 'image', image: other }),
      );
      assert.deepEqual(chat.parts.slice(1, 4), [{ imagePath: file }, 'and ', other]);
      const [fromPath, fromBytes] = (await ctx.tokenizeParts(chat.parts)).pieces.filter((p) => p.type === 'image');
      const bytesId = (await ctx.tokenizeParts([image])).pieces.find((p) => p.type === 'image').id;
      assert.equal(fromPath.id, bytesId);
      assert.notEqual(fromBytes.id, bytesId);
      fs.rmSync(path.dirname(file), { recursive: true });
    });

    it('bad parts beside an image: ERR_INVALID_ARG naming the part (rejects; the Sync form throws)', async () => {
      const img = { type: 'image', image };
      const cases = [
        [
          user(text('a'), { type: 'image', image: 'bytes?' }),
          /messages\[0\]\.content\[1\]\.image must be a Uint8Array/,
        ],
        [user(img, { type: 'image' }), /messages\[0\]\.content\[1\] must have either image .* not neither/],
        [user({ type: 'image', image, imagePath: 'a.png' }), /messages\[0\]\.content\[0\] must have .* not both/],
        [
          user(img, { type: 'image', imagePath: 7 }),
          /messages\[0\]\.content\[1\]\.imagePath must be a non-empty string/,
        ],
        [
          [{ role: 'system', content: [text('Be brief.'), { type: 'audio' }] }, ...user(img)],
          /messages\[0\]\.content\[1\] must be \{ type: 'text'/,
        ],
        [user(img, text('x'), { type: 'text', text: 5 }), /messages\[0\]\.content\[2\] must be/],
      ];
      for (const [messages, message] of cases) {
        const e = await rejects(() => ctx.formatChat(messages), 'ERR_INVALID_ARG', message);
        assert.match(e.message, /^formatChat: messages\[/);
        assert.match(e.param, /^messages\[\d\]\.content\[\d\]/);
        const thrown = throwsSync(() => ctx.formatChatSync(messages), 'ERR_INVALID_ARG');
        assert.match(thrown.message, message);
      }
      // A call with a bad part returns a rejected promise; it does not throw.
      const pending = ctx.formatChat(user(img, { type: 'video' }));
      assert.ok(pending instanceof Promise);
      await assert.rejects(pending, { code: 'ERR_INVALID_ARG' });
      // A template that drops the images.
      await rejects(
        () => ctx.formatChat(user(text('Hi'), img), { templateOverride: "{{ 'no messages here' }}" }),
        'ERR_INVALID_ARG',
        /the chat template rendered 0 of the messages' 1 images/,
      );
    });
  });

  describe('bad input: a coded error, nothing changed, the context keeps working', () => {
    it('corrupt, truncated and unsupported bytes', async () => {
      await rejects(() => ctx.tokenizeParts(['x', Buffer.from('not an image at all')]), 'ERR_IMAGE_FORMAT');
      const webp = Buffer.concat([Buffer.from('RIFF'), Buffer.alloc(4), Buffer.from('WEBPVP8 '), Buffer.alloc(32)]);
      await rejects(() => ctx.tokenizeParts([webp]), 'ERR_IMAGE_DECODE', /WebP/);
      const lossy = webpFixture('lossy');
      await rejects(() => ctx.tokenizeParts([lossy.subarray(0, lossy.length / 2)]), 'ERR_IMAGE_DECODE', /WebP/);
      await rejects(() => ctx.tokenizeParts([image.subarray(0, 20)]), 'ERR_IMAGE_DECODE');
      await rejects(() => ctx.tokenizeParts([image.subarray(0, image.length - 30)]), 'ERR_IMAGE_DECODE');
      const garbled = Buffer.from(image);
      garbled.fill(0x55, 40, 80); // the compressed pixels corrupted
      await rejects(() => ctx.tokenizeParts([garbled]), 'ERR_IMAGE_DECODE');
      await rejects(() => ctx.tokenizeParts([{ imagePath: '/nonexistent/image.png' }]), 'ERR_INVALID_ARG');
      await rejects(() => ctx.tokenizeParts([{ text: 'a', image }]), 'ERR_INVALID_ARG');
      await rejects(() => ctx.tokenizeParts([42]), 'ERR_INVALID_ARG');
      await rejects(() => Branch.create(ctx, 0).prefill({ pieces: [] }), 'ERR_INVALID_ARG');
    });

    it('images over the byte and pixel limits', async () => {
      const small = await open({ mmprojPath: projectorPath(), imageMaxBytes: 1000, imageMaxPixels: 64 * 48 });
      try {
        const big = png(64, 48, { pixel: (x, y) => [(x * 131 + y * 71) % 251, (x * y) % 253, (x ^ y) & 255] });
        assert.ok(big.length > 1000);
        await rejects(() => small.tokenizeParts([big]), 'ERR_IMAGE_TOO_LARGE', /imageMaxBytes/);
        await rejects(
          () => small.tokenizeParts([{ imagePath: writeTemp(big) }]),
          'ERR_IMAGE_TOO_LARGE',
          /imageMaxBytes/,
        );
        const flat = png(65, 48, { pixel: () => [1, 2, 3] });
        assert.ok(flat.length < 1000);
        await rejects(() => small.tokenizeParts([flat]), 'ERR_IMAGE_TOO_LARGE', /imageMaxPixels/);
        const fits = await small.tokenizeParts([png(64, 48, { pixel: () => [1, 2, 3] })]);
        assert.equal(fits.nImages, 1);
      } finally {
        small.dispose();
      }
      await rejects(() => open({ mmprojPath: projectorPath(), imageMaxPixels: 0 }), 'ERR_INVALID_ARG');
    });

    it('more image positions than nBatch or nCtx hold: refused before anything is written', async () => {
      const narrow = await open({ mmprojPath: projectorPath(), nBatch: IMAGE_TOKENS - 1, nCtx: 64 });
      try {
        const prompt = await narrow.tokenizeParts(['Look: ', image]);
        const b = Branch.create(narrow, 0, GREEDY);
        await rejects(() => b.prefill(prompt), 'ERR_IMAGE_POSITIONS', /nBatch >= 16/);
        assert.equal(b.position, 0);
        assert.equal(narrow.kvSeqPosMax(b.seqId), -1, 'nothing written');
        assert.equal(narrow.imageStats().encodes, 0, 'nothing encoded');
        await b.prune();
      } finally {
        narrow.dispose();
      }
      const short = await open({ mmprojPath: projectorPath(), nCtx: 256 });
      try {
        assert.equal(short.nCtx, 256);
        const prompt = await short.tokenizeParts(['Look: ', image]);
        const b = Branch.create(short, 0, GREEDY);
        await b.prefill((await short.tokenize('x '.repeat(300))).slice(0, 256 - prompt.nPos - 5));
        await b.prefill(prompt);
        const position = b.position;
        assert.ok(position + prompt.nPos > 256);
        const logits = Float32Array.from(b.getLogits());
        await rejects(() => b.prefill(prompt), 'ERR_IMAGE_POSITIONS', /nCtx/);
        assert.equal(b.position, position, 'the branch is unchanged');
        assert.equal(short.kvSeqPosMax(b.seqId), position - 1);
        assert.equal(maxAbsDiff(b.getLogits(), logits), 0);
        assert.equal(short.imageStats().encodes, 1);
        await b.prune();
      } finally {
        short.dispose();
      }
    });

    it('an image without a projector; a projector for another model width, or no projector file', async () => {
      const plain = await open();
      try {
        assert.equal(plain.hasProjector, false);
        await rejects(() => plain.tokenizeParts(['Look: ', image]), 'ERR_NO_PROJECTOR', /mmprojPath/);
        assert.deepEqual(plain.imageStats(), { images: 0, encodes: 0, encodeMs: 0 });
        // A prompt of another context's projector is refused.
        const foreign = await ctx.tokenizeParts(['Look: ', image]);
        const b = Branch.create(plain, 0, GREEDY);
        await rejects(() => b.prefill(foreign), 'ERR_NO_PROJECTOR');
        await b.prune();
      } finally {
        plain.dispose();
      }
      await rejects(() => open({ mmprojPath: projectorPath(512) }), 'ERR_PROJECTOR_MISMATCH', /n_embd/);
      await rejects(() => open({ mmprojPath: '/nonexistent/mmproj.gguf' }), 'ERR_PROJECTOR_LOAD');
      const notGguf = writeTemp(Buffer.from('definitely not a gguf file'));
      await rejects(() => open({ mmprojPath: notGguf }), 'ERR_PROJECTOR_LOAD');
    });

    it('the context still works after every refusal', async () => {
      const prompt = await ctx.tokenizeParts(['Look: ', image]);
      const b = Branch.create(ctx, 0, GREEDY);
      await b.prefill(prompt);
      const { tokens } = await b.generate({ maxTokens: 2 });
      assert.equal(tokens.length, 2);
      await b.prune();
      assert.equal(new BranchStore(ctx).kvPressure().cellsUsed, 0);
    });
  });
});

describe('image_url parts of chat requests (lib/server/openai.js)', function () {
  const { generateRequest } = require('../lib/server/openai');
  const env = { modelName: 'm', limits: { maxN: 8, maxTokens: 64 }, reasoningFormat: 'none' };
  const ask = (part, vision = false) =>
    generateRequest(
      'chat',
      { messages: [{ role: 'user', content: [{ type: 'text', text: 'What is it?' }, part] }] },
      { ...env, vision },
    );
  const inline = `data:image/png;base64,${png(8, 8).toString('base64')}`;

  it('an http(s) image URL is never fetched; without a projector a data URL names --mmproj; both name the part', async () => {
    for (const vision of [false, true]) {
      const remote = await rejects(
        () => ask({ type: 'image_url', image_url: { url: 'https://example.com/a.png' } }, vision),
        'ERR_INVALID_ARG',
      );
      assert.match(remote.message, /messages\[0\]\.content\[1\]: image URLs are never fetched.*data URLs only/);
      assert.equal(remote.param, 'messages');
    }
    const data = await rejects(() => ask({ type: 'image_url', image_url: { url: inline } }), 'ERR_INVALID_ARG');
    assert.match(data.message, /messages\[0\]\.content\[1\]: this server has no image projector.*--mmproj/);
  });

  it('with a projector, a base64 data URL becomes the image bytes; other URLs and parts are 400s', async () => {
    const request = ask({ type: 'image_url', image_url: { url: inline } }, true);
    const [text, img] = request.messages[0].content;
    assert.deepEqual(text, { type: 'text', text: 'What is it?' });
    assert.equal(img.type, 'image');
    assert.deepEqual(Buffer.from(img.image), png(8, 8));
    const notBase64 = await rejects(
      () => ask({ type: 'image_url', image_url: { url: 'data:image/png,rawbytes' } }, true),
      'ERR_INVALID_ARG',
    );
    assert.match(notBase64.message, /base64 data URL/);
    await rejects(() => ask({ type: 'input_audio', input_audio: {} }, true), 'ERR_INVALID_ARG');
    const system = await rejects(
      () =>
        generateRequest(
          'chat',
          { messages: [{ role: 'system', content: [{ type: 'image_url', image_url: { url: inline } }] }] },
          { ...env, vision: true },
        ),
      'ERR_INVALID_ARG',
    );
    assert.match(system.message, /user messages only/);
  });
});

/** The default pattern of `png` for `seed`, as a pixel function. */
function patternOf(seed) {
  return (x, y) => [(x * 7 + y * 3 + seed * 41) & 255, (x * y + seed * 97) & 255, (x * 13 + y * 29 + seed) & 255];
}

let temps = 0;
/** `bytes` written to a fresh temporary file; its path. */
function writeTemp(bytes) {
  const file = path.join(os.tmpdir(), `llama-branch-images-${process.pid}-${temps++}`);
  fs.writeFileSync(file, bytes);
  process.once('exit', () => fs.rmSync(file, { force: true }));
  return file;
}
