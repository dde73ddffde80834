'use strict';

// The server as agent frameworks use it: tool calls (non-streaming and streamed), logprobs,
// embeddings, /metrics, API keys, CORS and request limits, driven by the clients people point at
// an OpenAI-compatible endpoint: the official `openai` package, Vercel's AI SDK and LangChain.
// The default model is a small base model: these tests check structure (a forced call parses and
// matches its schema, shapes, counts), never the quality of an answer. Every response any client
// here gets from a /v1 operation of OpenAI's is validated against OpenAI's published schemas
// (test/openapi): `fetch` in this file is the checking one, and every client is given it.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const OpenAI = require('openai');
const { MODEL, cosine } = require('./helpers');
const { startServer, stopServer } = require('./serve-helpers');
const { conformanceChecker } = require('./openapi/conformance');

const conformance = conformanceChecker();
const { fetch } = conformance;

const KEYS = ['test-key-one', 'test-key-two'];
const ORIGIN = 'http://app.example';

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'The current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city', 'unit'],
    },
  },
};
const TIME = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'The local time in a time zone',
    parameters: { type: 'object', properties: { zone: { type: 'string' } }, required: ['zone'] },
  },
};
const ASK = [{ role: 'user', content: 'What is the weather in Paris right now?' }];

/** Asserts a tool call's shape and that its arguments parse and match get_weather's schema. */
function assertWeatherCall(call) {
  assert.match(call.id, /^call_[0-9a-f]{24}$/);
  assert.equal(call.type, 'function');
  assert.equal(call.function.name, 'get_weather');
  const args = JSON.parse(call.function.arguments);
  assert.equal(typeof args.city, 'string');
  assert.ok(['celsius', 'fahrenheit'].includes(args.unit), `unit from the enum, got ${args.unit}`);
  assert.deepEqual(Object.keys(args).sort(), ['city', 'unit']);
  return args;
}

