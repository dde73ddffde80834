'use strict';

// Tool calls with a real tool-calling model (issue 60): Qwen2.5-Coder-1.5B-Instruct behind
// `llama-branch serve`, driven by the official `openai` npm client, greedy. This model answers a
// tool-shaped question with a fenced ```json call, not the `<tool_call>` tags its template asks
// for; llama.cpp's parser (and llama.cpp's own server) leave that as text. Every response is
// checked against OpenAI's published schemas (test/openapi).

const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { ensureModel } = require('../../scripts/fetch-model');
const { startServer, stopServer } = require('../serve-helpers');
const { conformanceChecker } = require('../openapi/conformance');

const MODEL = ensureModel('qwen2.5-coder-1.5b');
/** The server names its model after the file. */
const MODEL_ID = require('node:path').basename(MODEL, '.gguf');
const conformance = conformanceChecker();

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Get the current weather in a city',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city'],
    },
  },
};
const TIME = {
  type: 'function',
  function: {
    name: 'get_time',
    description: 'Get the local time in an IANA time zone',
    parameters: { type: 'object', properties: { zone: { type: 'string' } }, required: ['zone'] },
  },
};
const WEATHER_ASK = [{ role: 'user', content: "What's the weather like in Paris right now, in celsius?" }];
const GREEDY = { temperature: 0, seed: 1 };

/** A chat completion streamed with the client, reassembled: content, calls, finish reason. */
async function streamed(client, body) {
  const stream = await client.chat.completions.create({ ...body, stream: true });
  const out = { content: '', calls: [], finish: null };
  for await (const chunk of stream) {
    const c = chunk.choices[0];
    if (!c) continue;
    if (c.delta.content) out.content += c.delta.content;
    for (const d of c.delta.tool_calls || []) {
      if (!out.calls[d.index]) out.calls[d.index] = { id: d.id, name: '', arguments: '' };
      if (d.function && d.function.name) out.calls[d.index].name += d.function.name;
      if (d.function && d.function.arguments) out.calls[d.index].arguments += d.function.arguments;
    }
    if (c.finish_reason) out.finish = c.finish_reason;
  }
  return out;
}

/** No control token of the ChatML template reaches text a client sees. */
function assertNoControlText(text) {
  if (text === null || text === undefined) return;
  assert.doesNotMatch(text, /<\|im_(start|end)\|>|<\|endoftext\|>/, `control tokens in ${JSON.stringify(text)}`);
}

