'use strict';

// Branch programs with images (issue 49): `line.append(mediaPrompt)` inside `scheduler.run`, on the
// real default model and the random-weight test projector (16 positions an image). Exact
// properties only: encoder runs, positions, the prefix cache finding the image again across
// programs and requests, coded errors.

const assert = require('node:assert/strict');
const { Scheduler } = require('..');
const { open, rejects } = require('./helpers');
const { projectorPath, projectorMissing, needWriter, png } = require('./helpers/images');

const IMAGE_TOKENS = 16;
const LEAD = 'A photograph from the archive, described for a catalogue. '.repeat(3);

describe('branch programs with images', function () {
  this.timeout(240000);
  if (projectorMissing()) return;

  let ctx;
  let scheduler;
  const encodes = () => ctx.imageStats().encodes;
  before(async function () {
    needWriter();
    ctx = await open({ mmprojPath: projectorPath(), nSeqMax: 8, nCtx: 1024 });
    scheduler = new Scheduler(ctx);
  });
  after(async () => {
    await scheduler?.close();
    ctx?.dispose();
  });

  it('a line appends a MediaPrompt; its forks ask about the image after one encoder run', async () => {
    const prompt = await ctx.tokenizeParts([LEAD, png(64, 48, { seed: 41 }), '\nQuestion:']);
    const e0 = encodes();
    const value = await scheduler.run(
      async (s) => {
        s.append(prompt);
        const keys = s.tokens.filter((t) => t < 0);
        const forks = s.fork(3);
        const answers = await Promise.all(
          forks.map((f, i) => f.append([' What colour?', ' How many?', ' Where?'][i]).gen({ maxTokens: 3 })),
        );
        return { keys, text: s.text, tokens: s.tokens.length, answers };
      },
      { maxBranches: 4, maxCells: 256 },
    );
    assert.equal(encodes(), e0 + 1, 'one encoder run for the line and its three forks');
    assert.equal(value.keys.length, IMAGE_TOKENS, 'the image positions hold its keys (never token ids)');
    assert.equal(value.tokens, prompt.nPos);
    assert.match(value.text, /<__media__>/, "the line's text shows where the image is");
    for (const a of value.answers) assert.ok(a.tokens.length > 0);
  });

  it('the same image in a later program and in a request comes from the prefix cache: no encode', async () => {
    const image = png(64, 48, { seed: 42 });
    const parts = [LEAD, image, '\nQuestion: what is it?\nAnswer:'];
    // A program reserves the cells it declares at admission (evicting cached prefixes for them):
    // these declare what they need, so the first one's cached prompt stays for the second.
    const ask = () =>
      scheduler.run(
        async (s) => {
          s.append(await ctx.tokenizeParts(parts));
          return (await s.gen({ maxTokens: 2 })).tokens;
        },
        { maxCells: 128 },
      );
    const first = await ask();
    const [e1, p1] = [encodes(), scheduler.stats().prefilledTokens];
    const second = await ask();
    assert.equal(encodes(), e1, 'the second program forks the first one’s cached image');
    const prefilled = scheduler.stats().prefilledTokens - p1;
    assert.ok(prefilled < 2, `the second program prefilled ${prefilled} positions`);
    assert.ok(first.length > 0 && second.length > 0);
    const res = await scheduler.generate({ prompt: parts, maxTokens: 2, params: { temperature: 0 } });
    assert.equal(encodes(), e1, 'a request with the same parts finds it too');
    assert.ok(res.usage.cachedPromptTokens > IMAGE_TOKENS, JSON.stringify(res.usage));
  });

  it('two prompts with images on one line, text between: each image encoded once, positions add up', async () => {
    const a = await ctx.tokenizeParts([LEAD, png(32, 32, { seed: 43 })]);
    const b = await ctx.tokenizeParts([png(32, 32, { seed: 44 }), ' Compare them.'], false);
    const e0 = encodes();
    const value = await scheduler.run(
      async (s) => {
        s.append(a).append(' and then').append(b);
        const out = await s.gen({ maxTokens: 2 });
        return { tokens: s.tokens, out };
      },
      { maxCells: 256 },
    );
    assert.equal(encodes(), e0 + 2);
    const between = ctx.tokenizeSync(' and then', false, false).length;
    assert.equal(value.tokens.length, a.nPos + between + b.nPos + value.out.tokens.length);
    assert.equal(value.tokens.filter((t) => t < 0).length, 2 * IMAGE_TOKENS);
  });

  it('a MediaPrompt on a scheduler whose context has no projector: ERR_NO_PROJECTOR, the program goes on', async () => {
    const plain = await open({ nSeqMax: 2 });
    const s = new Scheduler(plain);
    try {
      const prompt = await ctx.tokenizeParts(['Look: ', png(16, 16, { seed: 45 })]);
      const value = await s.run(
        async (line) => {
          const err = await rejects(async () => line.append(prompt), 'ERR_NO_PROJECTOR');
          line.append('Hello');
          return { code: err.code, out: await line.gen({ maxTokens: 1 }) };
        },
        { maxBranches: 1 },
      );
      assert.equal(value.code, 'ERR_NO_PROJECTOR');
      assert.equal(value.out.tokens.length, 1);
    } finally {
      await s.close();
      plain.dispose();
    }
  });

  it('decide: a question whose instructions hold an image forks one line holding it, for every permute order', async () => {
    // A scheduler of its own: the question's head is cached when a lease is spare, as any
    // program line's fork is, and the tests above leave every spare sequence to cached prefixes.
    const c = await open({ mmprojPath: projectorPath(), nSeqMax: 8, nCtx: 1024 });
    const own = new Scheduler(c);
    try {
      await askAboutImages(own, () => c.imageStats().encodes);
    } finally {
      await own.close();
      c.dispose();
    }
  });
});

