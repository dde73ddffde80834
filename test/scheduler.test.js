'use strict';

// Scheduler: continuous batching of independent requests over one context, prefix cache,
// n > 1, back-pressure, abort. Greedy outputs are never compared across batch shapes (llama.cpp
// on CPU is not batch-invariant); tests check what the scheduler promises instead: which
// decodes were shared, what was prefilled, what was cached and what each request got back.

const assert = require('node:assert/strict');
const { Scheduler } = require('..');
const { open, rejects } = require('./helpers');

const GREEDY = { temperature: 0 };
const SYSTEM =
  'You are a patient teacher. Answer every question in one short sentence, with simple words, and never use lists.';

/** Resolves once `gen` has emitted `count` token events. */
async function tokensSeen(gen, count) {
  let seen = 0;
  for await (const e of gen) {
    if (e.token !== null && ++seen >= count) return;
  }
  throw new Error(`the generation ended after ${seen} tokens, before ${count}`);
}

function chat(question) {
  return [
    { role: 'system', content: SYSTEM },
    { role: 'user', content: question },
  ];
}

describe('Scheduler', function () {
  this.timeout(240000);
  let ctx;
  before(async () => {
    ctx = await open({ nCtx: 2048, nSeqMax: 24 });
  });
  after(() => ctx && ctx.dispose());

  /** A scheduler recording every step; closed (cache freed) by the test's end. */
  let scheduler;
  let steps;
  function start(options = {}) {
    steps = [];
    scheduler = new Scheduler(ctx, { onStep: (s) => steps.push(s), ...options });
    return scheduler;
  }
  afterEach(async () => {
    if (scheduler) await scheduler.close();
    scheduler = null;
  });

  it('returns {choices, usage} and streams events whose text adds up to it', async () => {
    const s = start();
    const gen = s.generate({ prompt: 'The three primary colors are', maxTokens: 8, params: GREEDY });
    const texts = [];
    let finish;
    for await (const e of gen) {
      assert.equal(e.choice, 0);
      texts.push(e.text);
      if (e.token === null) finish = e.finishReason;
    }
    const result = await gen;
    assert.equal(result.choices.length, 1);
    const [c] = result.choices;
    assert.equal(c.finishReason, 'length');
    assert.equal(finish, 'length');
    assert.equal(c.tokens.length, 8);
    assert.equal(texts.join(''), c.text);
    assert.ok(c.text.trim().length > 0);
    assert.ok(Number.isFinite(c.perplexity) && c.perplexity >= 1, `perplexity ${c.perplexity}`);
    assert.equal(result.usage.completionTokens, 8);
    assert.equal(result.usage.promptTokens, ctx.tokenizeSync('The three primary colors are').length);
    assert.equal(result.usage.cachedPromptTokens, 0);
  });

  it('requests join and leave mid-generation, every running one in the same decode', async () => {
    const s = start();
    const long = s.generate({ prompt: 'Once upon a time, in a small village,', maxTokens: 24, params: GREEDY });
    await tokensSeen(long, 4);
    const joinedAt = steps.length;
    const short = s.generate({ prompt: 'The best way to learn to cook is', maxTokens: 5, params: GREEDY });
    const shortResult = await short;
    const shortEnded = steps.length;
    const longResult = await long;
    assert.equal(shortResult.choices[0].tokens.length, 5);
    assert.equal(longResult.choices[0].tokens.length, 24);
    assert.equal(longResult.choices[0].finishReason, 'length');
    // while both ran, each step decoded both in one commit; after the short one left, one row
    const shared = steps.slice(joinedAt, shortEnded).filter((st) => st.rows === 2);
    assert.ok(shared.length >= 4, `steps with both requests in one decode: ${shared.length}`);
    assert.ok(steps.slice(shortEnded).every((st) => st.rows <= 1));
    assert.ok(
      steps.slice(shortEnded).some((st) => st.rows === 1),
      'the long request went on alone',
    );
    assert.equal(s.stats().running, 0);
  });

  it('reuses a cached system prompt: the second request prefills only its own suffix', async () => {
    const s = start();
    const first = await s.generate({ messages: chat('What is rain?'), maxTokens: 4, params: GREEDY });
    assert.equal(first.usage.cachedPromptTokens, 0);
    const before = s.stats().prefilledTokens;
    const second = await s.generate({ messages: chat('Why is the sky blue?'), maxTokens: 4, params: GREEDY });
    const systemTokens = second.usage.cachedPromptTokens;
    // the cached prefix is the system prompt, at the boundary the chat template renders it
    assert.ok(systemTokens >= ctx.tokenizeSync(SYSTEM, false).length, `cached ${systemTokens} tokens`);
    assert.ok(systemTokens < second.usage.promptTokens);
    assert.equal(s.stats().prefilledTokens - before, second.usage.promptTokens - systemTokens);
    // the same prompt again: everything cached, nothing prefilled, logits from the cache
    const again = await s.generate({ messages: chat('Why is the sky blue?'), maxTokens: 4, params: GREEDY });
    assert.equal(again.usage.cachedPromptTokens, again.usage.promptTokens);
    assert.equal(s.stats().prefilledTokens - before, second.usage.promptTokens - systemTokens);
    assert.ok(again.choices[0].text.length > 0);
    const stats = s.stats();
    assert.ok(stats.cachedPrefixes >= 3, `cached prefixes ${stats.cachedPrefixes}`); // system, 2 full prompts
    assert.ok(stats.hitRate > 0.5 && stats.hitRate < 1, `hit rate ${stats.hitRate}`);
  });

  it('partial reuse: a prompt that shares only the start of a cached one forks it there', async () => {
    const s = start();
    // longer than the scheduler's minimum partial reuse (16 tokens)
    const head = 'Here is a long and detailed description, written for curious students who want to learn, of ';
    const tail = '. Describe it in one sentence.';
    const first = await s.generate({ prompt: `${head}volcanoes${tail}`, maxTokens: 2, params: GREEDY });
    assert.equal(first.usage.cachedPromptTokens, 0);
    const before = s.stats().prefilledTokens;
    const second = await s.generate({ prompt: `${head}glaciers${tail}`, maxTokens: 6, params: GREEDY });
    // exactly the tokens the two prompts have in common, counted on the tokenizer's output
    const a = ctx.tokenizeSync(`${head}volcanoes${tail}`);
    const b = ctx.tokenizeSync(`${head}glaciers${tail}`);
    let common = 0;
    while (common < a.length && a[common] === b[common]) common++;
    assert.ok(common >= 16 && common < b.length, `common prefix ${common} of ${b.length}`);
    assert.equal(second.usage.cachedPromptTokens, common);
    assert.equal(s.stats().prefilledTokens - before, b.length - common);
    assert.ok(
      second.choices[0].perplexity < 50,
      `coherent after the fork (perplexity ${second.choices[0].perplexity})`,
    );
  });

  describe("token prompts sharing a prefix no cache point names (a router's, a completion's)", () => {
    // Past Gemma 3's 512-token sliding window, where an entry is never forked part-way.
    const text = 'Rivers carry water from the hills down to the sea, and towns grow along their banks. ';
    const common = (a, b) => {
      let i = 0;
      while (i < a.length && a[i] === b[i]) i++;
      return i;
    };
    let shared;
    const promptOf = (i) => [...shared, ...ctx.tokenizeSync(` Question ${i}: name a river of country ${i}.`, false)];
    before(() => {
      shared = ctx.tokenizeSync(text.repeat(60)).slice(0, 700);
    });
    const prefilledBy = async (s, work) => {
      const before = s.stats().prefilledTokens;
      await work();
      return s.stats().prefilledTokens - before;
    };
    const generate = (s, tokens) => s.generate({ tokens, maxTokens: 2, params: GREEDY });

    it('one after another: the second is cut where it parts from the first, the third forks that cut', async () => {
      const s = start();
      const [a, b, c] = [1, 2, 3].map(promptOf);
      const run = common(a, b);
      assert.ok(run >= shared.length && run === common(b, c), `${run} tokens shared`);
      assert.equal(await prefilledBy(s, () => generate(s, a)), a.length);
      const second = await prefilledBy(s, () => generate(s, b));
      // Whole with a sliding window (no part-way fork past it), its own tail without one.
      assert.ok(second === b.length || second === b.length - run, `the second prefilled ${second}`);
      assert.equal(await prefilledBy(s, () => generate(s, c)), c.length - run, 'the third forks the cut');
    });

    it('a burst: the first prompt line, not begun or still filling, is cut where the next one parts', async () => {
      const [a, b, c] = [4, 5, 6].map(promptOf);
      const run = common(a, b);
      let s = start();
      const together = await prefilledBy(s, () => Promise.all([a, b, c].map((p) => generate(s, p))));
      assert.equal(together, a.length + b.length + c.length - 2 * run, 'admitted in one step: the run once');
      await s.close();
      // The second arrives once the first has prefilled a chunk of its prompt (of 128 tokens).
      let firstStep;
      const stepped = new Promise((resolve) => (firstStep = resolve));
      s = start({ prefillChunk: 128, onStep: () => firstStep() });
      const filling = await prefilledBy(s, async () => {
        const first = generate(s, a);
        await stepped;
        assert.ok(s.stats().prefilledTokens < run, 'the first is still filling the shared run');
        await Promise.all([first, generate(s, b)]);
      });
      assert.equal(filling, a.length + b.length - run, 'admitted while the first fills: the run once');
    });
  });

  it('concurrent requests sharing a new system prompt prefill it once', async () => {
    const s = start();
    const questions = ['What is snow?', 'What is a river?', 'What is wind?'];
    const results = await Promise.all(
      questions.map((q) => s.generate({ messages: chat(q), maxTokens: 3, params: GREEDY })),
    );
    const cached = results.map((r) => r.usage.cachedPromptTokens);
    assert.equal(cached[0], 0);
    assert.ok(cached[1] > 0 && cached[1] === cached[2], `cached ${cached}`);
    const prompt = results.reduce((sum, r) => sum + r.usage.promptTokens, 0);
    assert.equal(s.stats().prefilledTokens, prompt - cached[1] - cached[2]);
  });

  it('n = 4: one prompt prefill, four forks decoded together, reproducible with a seed', async () => {
    const s = start();
    const request = {
      prompt: 'My favourite animal is the',
      n: 4,
      maxTokens: 6,
      seed: 1234,
      params: { temperature: 1.2, topK: 100, topP: 1, minP: 0 },
    };
    const first = await s.generate(request);
    const promptTokens = first.usage.promptTokens;
    assert.equal(s.stats().prefilledTokens, promptTokens, 'the prompt was decoded once, not once per choice');
    assert.equal(first.choices.length, 4);
    assert.equal(first.usage.completionTokens, 24);
    assert.ok(
      steps.some((st) => st.rows === 4),
      'the four choices advanced in one decode',
    );
    const texts = first.choices.map((c) => c.text);
    assert.ok(new Set(texts).size >= 2, `differently seeded choices should differ: ${JSON.stringify(texts)}`);
    // run alone again: the whole prompt now comes from the cache; seeds make it the same
    const second = await s.generate(request);
    assert.equal(second.usage.cachedPromptTokens, promptTokens);
    assert.deepEqual(
      second.choices.map((c) => c.tokens),
      first.choices.map((c) => c.tokens),
    );
  });

  it('stop strings end a choice across token boundaries; text is cut before them', async () => {
    const s = start();
    const free = await s.generate({ prompt: '1, 2, 3, 4, 5,', maxTokens: 10, params: GREEDY });
    assert.match(free.choices[0].text, /^ 6, 7, 8/);
    const gen = s.generate({ prompt: '1, 2, 3, 4, 5,', maxTokens: 10, stop: [', 8', 'never'], params: GREEDY });
    let streamed = '';
    for await (const e of gen) streamed += e.text;
    const { choices } = await gen;
    assert.equal(choices[0].finishReason, 'stop');
    assert.equal(choices[0].text, ' 6, 7');
    assert.equal(streamed, ' 6, 7', 'the start of the stop string was held back, never streamed');
  });

  it('jsonSchema: the output is JSON of that shape', async () => {
    const s = start();
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 8 }, age: { type: 'integer', maximum: 200 } },
      required: ['name', 'age'],
      additionalProperties: false,
    };
    const { choices } = await s.generate({
      messages: [{ role: 'user', content: 'Invent a person. Reply in JSON.' }],
      jsonSchema: schema,
      maxTokens: 40,
      params: GREEDY,
    });
    assert.equal(choices[0].finishReason, 'stop', choices[0].text);
    const value = JSON.parse(choices[0].text);
    assert.equal(typeof value.name, 'string');
    assert.ok(Number.isInteger(value.age));
  });

  it('abort frees one request within a step; the others go on', async () => {
    const s = start();
    const controller = new AbortController();
    const a = s.generate({ prompt: 'The history of the river town', maxTokens: 12, params: GREEDY });
    const b = s.generate({ prompt: 'A recipe for bread:', maxTokens: 40, params: GREEDY, signal: controller.signal });
    const c = s.generate({ prompt: 'The rules of chess', maxTokens: 12, params: GREEDY });
    await tokensSeen(b, 3);
    const abortedAtStep = s.stats().steps;
    controller.abort();
    const bResult = await b;
    assert.ok(s.stats().steps - abortedAtStep <= 1, `settled ${s.stats().steps - abortedAtStep} steps after the abort`);
    assert.equal(bResult.choices[0].finishReason, 'abort');
    assert.ok(bResult.choices[0].tokens.length >= 3 && bResult.choices[0].tokens.length < 40);
    const [aResult, cResult] = await Promise.all([a, c]);
    for (const r of [aResult, cResult]) {
      assert.equal(r.choices[0].finishReason, 'length');
      assert.equal(r.choices[0].tokens.length, 12);
    }
    await new Promise((resolve) => setImmediate(resolve)); // the step that settled them has counted them
    assert.equal(s.stats().completed, 3, 'settled requests count, aborted or not');
    // a request aborted while queued never starts
    const queuedAbort = new AbortController();
    const blocker = start({ maxRunning: 1 }).generate({ prompt: 'Hello', maxTokens: 4, params: GREEDY });
    const waiting = scheduler.generate({ prompt: 'Hello there', maxTokens: 4, signal: queuedAbort.signal });
    queuedAbort.abort();
    const w = await waiting;
    assert.deepEqual(
      w.choices.map((x) => [x.finishReason, x.tokens.length]),
      [['abort', 0]],
    );
    assert.equal(scheduler.stats().completed, 1, 'the request that never started is completed');
    await blocker;
    await new Promise((resolve) => setImmediate(resolve));
    assert.equal(scheduler.stats().completed, 2);
  });

  it('a full queue rejects with ERR_QUEUE_FULL and never disturbs the running request', async () => {
    const s = start({ maxRunning: 1, maxQueue: 1 });
    const running = s.generate({ prompt: 'Rivers flow to the', maxTokens: 6, params: GREEDY });
    await tokensSeen(running, 1); // admitted (admission happens in the scheduler's next step)
    const queued = s.generate({ prompt: 'Mountains are', maxTokens: 3, params: GREEDY });
    const err = await rejects(() => s.generate({ prompt: 'Oceans are', maxTokens: 3 }), 'ERR_QUEUE_FULL', /maxQueue/);
    assert.equal(err.code, 'ERR_QUEUE_FULL');
    assert.equal(s.stats().queued, 1);
    const [r, q] = await Promise.all([running, queued]);
    assert.equal(r.choices[0].tokens.length, 6);
    assert.equal(q.choices[0].tokens.length, 3);
  });

  it('refuses bad requests with ERR_INVALID_ARG, and generate after close with ERR_SCHEDULER_CLOSED', async () => {
    const s = start();
    await rejects(() => s.generate({}), 'ERR_INVALID_ARG', /exactly one of/);
    await rejects(() => s.generate({ prompt: 'x', tokens: [1] }), 'ERR_INVALID_ARG');
    await rejects(() => s.generate({ prompt: 'x', n: 0 }), 'ERR_INVALID_ARG', /n/);
    await rejects(() => s.generate({ prompt: 'x', maxTokens: 1.5 }), 'ERR_INVALID_ARG', /maxTokens/);
    await rejects(() => s.generate({ tokens: [ctx.vocabSize] }), 'ERR_INVALID_ARG', /token ids/);
    await rejects(() => s.generate({ prompt: 'x', stop: [1] }), 'ERR_INVALID_ARG', /stop/);
    await rejects(() => s.generate({ prompt: 'x', seed: -5 }), 'ERR_INVALID_ARG', /seed/);
    await rejects(() => s.generate({ prompt: 'x', maxTokens: 5000 }), 'ERR_INVALID_ARG', /nCtx/);
    await rejects(() => s.generate({ prompt: 'x', jsonSchema: 'not json' }), 'ERR_GRAMMAR');
    await rejects(() => s.generate({ prompt: 'x', params: { temperature: 'hot' } }), 'ERR_INVALID_ARG');
    // the scheduler still serves
    const ok = await s.generate({ prompt: 'Still working:', maxTokens: 2, params: GREEDY });
    assert.equal(ok.choices[0].tokens.length, 2);
    await s.close();
    await rejects(() => s.generate({ prompt: 'x' }), 'ERR_SCHEDULER_CLOSED');
  });

  describe('tool calls (the chat layer)', () => {
    const WEATHER = {
      type: 'function',
      function: {
        name: 'get_weather',
        parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
      },
    };
    const TIME = {
      type: 'function',
      function: { name: 'get_time', parameters: { type: 'object', properties: { zone: { type: 'string' } } } },
    };
    const ask = [{ role: 'user', content: 'What is the weather in Rome?' }];

    it('required: every choice parses into a call, streamed deltas agree with the result', async () => {
      const s = start();
      const gen = s.generate({ messages: ask, tools: [WEATHER], toolChoice: 'required', n: 3, maxTokens: 64, seed: 5 });
      const streamed = [[], [], []];
      for await (const e of gen) {
        if (e.delta && e.delta.toolCalls) streamed[e.choice].push(...e.delta.toolCalls);
        if (e.finishReason) assert.equal(e.message.toolCalls.length, 1, 'the last event carries the reply');
      }
      const { choices } = await gen;
      for (const [i, c] of choices.entries()) {
        assert.equal(c.finishReason, 'tool_calls');
        assert.equal(c.content, '');
        assert.equal(c.toolCalls.length, 1);
        assert.equal(c.toolCalls[0].name, 'get_weather');
        assert.equal(typeof JSON.parse(c.toolCalls[0].arguments).city, 'string');
        assert.match(c.text, /^\s*\{/, 'the raw text is the generic JSON reply');
        // The first piece names the call (same id as the result); later pieces carry more of
        // its arguments, as they arrive, and concatenate to the result's.
        const [head, ...rest] = streamed[i];
        assert.deepEqual([head.index, head.id, head.name], [0, c.toolCalls[0].id, 'get_weather']);
        assert.ok(rest.length >= 2, `arguments arrive piece by piece: ${rest.length} pieces`);
        for (const piece of rest) assert.deepEqual(Object.keys(piece).sort(), ['arguments', 'index']);
        assert.equal(streamed[i].map((d) => d.arguments).join(''), c.toolCalls[0].arguments);
      }
    });

    it('a named function restricts the call to it; none leaves the reply unconstrained', async () => {
      const s = start();
      const named = await s.generate({
        messages: [{ role: 'user', content: 'What time is it?' }],
        tools: [TIME, WEATHER],
        toolChoice: { type: 'function', function: { name: 'get_weather' } },
        // The grammar allows pretty-printed JSON: a greedy call once took exactly 64 tokens
        // without its closing brace.
        maxTokens: 160,
        params: GREEDY,
      });
      assert.equal(named.choices[0].finishReason, 'tool_calls', named.choices[0].text);
      assert.equal(named.choices[0].toolCalls[0].name, 'get_weather');
      const none = await s.generate({
        messages: ask,
        tools: [WEATHER],
        toolChoice: 'none',
        maxTokens: 6,
        params: GREEDY,
      });
      assert.equal(none.choices[0].toolCalls, undefined, "toolChoice 'none' is not parsed for calls");
      assert.ok(['stop', 'length'].includes(none.choices[0].finishReason));
    });

    it('formatChat and parseChatOutput expose the generic format', async () => {
      const { ChatFormat } = require('..');
      const f = await ctx.formatChat(ask, { tools: [WEATHER], toolChoice: 'required' });
      assert.equal(f.format, ChatFormat.GENERIC);
      assert.match(f.prompt, /get_weather/);
      assert.match(f.grammar, /root ::=/);
      const parsed = ctx.parseChatOutput(
        '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Rome"}}]}',
        f.format,
        f,
      );
      assert.deepEqual(
        parsed.toolCalls.map((c) => [c.name, JSON.parse(c.arguments)]),
        [['get_weather', { city: 'Rome' }]],
      );
      assert.equal(ctx.parseChatOutput('{"response": "hello"}', f.format, f).content, 'hello');
    });

    it('reasoning: a thinking template splits and streams reasoning; enableThinking false closes it', async () => {
      const { ChatTurn, ChatStream } = require('../lib/scheduler/chat');
      // A ChatML template with a thinking section (the default model's has none).
      const template = [
        "{%- for m in messages -%}{{ '<|im_start|>' + m.role + '\\n' }}",
        "{%- if m.role == 'assistant' and m.reasoning_content -%}{{ '<think>\\n' + m.reasoning_content + '\\n</think>\\n\\n' }}{%- endif -%}",
        "{{ m.content + '<|im_end|>\\n' }}{%- endfor -%}",
        "{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}",
        "{%- if enable_thinking is defined and enable_thinking is false -%}{{ '<think>\\n\\n</think>\\n\\n' }}{%- endif -%}{%- endif -%}",
      ].join('');
      const reply = '<think>\nLet me think.\n</think>\n\nHello there.';
      const f = await ctx.formatChat(ask, { templateOverride: template, reasoningFormat: 'auto' });
      assert.equal(f.supportsThinking, true);
      assert.equal((await ctx.formatChat(ask)).supportsThinking, false, "Gemma's template has no thinking section");
      const stream = new ChatStream(new ChatTurn(ctx, f, true));
      const deltas = [];
      for (let i = 1; i < reply.length; i += 4) deltas.push(stream.update(reply.slice(0, i)));
      deltas.push(stream.finish(reply));
      const joined = (field) => deltas.map((d) => (d && d[field]) || '').join('');
      assert.equal(stream.message.reasoningContent.trim(), 'Let me think.');
      assert.equal(stream.message.content, 'Hello there.');
      assert.equal(joined('reasoningContent'), stream.message.reasoningContent, 'reasoning deltas add up');
      assert.equal(joined('content'), 'Hello there.', 'content deltas add up');
      const off = await ctx.formatChat(ask, {
        templateOverride: template,
        reasoningFormat: 'auto',
        enableThinking: false,
      });
      assert.match(off.prompt, /<think>\n\n<\/think>\n\n$/, 'thinking switched off: an empty, closed block');
    });

    it('bad chat fields reject with ERR_INVALID_ARG and change nothing', async () => {
      const s = start();
      await rejects(() => s.generate({ prompt: 'x', tools: [WEATHER] }), 'ERR_INVALID_ARG', /messages/);
      await rejects(() => s.generate({ messages: ask, tools: [{ type: 'code' }] }), 'ERR_INVALID_ARG', /function/);
      await rejects(
        () =>
          s.generate({ messages: ask, tools: [WEATHER], toolChoice: { type: 'function', function: { name: 'x' } } }),
        'ERR_INVALID_ARG',
        /not in request.tools/,
      );
      await rejects(() => s.generate({ messages: ask, toolChoice: 'required' }), 'ERR_INVALID_ARG', /needs tools/);
      await rejects(
        () => s.generate({ messages: ask, tools: [WEATHER], toolChoice: 'required', grammar: 'root ::= "a"' }),
        'ERR_INVALID_ARG',
        /not both/,
      );
      assert.equal(s.stats().running, 0);
      const ok = await s.generate({ messages: ask, maxTokens: 2, params: GREEDY });
      assert.equal(ok.choices[0].tokens.length, 2);
    });
  });

  describe('under KV pressure', () => {
    let small;
    before(async () => {
      small = await open({ nCtx: 512, nSeqMax: 8 });
    });
    after(() => small && small.dispose());

    it('evicts least-recently-used cached prefixes, never what a running request uses', async () => {
      const s = new Scheduler(small);
      scheduler = s;
      // the topic comes first so that no two prompts share a prefix: partial reuse (forkAt)
      // would otherwise touch older entries and change which one is least recently used
      const paragraph = (topic) =>
        `${topic}: here is a long and detailed description, written for students who want to understand it well. `.repeat(
          4,
        );
      // fill the cache with three ~80-token prompts, oldest first
      for (const topic of ['volcanoes', 'glaciers', 'deserts']) {
        await s.generate({ prompt: paragraph(topic), maxTokens: 2, params: GREEDY });
      }
      assert.equal(s.stats().cachedPrefixes, 3);
      assert.equal(s.stats().evictions, 0);
      const running = s.generate({ prompt: paragraph('forests'), maxTokens: 12, params: GREEDY });
      await tokensSeen(running, 2);
      // ~80 prompt + 200 new cells only fit once the two oldest prefixes are gone; it is
      // aborted after two tokens (admission is what matters here)
      const controller = new AbortController();
      const big = s.generate({
        prompt: paragraph('oceans'),
        maxTokens: 200,
        params: GREEDY,
        signal: controller.signal,
      });
      await tokensSeen(big, 2);
      controller.abort();
      const [r, b] = await Promise.all([running, big]);
      assert.equal(s.stats().evictions, 2);
      assert.equal(b.choices[0].finishReason, 'abort');
      assert.equal(r.choices[0].finishReason, 'length');
      assert.equal(r.choices[0].tokens.length, 12);
      assert.ok(
        r.choices[0].perplexity < 20,
        `the running request's text stayed coherent (perplexity ${r.choices[0].perplexity})`,
      );
      // the running request's prompt was pinned while it ran, and the newest idle prefix
      // survived; the least recently used one was evicted
      const cachedShare = async (topic) =>
        (await s.generate({ prompt: paragraph(topic), maxTokens: 1, params: GREEDY })).usage.cachedPromptTokens;
      assert.ok((await cachedShare('forests')) > 0);
      assert.ok((await cachedShare('deserts')) > 0);
      assert.equal(await cachedShare('volcanoes'), 0);
    });

    it('keeps the cached prefix an admitted request counts on until it forks it', async () => {
      const s = new Scheduler(small);
      scheduler = s;
      const text = (topic, times) =>
        `${topic}: a long and careful description, written for students who want to understand it well. `.repeat(times);
      const count = (t) => small.tokenizeSync(t, true).length;
      const shared = text('rivers', 14);
      await s.generate({ prompt: shared, maxTokens: 1, params: GREEDY }); // cached: ~250 cells
      assert.equal(s.stats().cachedPrefixes, 1);
      // Admitted together: A needs its last words and 4 tokens beyond the cached prefix; B is
      // sized to fit only with that prefix evicted. Evicting it before A forks it would leave A
      // the whole prefix to prefill again, cells it never reserved: the two would then outgrow
      // the 512 cells mid-run (llama.cpp finds no slot: ERR_KV_FULL). B must wait for A instead.
      const promptA = `${shared}Which river is the longest?`;
      const needA = count(promptA) - count(shared) + 4;
      const promptB = text('mountains', 6);
      const maxTokensB = small.nCtx - count(shared) - needA - count(promptB) + 16;
      assert.ok(maxTokensB > 32, `B generates ${maxTokensB} tokens`);
      const [a, b] = await Promise.all([
        s.generate({ prompt: promptA, maxTokens: 4, params: GREEDY }),
        s.generate({ prompt: promptB, maxTokens: maxTokensB, params: GREEDY }),
      ]);
      assert.ok(a.usage.cachedPromptTokens > 200, `A started from the prefix: ${a.usage.cachedPromptTokens} cached`);
      assert.equal(a.choices[0].tokens.length, 4);
      assert.ok(b.choices[0].tokens.length > 0);
    });

    it('queues a request until running ones leave room, and fails one that can never fit', async () => {
      const s = new Scheduler(small);
      scheduler = s;
      const first = new AbortController();
      const second = new AbortController();
      // each may need ~300 of the 512 cells: the second waits for the first to leave
      const a = s.generate({ prompt: 'Tell me about the moon.', maxTokens: 300, params: GREEDY, signal: first.signal });
      const b = s.generate({ prompt: 'Tell me about the sun.', maxTokens: 300, params: GREEDY, signal: second.signal });
      await tokensSeen(a, 2);
      assert.equal(s.stats().queued, 1, 'the second request waits: both would not fit');
      assert.equal(s.stats().running, 1);
      first.abort();
      await tokensSeen(b, 1);
      second.abort();
      const [ra, rb] = await Promise.all([a, b]);
      assert.equal(ra.choices[0].finishReason, 'abort');
      assert.equal(rb.choices[0].finishReason, 'abort');
      await rejects(() => s.generate({ prompt: 'x', n: 9, maxTokens: 1 }), 'ERR_INVALID_ARG', /nSeqMax/);
    });
  });
});