describe('tool calls with Qwen2.5-Coder-1.5B-Instruct (openai client)', function () {
  this.timeout(600000);
  let server;
  let client;
  const chat = (body) => client.chat.completions.create({ model: MODEL_ID, max_tokens: 96, ...GREEDY, ...body });

  before(async () => {
    server = await startServer(['--parallel', '2', '--ctx-size', '4096', '--threads', '2'], process.env, MODEL);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'none', maxRetries: 0, fetch: conformance.fetch });
  });
  afterEach(() => conformance.assertConforms());
  after(async () => {
    if (server) assert.equal(await stopServer(server.child), 0, `clean exit; stderr: ${server.stderr()}`);
  });

  it('a tool-shaped question (auto) is a call, streamed or not, though the model fences it', async () => {
    const r = await chat({ messages: WEATHER_ASK, tools: [WEATHER, TIME] });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls.length, 1);
    const call = c.message.tool_calls[0];
    assert.equal(call.function.name, 'get_weather');
    assert.deepEqual(JSON.parse(call.function.arguments), { city: 'Paris', unit: 'celsius' });

    const s = await streamed(client, { model: MODEL_ID, max_tokens: 96, ...GREEDY, messages: WEATHER_ASK, tools: [WEATHER, TIME] });
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.content, '', 'no piece of the fenced call was streamed as content');
    assert.deepEqual(
      s.calls.map((x) => [x.name, x.arguments]),
      [[call.function.name, call.function.arguments]],
      'streaming gives the non-streaming result',
    );
  });

  it('text that only talks about JSON stays text', async () => {
    const r = await chat({
      messages: [
        { role: 'user', content: 'Write a JSON object describing a person named Alice who is 30 years old. Reply with the JSON only.' },
      ],
      tools: [WEATHER],
      max_tokens: 64,
    });
    const c = r.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls, undefined);
    assert.match(c.message.content, /Alice/);
    assert.match(c.message.content, /30/);
  });

  it("forced choices ('required', a named function) are a valid call that ends the turn", async () => {
    const required = await chat({ messages: WEATHER_ASK, tools: [WEATHER, TIME], tool_choice: 'required' });
    const c = required.choices[0];
    assert.equal(c.finish_reason, 'tool_calls', JSON.stringify(c.message));
    assert.equal(c.message.content, null);
    assert.equal(c.message.tool_calls[0].function.name, 'get_weather');
    assert.equal(JSON.parse(c.message.tool_calls[0].function.arguments).city, 'Paris');
    assert.ok(required.usage.completion_tokens < 96, 'it stopped at the end of the call, not at max_tokens');

    const named = await chat({
      messages: [{ role: 'user', content: 'What time is it in Tokyo?' }],
      tools: [WEATHER, TIME],
      tool_choice: { type: 'function', function: { name: 'get_time' } },
    });
    const n = named.choices[0];
    assert.equal(n.finish_reason, 'tool_calls', JSON.stringify(n.message));
    assert.equal(n.message.tool_calls.length, 1);
    assert.equal(n.message.tool_calls[0].function.name, 'get_time');
    assert.match(JSON.parse(n.message.tool_calls[0].function.arguments).zone, /Tokyo/);

    const s = await streamed(client, {
      model: MODEL_ID,
      max_tokens: 96,
      ...GREEDY,
      messages: WEATHER_ASK,
      tools: [WEATHER, TIME],
      tool_choice: 'required',
    });
    assert.equal(s.finish, 'tool_calls');
    assert.equal(s.content, '');
    assert.deepEqual(
      s.calls.map((x) => [x.name, x.arguments]),
      c.message.tool_calls.map((x) => [x.function.name, x.function.arguments]),
    );
  });

  it("tool_choice 'none' gives text, and no mode lets a control token into content", async () => {
    const r = await chat({ messages: WEATHER_ASK, tools: [WEATHER], tool_choice: 'none', max_tokens: 64 });
    const c = r.choices[0];
    assert.equal(c.message.tool_calls, undefined);
    assert.equal(typeof c.message.content, 'string');
    assert.ok(c.message.content.length > 0);
    for (const choice of ['none', 'auto', 'required']) {
      const s = await streamed(client, { model: MODEL_ID, max_tokens: 64, ...GREEDY, messages: WEATHER_ASK, tools: [WEATHER], tool_choice: choice });
      assertNoControlText(s.content);
      for (const call of s.calls) assertNoControlText(call.arguments);
    }
    assertNoControlText(c.message.content);
  });

  // The follow-up leaves `tools` out: given them again, this 1.5B model calls the tool again
  // (greedy, with the result in the prompt); without them it answers from the result.
  it('a tool result turn round-trips: the model answers from it', async () => {
    const first = await chat({ messages: WEATHER_ASK, tools: [WEATHER] });
    const message = first.choices[0].message;
    assert.equal(message.tool_calls.length, 1);
    const answer = await chat({
      messages: [
        ...WEATHER_ASK,
        message,
        {
          role: 'tool',
          tool_call_id: message.tool_calls[0].id,
          content: JSON.stringify({ city: 'Paris', temperature: 17, unit: 'celsius', sky: 'light rain' }),
        },
      ],
      max_tokens: 80,
    });
    const c = answer.choices[0];
    assert.equal(c.finish_reason, 'stop', JSON.stringify(c.message));
    assert.equal(c.message.tool_calls, undefined, 'the answer is text, not another call');
    assert.match(c.message.content, /17/);
    assertNoControlText(c.message.content);
  });
});