/** The question-images case above, on `scheduler` (`encodes`: its context's encoder runs). */
async function askAboutImages(scheduler, encodes) {
  const dataUrl = (bytes) => `data:image/png;base64,${Buffer.from(bytes).toString('base64')}`;
  const ask = (image, permute, more = []) =>
    scheduler.decide({
      input: `${LEAD}Two photographs are compared.`,
      permute,
      questions: [
        {
          type: 'choice',
          name: 'kind',
          instructions: [
            { type: 'input_text', text: 'What does this photograph show?' },
            { type: 'input_image', image_url: dataUrl(image) },
          ],
          choices: [{ value: 'a street' }, { value: 'a field' }, { value: 'a room' }],
        },
        ...more,
      ],
    });
  const image = png(48, 48, { seed: 61 });
  const text = { type: 'predicate', name: 'old', instructions: 'Is the archive old?' };
  const e0 = encodes();
  const d = await ask(image, 3, [text]);
  assert.equal(encodes(), e0 + 1, 'one encoder run for the three orders of the question');
  assert.equal(d.answers.length, 2);
  const probs = d.answers[0].probabilities.map((p) => p.probability);
  assert.equal(probs.length, 3);
  assert.ok(Math.abs(probs.reduce((a, b) => a + b, 0) - 1) < 1e-9, `${probs}`);
  const textOnly = await scheduler.decide({ input: `${LEAD}Two photographs are compared.`, questions: [text] });
  assert.ok(
    d.usage.inputTokens >= textOnly.usage.inputTokens + IMAGE_TOKENS,
    `the image's positions are input (${d.usage.inputTokens} against ${textOnly.usage.inputTokens} without it)`,
  );
  assert.equal(d.answers[1].name, 'old', 'the text question beside it is answered');
  assert.ok(d.answers[1].probability >= 0 && d.answers[1].probability <= 1);

  const again = await ask(Buffer.from(image), 3, [text]);
  assert.equal(encodes(), e0 + 1, 'the same bytes: from the prefix cache, not encoded again');
  // From the cache the question decodes in other batch shapes: close, not bitwise (CPU kernels).
  again.answers[0].probabilities.forEach((p, i) =>
    assert.ok(Math.abs(p.probability - probs[i]) < 0.15, `${p.probability} against ${probs[i]}`),
  );
  const other = await ask(png(48, 48, { seed: 62 }), 3, [text]);
  assert.equal(encodes(), e0 + 2, 'another image: encoded');
  assert.notDeepEqual(other.answers[0], d.answers[0], 'another image: other probabilities');

  // An image in a question is checked as one in the input: a corrupt one is refused, coded.
  await rejects(
    () =>
      scheduler.decide({
        input: 'x',
        questions: [
          {
            type: 'predicate',
            instructions: [{ type: 'input_image', image_url: dataUrl(Buffer.from('not an image')) }],
          },
        ],
      }),
    'ERR_IMAGE_FORMAT',
  );
}