describe('a server agents can use', function () {
  this.timeout(240000);
  let server;
  let client;
  let model;
  const url = (p) => `${server.url}${p}`;
  const auth = { authorization: `Bearer ${KEYS[0]}`, 'content-type': 'application/json' };
  const post = (p, body, headers = auth) =>
    fetch(url(p), { method: 'POST', headers, body: typeof body === 'string' ? body : JSON.stringify(body) });
  const metrics = async () => {
    const text = await (await fetch(url('/metrics'), { headers: auth })).text();
    const values = new Map();
    for (const line of text.split('\n')) {
      if (line === '' || line.startsWith('#')) continue;
      // Metric names may hold colons (the router gauges `llamabranch:…`, as vLLM's `vllm:…`).
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*(?:\{[^}]*\})?) (\S+)$/.exec(line);
      assert.ok(m, `a Prometheus sample line: ${line}`);
      values.set(m[1], Number(m[2]));
    }
    return values;
  };

  before(async () => {
    server = await startServer(
      [
        '--parallel',
        '4',
        '--ctx-size',
        '4096',
        '--threads',
        '2',
        '--embeddings',
        '--api-key',
        KEYS[0],
        '--cors',
        ORIGIN,
      ],
      { ...process.env, LLAMA_BRANCH_API_KEY: KEYS[1] },
    );
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEYS[0], maxRetries: 0, fetch });
    model = path.basename(MODEL).replace(/\.gguf$/, '');
  });
  afterEach(() => conformance.assertConforms());
  after(async () => {
    if (server) assert.equal(await stopServer(server.child), 0, `clean exit; stderr: ${server.stderr()}`);
  });

  describe('tool calls (openai)', () => {
    it('a required call parses, matches the schema, and the tool result gets an answer', async () => {
      const r = await client.chat.completions.create({
        model,
        messages: ASK,
        tools: [WEATHER],
        tool_choice: 'required',
        max_tokens: 96,
        temperature: 0,
      });
      const choice = r.choices[0];
      assert.equal(choice.finish_reason, 'tool_calls');
      assert.equal(choice.message.content, null);
      assert.equal(choice.message.refusal, null);
      assert.equal(choice.message.tool_calls.length, 1);
      const call = choice.message.tool_calls[0];
      assertWeatherCall(call);

      const answer = await client.chat.completions.create({
        model,
        messages: [
          ...ASK,
          choice.message,
          { role: 'tool', tool_call_id: call.id, content: JSON.stringify({ temperature: 21, sky: 'clear' }) },
        ],
        tools: [WEATHER],
        tool_choice: 'none',
        max_tokens: 24,
        temperature: 0,
      });
      const final = answer.choices[0];
      assert.equal(final.message.tool_calls, undefined, 'tool_choice none: no call');
      assert.equal(typeof final.message.content, 'string');
      assert.ok(final.message.content.length > 0);
      assert.ok(['stop', 'length'].includes(final.finish_reason));
    });

    it('a named function is always the one called, in every one of n choices', async () => {
      const r = await client.chat.completions.create({
        model,
        messages: [{ role: 'user', content: 'What time is it in Tokyo?' }],
        tools: [TIME, WEATHER],
        tool_choice: { type: 'function', function: { name: 'get_weather' } },
        n: 3,
        max_tokens: 96,
        temperature: 0.9,
        seed: 7,
      });
      assert.equal(r.choices.length, 3);
      for (const c of r.choices) {
        assert.equal(c.finish_reason, 'tool_calls');
        assertWeatherCall(c.message.tool_calls[0]);
      }
    });

    it('forced calls parse and validate every time (20 sampled choices at temperature 0.7)', async () => {
      const asks = [
        [ASK, 11],
        [[{ role: 'user', content: 'Is it late in Sydney?' }], 12],
      ];
      const choices = [];
      for (const [messages, seed] of asks) {
        const r = await client.chat.completions.create({
          model,
          messages,
          tools: [WEATHER, TIME],
          tool_choice: 'required',
          parallel_tool_calls: false,
          n: 10,
          max_tokens: 128,
          temperature: 0.7,
          seed,
        });
        choices.push(...r.choices);
      }
      for (const c of choices) {
        assert.equal(c.finish_reason, 'tool_calls', `finished with a call: ${JSON.stringify(c.message)}`);
        assert.equal(c.message.tool_calls.length, 1, 'parallel_tool_calls false: one call');
        const call = c.message.tool_calls[0];
        if (call.function.name === 'get_weather') assertWeatherCall(call);
        else assert.equal(typeof JSON.parse(call.function.arguments).zone, 'string');
      }
    });

    it('streamed tool-call deltas reassemble into a complete call', async () => {
      const stream = await client.chat.completions.create({
        model,
        messages: ASK,
        tools: [WEATHER],
        tool_choice: 'required',
        max_tokens: 96,
        temperature: 0,
        stream: true,
      });
      const calls = [];
      let finish = null;
      let pieces = 0;
      for await (const chunk of stream) {
        const c = chunk.choices[0];
        if (!c) continue;
        for (const d of c.delta.tool_calls || []) {
          pieces++;
          if (calls[d.index]) assert.equal(d.id, undefined, 'only the first piece has the id');
          if (!calls[d.index]) calls[d.index] = { id: d.id, type: d.type, function: { name: '', arguments: '' } };
          if (d.function.name) calls[d.index].function.name += d.function.name;
          calls[d.index].function.arguments += d.function.arguments || '';
        }
        if (c.finish_reason) finish = c.finish_reason;
      }
      assert.equal(finish, 'tool_calls');
      assert.equal(calls.length, 1);
      assert.ok(pieces >= 3, `the arguments were streamed as they arrived (${pieces} pieces)`);
      assertWeatherCall(calls[0]);
    });

    it('tool_choice auto lets the model answer or call, and either parses', async () => {
      const r = await client.chat.completions.create({
        model,
        messages: ASK,
        tools: [WEATHER],
        n: 4,
        max_tokens: 96,
        temperature: 0.8,
        seed: 3,
      });
      for (const c of r.choices) {
        if (c.finish_reason === 'tool_calls') assertWeatherCall(c.message.tool_calls[0]);
        else assert.equal(typeof c.message.content, 'string');
      }
    });

    it('bad tools, choices and histories get a 400 naming the problem, and the server keeps serving', async () => {
      const cases = [
        [{ tools: [WEATHER], tool_choice: { type: 'function', function: { name: 'nope' } } }, /nope/],
        [{ tools: [{ type: 'retrieval' }] }, /function/],
        [{ tools: [{ type: 'function', function: { name: 'f', parameters: { type: 'array' } } }] }, /object/],
        [
          {
            tools: [
              {
                type: 'function',
                function: { name: 'f', parameters: { type: 'object', properties: { a: { type: 'bogus' } } } },
              },
            ],
            tool_choice: 'required',
          },
          /./,
        ],
        [{ tools: [WEATHER], tool_choice: 'sometimes' }, /toolChoice/],
        [{ messages: [...ASK, { role: 'tool', tool_call_id: 'call_x', content: '1' }] }, /answers no tool call/],
        [
          {
            messages: [
              ...ASK,
              {
                role: 'assistant',
                tool_calls: [{ id: 'c', type: 'function', function: { name: 'f', arguments: '{' } }],
              },
            ],
          },
          /arguments must be JSON/,
        ],
      ];
      for (const [fields, message] of cases) {
        const res = await post('/v1/chat/completions', { model, messages: ASK, max_tokens: 4, ...fields });
        const body = await res.json();
        assert.equal(res.status, 400, `${JSON.stringify(fields)} → ${JSON.stringify(body)}`);
        assert.match(body.error.message, message);
      }
      const ok = await client.chat.completions.create({ model, messages: ASK, max_tokens: 2 });
      assert.equal(ok.choices.length, 1);
    });
  });

  describe('logprobs', () => {
    it('chat: one entry per token with top alternatives, streamed too', async () => {
      const r = await client.chat.completions.create({
        model,
        messages: ASK,
        max_tokens: 6,
        temperature: 0,
        logprobs: true,
        top_logprobs: 3,
      });
      const { content } = r.choices[0].logprobs;
      assert.equal(content.length, r.usage.completion_tokens);
      for (const e of content) {
        assert.equal(typeof e.token, 'string');
        assert.ok(e.logprob <= 0);
        assert.deepEqual(e.bytes, Array.from(Buffer.from(e.token, 'utf8')));
        assert.equal(e.top_logprobs.length, 3);
        assert.ok(e.top_logprobs[0].logprob >= e.top_logprobs[2].logprob);
        assert.ok(Math.abs(e.logprob - e.top_logprobs[0].logprob) < 1e-4, 'greedy picks the most likely token');
      }
      const stream = await client.chat.completions.create({
        model,
        messages: ASK,
        max_tokens: 4,
        temperature: 0,
        logprobs: true,
        top_logprobs: 2,
        stream: true,
      });
      let entries = 0;
      for await (const chunk of stream) {
        for (const e of (chunk.choices[0] && chunk.choices[0].logprobs && chunk.choices[0].logprobs.content) || []) {
          assert.equal(e.top_logprobs.length, 2);
          entries++;
        }
      }
      assert.equal(entries, 4);
    });

    it('completions: logprobs k gives tokens, token_logprobs, top_logprobs and text_offset', async () => {
      const r = await client.completions.create({
        model,
        prompt: 'One, two, three,',
        max_tokens: 5,
        logprobs: 2,
        temperature: 0,
      });
      const lp = r.choices[0].logprobs;
      assert.equal(lp.tokens.length, 5);
      assert.equal(lp.token_logprobs.length, 5);
      assert.equal(lp.top_logprobs.length, 5);
      assert.equal(lp.tokens.join(''), r.choices[0].text);
      assert.deepEqual(
        lp.text_offset,
        lp.tokens.map((_, i) => lp.tokens.slice(0, i).join('').length),
      );
      for (const top of lp.top_logprobs) assert.ok(Object.keys(top).length >= 1 && Object.keys(top).length <= 2);

      // Streamed: each chunk has its tokens' logprobs; together they are the whole completion's.
      const stream = await client.completions.create({
        model,
        prompt: 'One, two, three,',
        max_tokens: 5,
        logprobs: 2,
        temperature: 0,
        stream: true,
      });
      const tokens = [];
      let finish = null;
      for await (const chunk of stream) {
        for (const c of chunk.choices) {
          if (c.logprobs) tokens.push(...c.logprobs.tokens);
          finish = c.finish_reason || finish;
        }
      }
      assert.equal(tokens.length, 5);
      assert.equal(finish, 'length');
    });

    it('top_logprobs over 20 is a 400', async () => {
      const res = await post('/v1/chat/completions', { messages: ASK, logprobs: true, top_logprobs: 21 });
      assert.equal(res.status, 400);
    });
  });

  describe('embeddings', () => {
    it('shapes, base64, and a paraphrase closer than an unrelated sentence', async () => {
      const input = [
        'The cat sat on the mat.',
        'A cat was sitting on the mat.',
        'Quarterly revenue grew by eight percent.',
      ];
      const r = await client.embeddings.create({ model, input, encoding_format: 'float' });
      assert.equal(r.object, 'list');
      assert.equal(r.data.length, 3);
      const dim = r.data[0].embedding.length;
      assert.ok(dim > 0);
      for (const [i, d] of r.data.entries()) {
        assert.equal(d.index, i);
        assert.equal(d.embedding.length, dim);
      }
      assert.ok(r.usage.prompt_tokens > 0);
      const [a, para, other] = r.data.map((d) => d.embedding);
      assert.ok(cosine(a, para) > cosine(a, other), `paraphrase ${cosine(a, para)} vs unrelated ${cosine(a, other)}`);
      const b = await (await post('/v1/embeddings', { input: input[0], encoding_format: 'base64' })).json();
      const bytes = Buffer.from(b.data[0].embedding, 'base64');
      const decoded = Array.from({ length: bytes.length / 4 }, (_, i) => bytes.readFloatLE(i * 4));
      assert.equal(decoded.length, dim);
      assert.ok(cosine(decoded, a) > 0.9999, 'the same input embeds the same');
    });

    it('bad inputs get a 400', async () => {
      for (const input of ['', [], [''], [[-1]], null]) {
        const res = await post('/v1/embeddings', { input });
        assert.equal(res.status, 400, JSON.stringify(input));
      }
    });
  });

  describe('keys, metrics, CORS, limits, conformance', () => {
    it('no key or a wrong key is a 401 in OpenAI’s shape; either key works; /health is open', async () => {
      for (const headers of [{}, { authorization: 'Bearer wrong' }, { authorization: `Bearer ${KEYS[0]}x` }]) {
        const res = await fetch(url('/v1/models'), { headers });
        assert.equal(res.status, 401);
        const body = await res.json();
        assert.equal(body.error.code, 'invalid_api_key');
        assert.equal(res.headers.get('www-authenticate'), 'Bearer');
      }
      assert.equal((await fetch(url('/metrics'))).status, 401);
      for (const key of KEYS)
        assert.equal((await fetch(url('/v1/models'), { headers: { authorization: `Bearer ${key}` } })).status, 200);
      assert.equal((await fetch(url('/health'))).status, 200);
      const bad = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'nope', maxRetries: 0, fetch });
      await assert.rejects(bad.models.list(), (e) => e.status === 401);
    });

    it('/metrics counters move by what known requests did', async () => {
      const before = await metrics();
      const chat = '{endpoint="/v1/chat/completions",status="200"}';
      const r = await client.chat.completions.create({
        model,
        messages: [{ role: 'user', content: 'Count: one' }],
        max_tokens: 5,
      });
      const after = await metrics();
      const moved = (name) => (after.get(name) || 0) - (before.get(name) || 0);
      assert.equal(moved(`llamabranch_requests_total${chat}`), 1);
      assert.equal(moved('llamabranch_generated_tokens_total'), r.usage.completion_tokens);
      assert.equal(moved('llamabranch_prompt_tokens_total'), r.usage.prompt_tokens);
      assert.ok(moved('llamabranch_steps_total') >= r.usage.completion_tokens - 1);
      assert.equal(moved('llamabranch_step_seconds_count'), moved('llamabranch_steps_total'));
      assert.ok(after.get('llamabranch_kv_cells_total') > 0);
      assert.equal(
        after.get('llamabranch_step_seconds_bucket{le="+Inf"}'),
        after.get('llamabranch_step_seconds_count'),
      );
    });

    it('CORS: the preflight and responses carry the configured origin', async () => {
      const pre = await fetch(url('/v1/chat/completions'), {
        method: 'OPTIONS',
        headers: { origin: ORIGIN, 'access-control-request-method': 'POST' },
      });
      assert.equal(pre.status, 204);
      assert.equal(pre.headers.get('access-control-allow-origin'), ORIGIN);
      assert.match(pre.headers.get('access-control-allow-headers'), /authorization/);
      const res = await fetch(url('/v1/models'), { headers: { ...auth, origin: ORIGIN } });
      assert.equal(res.headers.get('access-control-allow-origin'), ORIGIN);
      const denied = await fetch(url('/v1/models'), { headers: { origin: ORIGIN } });
      assert.equal(denied.status, 401);
      assert.equal(denied.headers.get('access-control-allow-origin'), ORIGIN, 'errors are readable by the page too');
    });

    it('limits: max_tokens and n caps are 400s naming the field', async () => {
      let res = await post('/v1/completions', { prompt: 'x', max_tokens: 5000 });
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.param, 'max_tokens');
      res = await post('/v1/chat/completions', { messages: ASK, n: 17 });
      assert.equal(res.status, 400);
      assert.equal((await res.json()).error.param, 'n');
    });

    it('a 405 names the allowed methods; prompt null is the BOS alone', async () => {
      const res = await fetch(url('/v1/chat/completions'), { headers: auth });
      assert.equal(res.status, 405);
      assert.equal(res.headers.get('allow'), 'POST');
      const r = await (await post('/v1/completions', { prompt: null, max_tokens: 3 })).json();
      assert.equal(r.choices.length, 1);
      assert.equal(r.usage.prompt_tokens, 1);
    });
  });

  describe('other clients', () => {
    it('Vercel AI SDK: generateText runs a tool and returns text; streamText streams', async () => {
      const { generateText, streamText, tool, jsonSchema, stepCountIs } = require('ai');
      const { createOpenAICompatible } = require('@ai-sdk/openai-compatible');
      const provider = createOpenAICompatible({
        name: 'llama-branch',
        baseURL: `${server.url}/v1`,
        apiKey: KEYS[1],
        fetch,
      });
      const executed = [];
      const result = await generateText({
        model: provider.chatModel(model),
        prompt: 'What is the weather in Paris?',
        maxOutputTokens: 96,
        temperature: 0,
        tools: {
          get_weather: tool({
            description: WEATHER.function.description,
            inputSchema: jsonSchema(WEATHER.function.parameters),
            execute: async (args) => {
              executed.push(args);
              return { temperature: 21 };
            },
          }),
        },
        stopWhen: stepCountIs(2),
        prepareStep: ({ stepNumber }) => ({ toolChoice: stepNumber === 0 ? 'required' : 'none' }),
      });
      assert.equal(executed.length, 1, 'the tool ran once');
      assert.equal(typeof executed[0].city, 'string');
      assert.equal(result.steps.length, 2);
      assert.equal(result.steps[0].toolCalls[0].toolName, 'get_weather');
      assert.equal(typeof result.text, 'string');
      assert.ok(result.text.length > 0, 'a final text after the tool result');

      const streamed = streamText({ model: provider.chatModel(model), prompt: 'Once upon a time', maxOutputTokens: 8 });
      let parts = 0;
      let text = '';
      for await (const delta of streamed.textStream) {
        parts++;
        text += delta;
      }
      assert.ok(parts >= 2, `streamed in pieces (${parts})`);
      assert.equal(text, await streamed.text);
    });

    it('LangChain: ChatOpenAI.bindTools(...).invoke returns tool_calls', async () => {
      const { ChatOpenAI } = require('@langchain/openai');
      const chat = new ChatOpenAI({
        model,
        apiKey: KEYS[0],
        configuration: { baseURL: `${server.url}/v1`, fetch },
        temperature: 0,
        maxTokens: 96,
        maxRetries: 0,
      });
      const message = await chat.bindTools([WEATHER], { tool_choice: 'required' }).invoke('Weather in Paris?');
      assert.equal(message.tool_calls.length, 1);
      assert.equal(message.tool_calls[0].name, 'get_weather');
      assert.equal(typeof message.tool_calls[0].args.city, 'string');
      assert.match(message.tool_calls[0].id, /^call_/);
    });
  });

  describe('conformance', () => {
    it('every response above validated against OpenAI’s published schemas', async () => {
      await conformance.assertConforms();
      // Each test's responses were checked after it; this says the check saw them all: JSON
      // bodies, every streamed chunk and the 4xx errors of the tests above.
      assert.deepEqual(Object.keys(conformance.state.bySchema).sort(), [
        'CreateChatCompletionResponse',
        'CreateChatCompletionStreamResponse',
        'CreateCompletionResponse',
        'CreateCompletionStreamChunk',
        'CreateEmbeddingResponse',
        'ErrorResponse',
        'ListModelsResponse',
      ]);
    });
  });
});

