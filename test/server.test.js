'use strict';

// `llama-branch serve` as a real child process on 127.0.0.1 (ephemeral port), driven by the
// official `openai` client: completions and chat, streaming and not, n, JSON schema, stop
// strings, abort mid-stream, concurrency, and bad requests that must not take the server down.
// Every response to an OpenAI operation is validated against OpenAI's published schemas
// (test/openapi): `fetch` in this file is the checking one, and the client is given it.

const assert = require('node:assert/strict');
const path = require('node:path');
const OpenAI = require('openai');
const { MODEL } = require('./helpers');
const { listDevices } = require('..');
const { serveUntilExit, startServer, stopServer, waitFor } = require('./serve-helpers');
const { conformanceChecker } = require('./openapi/conformance');

const conformance = conformanceChecker();
const { fetch } = conformance;

const GREEDY = { temperature: 0 };

describe('llama-branch serve (OpenAI-compatible server)', function () {
  this.timeout(240000);
  let server;
  let client;
  let model;
  const health = async () => (await fetch(`${server.url}/health`)).json();

  before(async () => {
    server = await startServer(['--parallel', '4', '--ctx-size', '4096', '--threads', '2']);
    assert.match(server.url, /^http:\/\/127\.0\.0\.1:\d+$/, 'binds to loopback by default');
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'x', maxRetries: 0, fetch });
    model = path.basename(MODEL).replace(/\.gguf$/, '');
  });
  afterEach(() => conformance.assertConforms());
  after(async () => {
    if (server)
      assert.equal(
        await stopServer(server.child),
        0,
        `the server exits cleanly on SIGTERM; stderr: ${server.stderr()}`,
      );
  });

  it('lists its model and reports health', async () => {
    const list = await client.models.list();
    assert.deepEqual(
      list.data.map((m) => m.id),
      [model],
    );
    const h = await health();
    assert.equal(h.status, 'ok');
    assert.equal(h.running, 0);
    assert.equal(typeof h.cellsUsed, 'number');
  });

  it('completions: non-streaming and streaming', async () => {
    const r = await client.completions.create({ model, prompt: 'The capital of France is', max_tokens: 8, ...GREEDY });
    assert.equal(r.object, 'text_completion');
    assert.equal(r.choices.length, 1);
    assert.ok(r.choices[0].text.trim().length > 0);
    assert.equal(r.choices[0].finish_reason, 'length');
    assert.equal(r.usage.completion_tokens, 8);
    assert.ok(r.usage.prompt_tokens > 0);

    const stream = await client.completions.create({
      model,
      prompt: 'The capital of Italy is',
      max_tokens: 8,
      stream: true,
      stream_options: { include_usage: true },
      ...GREEDY,
    });
    let text = '';
    let finish = null;
    let usage = null;
    let chunks = 0;
    for await (const chunk of stream) {
      chunks++;
      if (chunk.usage) usage = chunk.usage;
      for (const c of chunk.choices) {
        text += c.text;
        if (c.finish_reason) finish = c.finish_reason;
      }
    }
    assert.ok(chunks >= 3, `${chunks} chunks`);
    assert.ok(text.trim().length > 0);
    assert.equal(finish, 'length');
    assert.equal(usage.completion_tokens, 8);
  });

  it('chat: non-streaming and streaming, through the chat template', async () => {
    const messages = [
      { role: 'system', content: 'You answer in one word.' },
      { role: 'user', content: 'What colour is the sky?' },
    ];
    const r = await client.chat.completions.create({ model, messages, max_tokens: 12, ...GREEDY });
    assert.equal(r.object, 'chat.completion');
    assert.equal(r.choices[0].message.role, 'assistant');
    assert.ok(r.choices[0].message.content.trim().length > 0);
    assert.ok(['stop', 'length'].includes(r.choices[0].finish_reason));

    const stream = await client.chat.completions.create({
      model,
      messages: [messages[0], { role: 'user', content: 'What colour is grass?' }],
      max_tokens: 12,
      stream: true,
      ...GREEDY,
    });
    let content = '';
    let role = null;
    let finish = null;
    for await (const chunk of stream) {
      const [c] = chunk.choices;
      if (c.delta.role) role = c.delta.role;
      content += c.delta.content || '';
      if (c.finish_reason) finish = c.finish_reason;
    }
    assert.equal(role, 'assistant');
    assert.ok(content.trim().length > 0);
    assert.ok(['stop', 'length'].includes(finish));
    // the shared system prompt came from the prefix cache
    const again = await client.chat.completions.create({
      model,
      messages: [messages[0], { role: 'user', content: 'What colour is snow?' }],
      max_tokens: 2,
      ...GREEDY,
    });
    assert.ok(again.usage.prompt_tokens_details.cached_tokens > 0, JSON.stringify(again.usage));
  });

  it('n = 3 gives three choices from one prompt', async () => {
    const r = await client.completions.create({
      model,
      prompt: 'My favourite fruit is',
      max_tokens: 6,
      n: 3,
      temperature: 1,
      seed: 7,
    });
    assert.deepEqual(
      r.choices.map((c) => c.index),
      [0, 1, 2],
    );
    assert.equal(r.usage.completion_tokens, 18);
    const chat = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'Name a fruit.' }],
      max_tokens: 4,
      n: 3,
      temperature: 1,
      seed: 7,
    });
    assert.equal(chat.choices.length, 3);
  });

  it("response_format json_schema: the content parses and has the schema's fields", async () => {
    const schema = {
      type: 'object',
      properties: { city: { type: 'string', maxLength: 12 }, population: { type: 'integer', maximum: 100000000 } },
      required: ['city', 'population'],
      additionalProperties: false,
    };
    const r = await client.chat.completions.create({
      model,
      messages: [{ role: 'user', content: 'Give a city and its population as JSON.' }],
      max_tokens: 40,
      response_format: { type: 'json_schema', json_schema: { name: 'city', schema } },
      ...GREEDY,
    });
    const value = JSON.parse(r.choices[0].message.content);
    assert.equal(typeof value.city, 'string');
    assert.ok(Number.isInteger(value.population));
  });

  it('stop strings end the text before them', async () => {
    const r = await client.completions.create({
      model,
      prompt: '1, 2, 3, 4, 5,',
      max_tokens: 10,
      stop: [', 8'],
      ...GREEDY,
    });
    assert.equal(r.choices[0].text, ' 6, 7');
    assert.equal(r.choices[0].finish_reason, 'stop');
  });

  it('a client aborting mid-stream frees its request; the server keeps serving', async () => {
    const before = await health(); // tests run one at a time: what changes below is this request's
    const controller = new AbortController();
    const stream = await client.completions.create(
      { model, prompt: 'Write a long story about a dragon.', max_tokens: 400, stream: true, ...GREEDY },
      { signal: controller.signal },
    );
    let chunks = 0;
    // the client's stream iterator ends quietly once its signal aborts
    for await (const _chunk of stream) {
      if (++chunks === 3) controller.abort();
    }
    assert.equal(chunks, 3);
    const h = await waitFor(async () => {
      const s = await health();
      return s.running === 0 && s.completed > before.completed ? s : null;
    }, 'the aborted request to be freed');
    const own = h.generatedTokens - before.generatedTokens;
    // Ignoring the abort would generate all 400; a few steps pass before the server notices.
    assert.ok(
      own >= 3 && own < 40,
      `the aborted request generated ${own} tokens; it should stop within a few steps of the abort`,
    );
    const r = await client.completions.create({ model, prompt: 'Still alive?', max_tokens: 3, ...GREEDY });
    assert.equal(r.usage.completion_tokens, 3);
  });

  it('8 concurrent requests all complete', async () => {
    const topics = ['cats', 'dogs', 'birds', 'fish', 'trees', 'rivers', 'stars', 'clouds'];
    const results = await Promise.all(
      topics.map((t, i) =>
        i % 2
          ? client.completions.create({ model, prompt: `A short fact about ${t}:`, max_tokens: 6, ...GREEDY })
          : client.chat.completions.create({
              model,
              messages: [{ role: 'user', content: `Tell me about ${t}.` }],
              max_tokens: 6,
              ...GREEDY,
            }),
      ),
    );
    for (const r of results) {
      assert.equal(r.choices.length, 1);
      assert.equal(r.usage.completion_tokens <= 6, true);
      assert.ok(r.usage.completion_tokens >= 1);
    }
    assert.equal((await health()).running, 0);
  });

  it('malformed bodies, bad fields and unknown models get a 4xx with an OpenAI error body', async () => {
    const post = (route, body, headers = { 'content-type': 'application/json' }) =>
      fetch(`${server.url}${route}`, { method: 'POST', headers, body });
    const expectError = async (responsePromise, status, pattern) => {
      const res = await responsePromise;
      assert.equal(res.status, status);
      const { error } = await res.json();
      assert.equal(typeof error.message, 'string');
      assert.equal(typeof error.type, 'string');
      if (pattern) assert.match(error.message, pattern);
    };
    await expectError(post('/v1/completions', '{"prompt": "x", '), 400, /not valid JSON/);
    await expectError(post('/v1/chat/completions', '[1, 2]'), 400, /JSON object/);
    await expectError(post('/v1/completions', JSON.stringify({ max_tokens: 3 })), 400, /prompt/);
    await expectError(post('/v1/completions', JSON.stringify({ prompt: 'x', n: 0 })), 400, /\bn\b/);
    await expectError(post('/v1/completions', JSON.stringify({ prompt: 'x', temperature: 'hot' })), 400, /temperature/);
    await expectError(post('/v1/chat/completions', JSON.stringify({ messages: 'hi' })), 400, /messages/);
    await expectError(
      post(
        '/v1/chat/completions',
        JSON.stringify({
          messages: [{ role: 'user', content: 'x' }],
          response_format: { type: 'json_schema', json_schema: { schema: { type: 'nonsense-type' } } },
        }),
      ),
      400,
    );
    await expectError(post('/v1/completions', JSON.stringify({ prompt: 'x', max_tokens: 100000 })), 400, /cap/);
    await expectError(post('/v1/completions', JSON.stringify({ prompt: 'x', n: 16, max_tokens: 4000 })), 400, /nCtx/);
    await expectError(post('/v1/completions', 'x'.repeat(2 << 20)), 413);
    await expectError(fetch(`${server.url}/v1/nothing-here`), 404);
    await expectError(fetch(`${server.url}/v1/completions`), 405);
    // through the official client: its error classes carry the status
    await assert.rejects(
      () => client.completions.create({ model: 'no-such-model', prompt: 'x', max_tokens: 1 }),
      (e) => e.status === 404 && /does not exist/.test(e.message),
    );
    await assert.rejects(
      () => client.chat.completions.create({ model, messages: [], max_tokens: 1 }),
      (e) => e.status === 400,
    );
    // and the server still serves
    const r = await client.completions.create({ model, prompt: 'After all that,', max_tokens: 2, ...GREEDY });
    assert.equal(r.usage.completion_tokens, 2);
    assert.equal((await health()).status, 'ok');
  });
});

