'use strict';

// Decisions about images (issue 49): `POST /v1/decisions` with `input_image` parts in its input and questions,
// driven by the real `openai` client against `llama-branch serve --mmproj` on 127.0.0.1, on the
// default model and the random-weight test projector (16 positions an image). Exact properties
// only: answers in the clients' shape, usage counting the image, the prefix cache finding the same
// image again (no encode in /metrics), a changed image encoded, and every bad input a 400.

const assert = require('node:assert/strict');
const { default: OpenAI } = require('openai');
const { startServer, stopServer } = require('./serve-helpers');
const { projectorMissing, startProjectorServer, needWriter, metric, png } = require('./helpers/images');

const IMAGE_TOKENS = 16;
const MODEL = 'x';
const dataUrl = (bytes) => `data:image/png;base64,${Buffer.from(bytes).toString('base64')}`;
const QUESTIONS = [
  { type: 'predicate', name: 'outdoor', instructions: 'Was this photo taken outdoors?' },
  {
    type: 'choice',
    name: 'subject',
    instructions: 'What is the main subject?',
    choices: [{ value: 'person' }, { value: 'animal' }, { value: 'building' }],
  },
];
const input = (image, text = 'Here is a photo from the archive.') => [
  {
    role: 'user',
    content: [
      { type: 'input_text', text },
      { type: 'input_image', image_url: dataUrl(image) },
    ],
  },
];