describe('a server with a thinking chat template (--chat-template-file)', function () {
  this.timeout(240000);
  // The default model's template has no thinking section. This ChatML template opens one in
  // the generation prompt, as reasoning models' templates do: everything the model writes until
  // `</think>` is reasoning, so even a base model's reply is (a short one, all of it).
  const TEMPLATE = [
    "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '\\n' }}",
    "{%- if m.role == 'assistant' and m.reasoning_content -%}{{ '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif -%}",
    "{{ m.content + '<|im_end|>\\n' }}{%- endfor -%}",
    "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}",
    "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}",
    "{%- else -%}{{ '<think>\\n' }}{%- endif -%}{%- endif -%}",
  ].join('');
  let server;
  let client;
  let dir;
  const ask = {
    model: path.basename(MODEL).replace(/\.gguf$/, ''),
    messages: [{ role: 'user', content: 'Is 17 a prime number?' }],
    max_tokens: 12,
  };

  before(async () => {
    dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-template-'));
    const file = path.join(dir, 'thinking.jinja');
    fs.writeFileSync(file, TEMPLATE);
    server = await startServer(['--ctx-size', '2048', '--threads', '2', '--chat-template-file', file]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'unused', maxRetries: 0, fetch });
  });
  afterEach(() => conformance.assertConforms());
  after(async () => {
    if (server) assert.equal(await stopServer(server.child), 0, `clean exit; stderr: ${server.stderr()}`);
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('the reply is split into reasoning_content and content, streamed too', async () => {
    const reply = await client.chat.completions.create({ ...ask, temperature: 0 });
    const message = /** @type {any} */ (reply.choices[0].message);
    assert.equal(reply.choices[0].finish_reason, 'length');
    assert.equal(typeof message.reasoning_content, 'string');
    assert.ok(message.reasoning_content.trim().length > 0, 'the reply, still thinking, is reasoning');
    assert.ok(!message.content, `no content before </think>: ${JSON.stringify(message.content)}`);

    const stream = await client.chat.completions.create({ ...ask, temperature: 0, stream: true });
    const pieces = { reasoning: [], content: [] };
    for await (const chunk of stream) {
      const delta = /** @type {any} */ (chunk.choices[0] && chunk.choices[0].delta);
      if (delta && delta.reasoning_content) pieces.reasoning.push(delta.reasoning_content);
      if (delta && delta.content) pieces.content.push(delta.content);
    }
    assert.ok(pieces.reasoning.length >= 2, `reasoning arrives in pieces: ${pieces.reasoning.length}`);
    assert.deepEqual(pieces.content, []);
  });

  it('chat_template_kwargs.enable_thinking false closes the thinking section: no reasoning', async () => {
    const reply = await client.chat.completions.create(
      /** @type {any} */ ({ ...ask, temperature: 0, chat_template_kwargs: { enable_thinking: false } }),
    );
    const message = /** @type {any} */ (reply.choices[0].message);
    assert.ok(!message.reasoning_content, `no reasoning: ${JSON.stringify(message.reasoning_content)}`);
    assert.equal(typeof message.content, 'string');
  });
});
