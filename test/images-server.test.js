'use strict';

// `llama-branch serve --mmproj` (issue 49, slice 2): chat completions with image_url parts as
// base64 data URLs, as a real server process on 127.0.0.1 driven by the real `openai` client, on
// the default model and the random-weight gemma3 test projector (16 image positions). Exact
// properties only: usage counts the image positions, the same image gives the same greedy text,
// n choices after one image run the encoder once (/metrics), every bad input is a 400 with its
// message and the server keeps serving.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const OpenAI = require('openai');
const { startServer, stopServer, serveUntilExit } = require('./serve-helpers');
const {
  projectorPath,
  projectorMissing,
  startProjectorServer,
  needWriter,
  metric,
  png,
  jpeg,
} = require('./helpers/images');

const IMAGE_TOKENS = 16;

const dataUrl = (bytes, type = 'image/png') => `data:${type};base64,${Buffer.from(bytes).toString('base64')}`;
const imagePart = (url) => ({ type: /** @type {const} */ ('image_url'), image_url: { url } });
const ask = (...parts) => [{ role: /** @type {const} */ ('user'), content: parts }];
const text = (t) => ({ type: /** @type {const} */ ('text'), text: t });

/** The status and error body of a chat completion posted as JSON. */
async function post(url, body) {
  const res = await fetch(`${url}/v1/chat/completions`, {
    method: 'POST',
    headers: { 'content-type': 'application/json' },
    body: JSON.stringify({ model: 'x', max_tokens: 4, ...body }),
  });
  return { status: res.status, body: await res.json() };
}

