'use strict';

// lib/scheduler/tool-calls.js without a model: replies as instruct models write them (the
// fenced block below is Qwen2.5-Coder-1.5B's greedy answer to the weather question, byte for
// byte), read for calls finished and token by token.

const assert = require('node:assert/strict');
const { readToolCalls, readForcedCalls, forcedCallSchema, fitsSchema } = require('../../lib/scheduler/tool-calls');

const WEATHER = {
  type: 'function',
  function: {
    name: 'get_weather',
    parameters: {
      type: 'object',
      properties: { city: { type: 'string' }, unit: { type: 'string', enum: ['celsius', 'fahrenheit'] } },
      required: ['city'],
      additionalProperties: false,
    },
  },
};
const TIME = { type: 'function', function: { name: 'get_time', parameters: { type: 'object', properties: {} } } };
const TOOLS = [WEATHER, TIME];
const ARGS = '{"city":"Paris","unit":"celsius"}';
const QWEN_FENCED =
  '```json\n{\n  "name": "get_weather",\n  "arguments": {\n    "city": "Paris",\n    "unit": "celsius"\n  }\n}\n```';

const read = (text) => readToolCalls(text, TOOLS, false);
const names = (r) => r.calls.map((c) => c.name);

describe('tool calls as models write them (lib/scheduler/tool-calls.js)', () => {
  it('a fenced JSON call, bare or after prose, is a call; the prose before it stays content', () => {
    assert.deepEqual(read(QWEN_FENCED), { content: '', calls: [{ name: 'get_weather', arguments: ARGS }] });
    const r = read(`I will look it up.\n\n${QWEN_FENCED}\n`);
    assert.equal(r.content, 'I will look it up.');
    assert.deepEqual(names(r), ['get_weather']);
    assert.deepEqual(names(read('```\n{"name": "get_time", "arguments": {}}\n```')), ['get_time']);
  });

  it('tags, bare objects, arrays, several blocks, OpenAI-shaped and string arguments', () => {
    assert.deepEqual(names(read('<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')), ['get_time']);
    assert.deepEqual(names(read('{"name": "get_weather", "arguments": {"city": "Rome"}}')), ['get_weather']);
    assert.deepEqual(
      names(read('[{"name": "get_weather", "arguments": {"city": "Rome"}}, {"name": "get_time", "parameters": {}}]')),
      ['get_weather', 'get_time'],
    );
    const two = read(`${QWEN_FENCED}\n\n<tool_call>{"name": "get_time"}</tool_call>`);
    assert.deepEqual(names(two), ['get_weather', 'get_time']);
    const openai = read(
      '{"type": "function", "function": {"name": "get_weather", "arguments": "{\\"city\\": \\"Oslo\\"}"}}',
    );
    assert.deepEqual(openai.calls, [{ name: 'get_weather', arguments: '{"city":"Oslo"}' }]);
  });

  it('text that only talks about JSON stays text', () => {
    const cases = [
      'Here is a person:\n```json\n{"name": "Alice", "age": 30}\n```', // no declared tool
      '{"name": "get_weather", "arguments": {"town": "Paris"}}', // arguments outside the schema
      '{"name": "get_weather", "arguments": {"city": "Paris", "unit": "kelvin"}}', // not in the enum
      '{"name": "get_weather", "arguments": {}}', // a required argument missing
      `You could call it like this:\n${QWEN_FENCED}\nand it answers with the temperature.`, // prose after
      'Use `{"name": "get_weather", "arguments": {"city": "Paris"}}` inline.', // not at a line start
      '```json\n{"name": "get_weather", "arguments": {"city": "Paris"}', // cut off: no closing fence
      '{"name": "get_weather", "arguments": {"city": "Paris"}, "extra": 1}',
    ];
    for (const text of cases) assert.deepEqual(read(text), { content: text, calls: [] }, text);
  });

  it('streaming: what is shown of a growing reply is always a prefix of the finished content', () => {
    const replies = [
      QWEN_FENCED,
      `Let me check.\n${QWEN_FENCED}`,
      `You could call it like this:\n${QWEN_FENCED}\nand it answers.`,
      'Here is a person:\n```json\n{"name": "Alice"}\n```\nDone.',
      '[1] a footnote\n{"name": "get_time", "arguments": {}}',
    ];
    for (const text of replies) {
      const final = read(text).content;
      let shown = '';
      for (let n = 1; n <= text.length; n++) {
        const partial = readToolCalls(text.slice(0, n), TOOLS, true);
        assert.deepEqual(partial.calls, [], 'calls are given whole, once the reply is finished');
        assert.ok(
          final.startsWith(partial.content),
          `${JSON.stringify(partial.content)} is a prefix of ${JSON.stringify(final)}`,
        );
        assert.ok(partial.content.length >= shown.length, 'what is shown only grows');
        shown = partial.content;
        if (read(text).calls.length > 0) assert.ok(!partial.content.includes('```'), 'a call is never shown as text');
      }
    }
  });

  it('forced replies: the schema is one call of a declared tool (an array with parallel calls)', () => {
    const one = forcedCallSchema(TOOLS, false);
    assert.equal(one.anyOf.length, 2);
    assert.deepEqual(one.anyOf[0].properties.name, { const: 'get_weather' });
    assert.ok(fitsSchema({ name: 'get_time', arguments: {} }, one));
    assert.ok(!fitsSchema({ name: 'get_time', arguments: {}, extra: 1 }, one));
    assert.equal(forcedCallSchema([WEATHER], true).type, 'array');
    assert.deepEqual(readForcedCalls(' {"name": "get_weather", "arguments": {"city": "Paris"}} ', TOOLS), [
      { name: 'get_weather', arguments: '{"city":"Paris"}' },
    ]);
    assert.equal(readForcedCalls('{"name": "get_weather", "argu', TOOLS), null);
  });
});