describe('POST /v1/decisions with images (llama-branch serve --mmproj, the openai client)', function () {
  this.timeout(240000);
  if (projectorMissing()) return;

  let server;
  let client;
  before(async () => {
    needWriter();
    server = await startProjectorServer();
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, fetch });
  });
  after(async () => {
    if (server) await stopServer(server.child);
  });

  it('answers questions about an input image; the same image again comes from the cache, another one is encoded', async () => {
    const image = png(64, 48, { seed: 51 });
    const encodes = () => metric(server.url, 'llamabranch_image_encodes_total');
    const textOnly = await client.decisions.create({
      model: MODEL,
      input: 'Here is a photo from the archive.',
      questions: QUESTIONS,
    });
    const e0 = await encodes();
    const d = await client.decisions.create({ model: MODEL, input: input(image), questions: QUESTIONS });
    assert.equal(await encodes(), e0 + 1, 'the image is encoded once for both questions');
    assert.equal(d.answers.length, 2);
    assert.ok(d.answers[0].probability >= 0 && d.answers[0].probability <= 1);
    assert.deepEqual(
      d.answers[1].probabilities.map((p) => p.value),
      ['person', 'animal', 'building'],
    );
    assert.ok(
      d.usage.input_tokens >= textOnly.usage.input_tokens + IMAGE_TOKENS,
      `input tokens ${d.usage.input_tokens} count the image's positions (text only: ${textOnly.usage.input_tokens})`,
    );

    const again = await client.decisions.create({
      model: MODEL,
      input: input(Buffer.from(image)),
      questions: QUESTIONS,
    });
    assert.equal(await encodes(), e0 + 1, 'the same image bytes: not encoded again');
    assert.ok(again.usage.input_tokens_details.cached_tokens >= IMAGE_TOKENS, JSON.stringify(again.usage));
    assert.deepEqual(again.answers, d.answers, 'the cached state gives the same answers');

    const changed = png(64, 48, { seed: 52 });
    await client.decisions.create({ model: MODEL, input: input(changed), questions: QUESTIONS });
    assert.equal(await encodes(), e0 + 2, 'another image: encoded');
  });

  it('a question with an image is answered, its image encoded once; bad images are 400s naming the part', async () => {
    const encodes = () => metric(server.url, 'llamabranch_image_encodes_total');
    const e0 = await encodes();
    const d = await client.decisions.create({
      model: MODEL,
      input: input(png(32, 32, { seed: 53 })),
      questions: [
        QUESTIONS[0],
        {
          type: 'predicate',
          instructions: [
            { type: 'input_text', text: 'Is this the same place?' },
            { type: 'input_image', image_url: dataUrl(png(32, 32, { seed: 54 })) },
          ],
        },
      ],
    });
    assert.equal(await encodes(), e0 + 2, "the input's image and the question's, each once");
    assert.deepEqual(
      d.answers.map((a) => a.type),
      ['predicate', 'predicate'],
    );
    for (const a of d.answers) assert.ok(a.probability >= 0 && a.probability <= 1);
    const cases = [
      [[{ role: 'user', content: [{ type: 'input_image', image_url: 'https://example.com/a.png' }] }], /never fetched/],
      [[{ role: 'user', content: [{ type: 'input_image', image_url: 'data:image/png;base64,' }] }], /data URL/],
      [[{ role: 'user', content: [{ type: 'input_image', image_url: dataUrl(Buffer.from('not an image')) }] }], /./],
      [
        [{ role: 'assistant', content: [{ type: 'input_image', image_url: dataUrl(png(8, 8)) }] }],
        /output_text|refusal/,
      ],
    ];
    const withImage = (url) => ({
      type: 'predicate',
      instructions: [
        { type: 'input_text', text: 'Is this the same place?' },
        { type: 'input_image', image_url: url },
      ],
    });
    const questionCases = [
      ['https://example.com/a.png', /never fetched|data: URL/],
      [dataUrl(Buffer.from('not an image')), /./],
    ];
    for (const [url, message] of questionCases) {
      const err = await client.decisions.create({ model: MODEL, input: 'x', questions: [withImage(url)] }).then(
        () => assert.fail(`${url.slice(0, 40)} in a question was answered`),
        (e) => e,
      );
      assert.equal(err.status, 400, `${err.message}`);
      assert.match(err.message, message);
    }
    for (const [body, message] of cases) {
      const err = await client.decisions.create({ model: MODEL, input: body, questions: [QUESTIONS[0]] }).then(
        () => assert.fail(`${JSON.stringify(body).slice(0, 80)} was answered`),
        (e) => e,
      );
      assert.equal(err.status, 400, `${err.message}`);
      assert.match(err.message, message);
    }
    const ok = await client.decisions.create({ model: MODEL, input: 'Still serving?', questions: [QUESTIONS[0]] });
    assert.equal(ok.answers.length, 1);
  });

  it('POST /v1/systemone takes images: <__media__> places one, the rest follow the state; the same image is cached', async () => {
    const post = async (body) => {
      const res = await fetch(`${server.url}/v1/systemone`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({
          model: MODEL,
          questions: { outdoor: { type: 'noul', instructions: 'Outdoors?' } },
          ...body,
        }),
      });
      return { status: res.status, body: await res.json() };
    };
    const encodes = () => metric(server.url, 'llamabranch_image_encodes_total');
    const image = png(48, 48, { seed: 55 });
    const more = await post({ state: 'Photos: <__media__> and <__media__>.', images: [dataUrl(image)] });
    assert.equal(more.status, 400, 'more markers than images');
    assert.equal(more.body.error.param, 'images');
    const e0 = await encodes();
    const a = await post({ state: 'A photo: <__media__> from the archive.', images: [dataUrl(image)] });
    assert.equal(a.status, 200, JSON.stringify(a.body));
    assert.equal(await encodes(), e0 + 1);
    const p = a.body.answers.outdoor.noul;
    assert.ok(p >= 0 && p <= 1);
    // bare base64 is taken as well; the same bytes come from the prefix cache
    const b = await post({
      state: 'A photo: <__media__> from the archive.',
      images: [Buffer.from(image).toString('base64')],
    });
    assert.equal(b.status, 200);
    assert.equal(await encodes(), e0 + 1, 'the same image: not encoded again');
    assert.equal(b.body.answers.outdoor.noul, p);
    const two = await post({ state: 'Two photos.', images: [dataUrl(image), dataUrl(png(48, 48, { seed: 56 }))] });
    assert.equal(two.status, 200);
    assert.ok(two.body.usage.input_tokens >= a.body.usage.input_tokens, JSON.stringify([two.body.usage, a.body.usage]));
    const bad = await post({ state: 'x', images: ['https://example.com/a.png'] });
    assert.equal(bad.status, 400);
    assert.equal(bad.body.error.param, 'images[0]');
  });

  it('a server without --mmproj answers an input image with a 400 naming mmproj', async () => {
    const plain = await startServer(['--parallel', '1', '--ctx-size', '1024', '--threads', '2', '--model-name', MODEL]);
    try {
      const c = new OpenAI({ baseURL: `${plain.url}/v1`, apiKey: 'x', maxRetries: 0, fetch });
      const err = await c.decisions.create({ model: MODEL, input: input(png(16, 16)), questions: [QUESTIONS[0]] }).then(
        () => assert.fail('answered'),
        (e) => e,
      );
      assert.equal(err.status, 400);
      assert.match(err.message, /mmproj/);
    } finally {
      await stopServer(plain.child);
    }
  });
});