describe('llama-branch serve: --gpu, --n-gpu-layers, --cache-type-k/-v, --flash-attn', function () {
  this.timeout(240000);
  afterEach(() => conformance.assertConforms());

  it('--gpu cpu --n-gpu-layers 0 with a q8_0 KV cache serves completions', async () => {
    const server = await startServer([
      ...['--gpu', 'cpu', '--n-gpu-layers', '0', '--ctx-size', '1024', '--threads', '2'],
      ...['--cache-type-k', 'q8_0', '--cache-type-v', 'q8_0', '--flash-attn', 'on'],
    ]);
    try {
      const res = await fetch(`${server.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: 'The capital of France is', max_tokens: 4, ...GREEDY }),
      });
      assert.equal(res.status, 200);
      const body = await res.json();
      assert.equal(body.usage.completion_tokens, 4);
      assert.ok(body.choices[0].text.length > 0);
    } finally {
      assert.equal(await stopServer(server.child), 0, `clean exit; stderr: ${server.stderr()}`);
    }
  });

  it('refuses bad values with exit code 2 and a message naming the flag', () => {
    for (const [args, message] of [
      [['--gpu', 'cuda'], /--gpu must be one of auto, vulkan, cpu, got "cuda"/],
      [['--gpu', ''], /--gpu must be one of/],
      [['--n-gpu-layers=-1'], /--n-gpu-layers must be a non-negative integer/],
      [['--n-gpu-layers', '2.5'], /--n-gpu-layers must be a non-negative integer/],
      [['--gpu', 'cpu', '--n-gpu-layers', '4'], /--n-gpu-layers 4 needs a GPU, but --gpu cpu/],
      [['--cache-type-k', 'q5_1'], /--cache-type-k must be one of f16, q8_0, q4_0, got "q5_1"/],
      [['--cache-type-v', 'bf16'], /--cache-type-v must be one of f16, q8_0, q4_0/],
      [['--flash-attn', 'yes'], /--flash-attn must be one of auto, on, off/],
      [
        ['--cache-type-v', 'q4_0', '--flash-attn', 'off'],
        /--cache-type-v q4_0 needs flash attention: use --flash-attn auto or on/,
      ],
    ]) {
      const { status, stderr } = serveUntilExit(args);
      assert.equal(status, 2, `${args.join(' ')}: ${stderr}`);
      assert.match(stderr, message, args.join(' '));
    }
  });

  it("--n-gpu-layers above the model's layers fails with ERR_DEVICE naming the flag", () => {
    const { status, stderr } = serveUntilExit(['--n-gpu-layers', '1000', '--ctx-size', '1024']);
    assert.equal(status, 1, stderr);
    assert.match(stderr, /--n-gpu-layers: nGpuLayers is 1000 .*use 0\.\.=\d+ \(ERR_DEVICE\)/);
  });

  it('--gpu vulkan insists on a Vulkan device: it serves on one, or exits saying why there is none', async () => {
    const vulkan = listDevices().filter((d) => d.type === 'gpu' && /^vulkan/i.test(d.name));
    if (vulkan.length > 0) {
      const server = await startServer(['--gpu', 'vulkan', '--ctx-size', '1024']);
      assert.equal(await stopServer(server.child), 0, `clean exit; stderr: ${server.stderr()}`);
      return;
    }
    const { status, stderr } = serveUntilExit(['--gpu', 'vulkan', '--ctx-size', '1024']);
    assert.equal(status, 1, `a failed start, not a crash (a signal leaves status null); stderr: ${stderr}`);
    // the flag, what is missing, and after it why (the module package's reason or this build's)
    assert.match(stderr, /^error: --gpu vulkan: .*no Vulkan device is available\. \S.*\(ERR_DEVICE\)$/m);
  });
});