describe('llama-branch serve --mmproj: chat completions with images', function () {
  if (projectorMissing()) return;

  let server;
  let client;
  const image = png(64, 48, { seed: 1 });
  const other = png(64, 48, { seed: 2 });

  before(async () => {
    needWriter();
    server = await startProjectorServer();
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, fetch });
  });
  after(async () => {
    if (server) await stopServer(server.child);
  });

  it('/v1/models says the model takes text and images', async () => {
    const models = await client.models.list();
    const card = /** @type {any} */ (models.data[0]);
    assert.deepEqual(card.architecture.input_modalities, ['text', 'image']);
    assert.deepEqual(card.architecture.output_modalities, ['text']);
    assert.deepEqual(card.modalities, { vision: true, audio: false });
  });

  it('an image data URL answers 200; usage counts the image positions; the same image gives the same greedy text', async () => {
    const chat = (...images) =>
      client.chat.completions.create({
        model: 'x',
        messages: ask(text('What is in the picture?'), ...images.map((i) => imagePart(dataUrl(i)))),
        max_tokens: 8,
        temperature: 0,
      });
    const plain = await chat();
    const one = await chat(image);
    const again = await chat(image);
    const two = await chat(image, other);
    const three = await chat(image, other, image);
    assert.equal(one.choices[0].message.role, 'assistant');
    assert.equal(again.choices[0].message.content, one.choices[0].message.content);
    assert.equal(again.usage.completion_tokens, one.usage.completion_tokens);
    // Each image takes its 16 positions plus its markers, the same for every image.
    const perImage = two.usage.prompt_tokens - one.usage.prompt_tokens;
    assert.ok(perImage >= IMAGE_TOKENS, `${perImage} positions per image`);
    assert.equal(three.usage.prompt_tokens - two.usage.prompt_tokens, perImage);
    assert.ok(one.usage.prompt_tokens >= plain.usage.prompt_tokens + IMAGE_TOKENS);
    assert.equal(one.usage.prompt_tokens_details.cached_tokens, 0, 'the first prompt with this image');
    // The same image bytes again: the whole prompt comes from the prefix cache.
    assert.equal(again.usage.prompt_tokens_details.cached_tokens, again.usage.prompt_tokens);
  });

  it('POST /tokenize of messages with an image: its positions as keys of its bytes (negative, never token ids)', async () => {
    const tokenize = async (img) => {
      const res = await fetch(`${server.url}/tokenize`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ messages: ask(text('What is in the picture?'), imagePart(dataUrl(img))) }),
      });
      assert.equal(res.status, 200);
      const { count, tokens } = await res.json();
      assert.equal(count, tokens.length);
      assert.ok(tokens.every((t) => Number.isInteger(t)));
      return tokens.filter((t) => t < 0);
    };
    const keys = await tokenize(image);
    assert.equal(keys.length, IMAGE_TOKENS);
    assert.deepEqual(await tokenize(Buffer.from(image)), keys, 'the same bytes, the same keys');
    const others = await tokenize(other);
    assert.equal(others.length, IMAGE_TOKENS);
    assert.ok(
      others.every((k, i) => k !== keys[i]),
      'another image, other keys at every position',
    );
  });

  it('the prefix cache: the same image bytes hit (no encode in /metrics), one changed pixel misses', async () => {
    const base = (x, y) => [(x * 7 + y * 3 + 5 * 41) & 255, (x * y + 5 * 97) & 255, (x * 13 + y * 29 + 5) & 255];
    const img = png(64, 48, { pixel: base });
    const changed = png(64, 48, { pixel: (x, y) => (x === 60 && y === 40 ? [0, 0, 0] : base(x, y)) });
    const chat = (bytes) =>
      client.chat.completions.create({
        model: 'x',
        messages: ask(text('Look closely.'), imagePart(dataUrl(bytes)), text('What is it?')),
        max_tokens: 2,
        temperature: 0,
      });
    const encodes = () => metric(server.url, 'llamabranch_image_encodes_total');
    const e0 = await encodes();
    const first = await chat(img);
    assert.equal(await encodes(), e0 + 1);
    const hit = await chat(img);
    assert.equal(await encodes(), e0 + 1, 'the same bytes: not encoded again');
    assert.equal(hit.usage.prompt_tokens_details.cached_tokens, hit.usage.prompt_tokens);
    assert.equal(hit.choices[0].message.content, first.choices[0].message.content);
    const miss = await chat(changed);
    assert.equal(await encodes(), e0 + 2, 'one changed pixel: encoded');
    assert.ok(
      miss.usage.prompt_tokens_details.cached_tokens <= miss.usage.prompt_tokens - IMAGE_TOKENS,
      JSON.stringify(miss.usage),
    );
  });

  it('n: 3 choices after one image: the encoder counter in /metrics moves by 1', async () => {
    const before = await metric(server.url, 'llamabranch_image_encodes_total');
    const res = await client.chat.completions.create({
      model: 'x',
      messages: ask(imagePart(dataUrl(other)), text('Describe it.')),
      max_tokens: 6,
      n: 3,
      temperature: 1,
      seed: 3,
    });
    assert.equal(res.choices.length, 3);
    assert.equal(await metric(server.url, 'llamabranch_image_encodes_total'), before + 1);
  });

  it('a JPEG data URL through the openai client: 200, its 16 positions in usage, one encoder run', async () => {
    // test/helpers/images.js encodes the JPEG (baseline; 61×45, so its edge blocks are partial).
    const photo = dataUrl(jpeg(61, 45, { seed: 2 }), 'image/jpeg');
    const chat = (...parts) =>
      client.chat.completions
        .create({ model: 'x', messages: ask(text('What is in the picture?'), ...parts), max_tokens: 4, temperature: 0 })
        .withResponse();
    const before = await metric(server.url, 'llamabranch_image_encodes_total');
    const { data, response } = await chat(imagePart(photo));
    assert.equal(response.status, 200);
    assert.equal(await metric(server.url, 'llamabranch_image_encodes_total'), before + 1);
    assert.ok(data.choices[0].message.content !== undefined);
    // The JPEG takes the positions the same pixels take as a PNG: 16 of the image and its markers.
    const plain = (await chat()).data.usage.prompt_tokens;
    const asPng = (await chat(imagePart(dataUrl(png(61, 45, { seed: 2 }))))).data.usage.prompt_tokens;
    assert.equal(data.usage.prompt_tokens, asPng);
    assert.ok(data.usage.prompt_tokens >= plain + IMAGE_TOKENS, `${data.usage.prompt_tokens} vs ${plain} without`);
    const res = await fetch(`${server.url}/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ messages: ask(text('What is in the picture?'), imagePart(photo)) }),
    });
    const { tokens } = await res.json();
    assert.equal(tokens.filter((t) => t < 0).length, IMAGE_TOKENS, "the image's keys");
    assert.equal(tokens.length, data.usage.prompt_tokens);
  });

  it('a WebP data URL through the openai client: 200, the positions of a PNG, one encoder run', async () => {
    const file = fs.readFileSync(path.join(__dirname, 'fixtures', 'seed77-40x32-lossy.webp'));
    const chat = (part) =>
      client.chat.completions.create({
        model: 'x',
        messages: ask(text('What is in the picture?'), part),
        max_tokens: 2,
        temperature: 0,
      });
    const before = await metric(server.url, 'llamabranch_image_encodes_total');
    const data = await chat(imagePart(dataUrl(file, 'image/webp')));
    assert.equal(await metric(server.url, 'llamabranch_image_encodes_total'), before + 1);
    const asPng = await chat(imagePart(dataUrl(png(40, 32, { seed: 77 }))));
    assert.equal(data.usage.prompt_tokens, asPng.usage.prompt_tokens);
  });

  it('a streamed chat with an image streams its text', async () => {
    const stream = await client.chat.completions.create({
      model: 'x',
      messages: ask(text('Look: '), imagePart(dataUrl(image))),
      max_tokens: 4,
      temperature: 0,
      stream: true,
    });
    let chunks = 0;
    for await (const chunk of stream) if (chunk.choices.length > 0) chunks++;
    assert.ok(chunks > 0);
  });

  it('every bad image input is a 400 saying what is wrong; the server keeps serving', async () => {
    const cases = [
      [imagePart('https://example.com/cat.png'), 'invalid_request_error', /never fetched.*data URLs only/],
      [imagePart('data:image/png,notbase64'), 'invalid_request_error', /base64 data URL/],
      [imagePart(dataUrl(image.subarray(0, 60))), 'image_decode', /./],
      [imagePart(dataUrl(Buffer.from('plain text, not an image'), 'image/webp')), 'image_format', /./],
      [
        { type: 'input_audio', input_audio: { data: 'AAAA', format: 'wav' } },
        'invalid_request_error',
        /text and image_url/,
      ],
    ];
    for (const [part, code, message] of cases) {
      const { status, body } = await post(server.url, { messages: ask(text('Hi'), part) });
      assert.equal(status, 400, JSON.stringify(body));
      assert.ok(body.error.code === code || body.error.type === code, JSON.stringify(body));
      assert.match(body.error.message, message);
    }
    // Streamed: the bad image is found before the stream opens.
    const streamed = await post(server.url, {
      messages: ask(text('Hi'), imagePart(dataUrl(image.subarray(0, 60)))),
      stream: true,
    });
    assert.equal(streamed.status, 400);
    assert.equal(streamed.body.error.code, 'image_decode');
    const ok = await client.chat.completions.create({
      model: 'x',
      messages: ask(text('Still there? '), imagePart(dataUrl(image))),
      max_tokens: 2,
    });
    assert.equal(ok.choices.length, 1);
  });

  it('--image-max-bytes and --image-max-pixels: an image past either is a 400 image_too_large; smaller ones pass', async () => {
    // 40×40 noisy: 1,600 pixels but 4,908 bytes; 64×48 of one colour: 135 bytes but 3,072 pixels.
    const heavy = png(40, 40, { seed: 3 });
    const wide = png(64, 48, { pixel: () => [9, 9, 9] });
    const small = png(16, 16);
    assert.ok(heavy.length > 4000 && wide.length < 4000 && small.length < 4000);
    const limited = await startServer([
      ...['--mmproj', projectorPath(), '--image-max-bytes', '4000', '--image-max-pixels', '2000'],
      ...['--parallel', '1', '--ctx-size', '1024', '--threads', '2', '--model-name', 'x'],
    ]);
    try {
      for (const [img, message] of [
        [heavy, /4908 bytes, over the limit of 4000/],
        [wide, /64×48 = 3072 pixels, over the limit of 2000/],
      ]) {
        const { status, body } = await post(limited.url, { messages: ask(text('Hi'), imagePart(dataUrl(img))) });
        assert.equal(status, 400, JSON.stringify(body));
        assert.equal(body.error.code, 'image_too_large');
        assert.equal(body.error.type, 'invalid_request_error');
        assert.match(body.error.message, message);
      }
      const ok = await post(limited.url, { messages: ask(text('Hi'), imagePart(dataUrl(small))) });
      assert.equal(ok.status, 200, JSON.stringify(ok.body));
      assert.ok(ok.body.usage.prompt_tokens > IMAGE_TOKENS);
    } finally {
      await stopServer(limited.child);
    }
    // The limits belong to a projector: without --mmproj, or at 0, the flags are refused.
    const alone = serveUntilExit(['--image-max-bytes', '4000']);
    assert.equal(alone.status, 2);
    assert.match(alone.stderr, /--image-max-bytes limits the images of --mmproj; give --mmproj FILE too/);
    const zero = serveUntilExit(['--mmproj', projectorPath(), '--image-max-pixels', '0']);
    assert.equal(zero.status, 2);
    assert.match(zero.stderr, /--image-max-pixels must be a positive integer/);
  });

  it('a server without --mmproj: an image is a 400 naming --mmproj; /v1/models says text only', async () => {
    const plain = await startServer(['--parallel', '1', '--ctx-size', '1024', '--threads', '2', '--model-name', 'x']);
    try {
      const models = await (await fetch(`${plain.url}/v1/models`)).json();
      assert.deepEqual(models.data[0].architecture.input_modalities, ['text']);
      assert.equal(models.data[0].modalities.vision, false);
      const { status, body } = await post(plain.url, { messages: ask(text('Hi'), imagePart(dataUrl(image))) });
      assert.equal(status, 400);
      assert.match(body.error.message, /no image projector.*--mmproj/);
      const ok = await post(plain.url, { messages: ask(text('Hi')) });
      assert.equal(ok.status, 200);
    } finally {
      await stopServer(plain.child);
    }
  });
});
