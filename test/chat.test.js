'use strict';

// Chat helpers: formatChat / parseChatOutput / validateChatTemplate / getTurnSeparator, and
// cold + warm multi-turn generation on top of them (js-api.md §3.2 scenarios 5, 6, 9, 10).

const assert = require('node:assert/strict');
const { Branch, ReasoningFormat, GrammarTriggerType } = require('..');
const { open, rejects, throwsSync } = require('./helpers');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

const GREEDY = { temperature: 0 };

const WEATHER_TOOL = {
  type: 'function',
  function: {
    name: 'get_weather',
    description: 'Current weather for a city',
    parameters: { type: 'object', properties: { city: { type: 'string' } }, required: ['city'] },
  },
};

// A small Hermes-style template (ChatML turns, <tool_call> JSON calls): llama.cpp derives a
// tool-call parser from it.
const TOOL_TEMPLATE = `{%- if tools %}<|im_start|>system
You can call these functions:
{%- for t in tools %}
{{ t | tojson }}
{%- endfor %}
To call one, answer with <tool_call>{"name": <name>, "arguments": <args>}</tool_call><|im_end|>
{% endif %}
{%- for message in messages %}
{%- if message.role == 'assistant' and message.tool_calls %}<|im_start|>assistant
{%- if message.content %}
{{ message.content }}
{%- endif %}
{%- for tc in message.tool_calls %}
<tool_call>
{"name": "{{ tc.function.name }}", "arguments": {{ tc.function.arguments | tojson }}}
</tool_call>
{%- endfor %}<|im_end|>
{% elif message.role == 'tool' %}<|im_start|>user
<tool_response>
{{ message.content }}
</tool_response><|im_end|>
{% else %}<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{%- endfor %}
{%- if add_generation_prompt %}<|im_start|>assistant
{% endif %}`;

/** Greedy generation on `branch` until a stop token or `max` tokens; returns the text. */
async function generate(branch, max) {
  let text = '';
  for (let i = 0; i < max; i++) {
    const { token, text: piece, isStop } = branch.produce();
    if (isStop) break;
    text += piece;
    await branch.commit(token);
  }
  return text;
}

/** The tokens of a warm turn: close the previous assistant turn, then only the new user turn. */
async function warmTurnTokens(ctx, userText) {
  const { prompt } = await ctx.formatChat([
    { role: 'system', content: '' },
    { role: 'user', content: userText },
  ]);
  return [...ctx.getTurnSeparator(), ...(await ctx.tokenize(prompt, false))];
}

describe('Chat helpers', function () {
  let ctx;
  before(async () => {
    ctx = await open({ nCtx: 2048, nSeqMax: 2 });
  });
  after(() => ctx && ctx.dispose());

  describe('createContext chatTemplate', () => {
    // Gemma's turns, each closed by two newlines instead of one: a separator of its own.
    const TEMPLATE = [
      "{%- for m in messages -%}{{ '<start_of_turn>' + ('model' if m.role == 'assistant' else m.role) + '\\n' }}",
      "{{ m.content + '<end_of_turn>\\n\\n' }}{%- endfor -%}",
      "{%- if add_generation_prompt -%}{{ '<start_of_turn>model\\n' }}{%- endif -%}",
    ].join('');
    const messages = [{ role: 'user', content: 'Hi' }];

    it('is used by every chat call of the context that names no template, getTurnSeparator too', async () => {
      const own = await open({ nCtx: 256, chatTemplate: TEMPLATE });
      try {
        const rendered = (await own.formatChat(messages)).prompt;
        assert.equal(rendered, (await ctx.formatChat(messages, { templateOverride: TEMPLATE })).prompt);
        assert.notEqual(rendered, (await ctx.formatChat(messages)).prompt);
        assert.equal(own.formatChatSync(messages).prompt, rendered);
        // A template named in the call still wins.
        assert.equal(
          (await own.formatChat(messages, { templateOverride: TOOL_TEMPLATE })).prompt,
          (await ctx.formatChat(messages, { templateOverride: TOOL_TEMPLATE })).prompt,
        );
        const text = own
          .getTurnSeparator()
          .map((t) => own.tokenToText(t))
          .join('');
        assert.equal(text, '<end_of_turn>\n\n');
        assert.equal(
          ctx
            .getTurnSeparator()
            .map((t) => ctx.tokenToText(t))
            .join(''),
          '<end_of_turn>\n',
        );
      } finally {
        own.dispose();
      }
    });

    it('one llama.cpp cannot parse is ERR_CHAT_TEMPLATE at creation', async () => {
      await rejects(() => open({ nCtx: 256, chatTemplate: '{% for %}' }), 'ERR_CHAT_TEMPLATE', /chatTemplate/);
      await rejects(() => open({ nCtx: 256, chatTemplate: 7 }), 'ERR_INVALID_ARG');
    });
  });

  describe('getTurnSeparator', () => {
    it('is non-empty, contains a stop token, and is cached', () => {
      const sep = ctx.getTurnSeparator();
      assert.ok(Array.isArray(sep) && sep.length > 0);
      assert.ok(
        sep.some((t) => ctx.isStopToken(t)),
        `no stop token in ${sep}`,
      );
      // tokens after the stop token are whitespace only (Gemma: <end_of_turn> "\n")
      const stopAt = sep.findIndex((t) => ctx.isStopToken(t));
      for (const t of sep.slice(stopAt + 1)) assert.match(ctx.tokenToText(t), /^\s+$/);
      assert.deepEqual(ctx.getTurnSeparator(), sep);
    });

    it('renders what the template puts between an assistant turn and the next user turn', async () => {
      const { prompt } = await ctx.formatChat(
        [
          { role: 'user', content: 'A' },
          { role: 'assistant', content: 'B' },
          { role: 'user', content: 'C' },
        ],
        { addGenerationPrompt: false },
      );
      const sepText = ctx
        .getTurnSeparator()
        .map((t) => ctx.tokenToText(t))
        .join('');
      assert.ok(
        prompt.includes(`B${sepText}`),
        `${JSON.stringify(sepText)} does not follow the assistant text in ${JSON.stringify(prompt)}`,
      );
    });
  });

  describe('formatChat', () => {
    it('renders the model template and returns every result field (scenario 6)', async () => {
      const r = await ctx.formatChat(JSON.stringify([{ role: 'user', content: 'Hello' }]), {});
      assert.ok(r.prompt.includes('Hello'));
      assert.equal(typeof r.format, 'number');
      assert.equal(typeof r.grammar, 'string');
      assert.equal(typeof r.grammarLazy, 'boolean');
      assert.equal(typeof r.thinkingForcedOpen, 'boolean');
      assert.equal(typeof r.reasoningFormat, 'number');
      assert.equal(typeof r.parser, 'string');
      assert.equal(typeof r.generationPrompt, 'string');
      assert.ok(Array.isArray(r.stopTokens));
      assert.ok(Array.isArray(r.grammarTriggers));
      assert.ok(Array.isArray(r.preservedTokens));
      // Gemma turn markup; the generation prompt opens the model's turn
      assert.ok(r.prompt.startsWith('<start_of_turn>user\nHello<end_of_turn>'), JSON.stringify(r.prompt));
      assert.ok(r.prompt.endsWith(r.generationPrompt) && r.generationPrompt.length > 0);
      // the turn markers are single special tokens of this vocabulary
      const tokens = await ctx.tokenize(r.prompt, false);
      assert.ok(tokens.length < 12, `prompt tokenized into ${tokens.length} tokens`);
    });

    it('takes messages as an array too, and options as documented', async () => {
      const asString = await ctx.formatChat(JSON.stringify([{ role: 'user', content: 'Hello' }]));
      const asArray = await ctx.formatChat([{ role: 'user', content: 'Hello' }]);
      assert.equal(asArray.prompt, asString.prompt);
      const noGen = await ctx.formatChat([{ role: 'user', content: 'Hello' }], { addGenerationPrompt: false });
      assert.equal(noGen.prompt + asString.generationPrompt, asString.prompt);
      const legacy = await ctx.formatChat(
        [{ role: 'user', content: 'Hi' }],
        '{% for m in messages %}[{{ m.role }}] {{ m.content }}\n{% endfor %}',
      );
      assert.equal(legacy.prompt, '[user] Hi\n');
    });

    it('strips a leading empty system message so only the new turn is rendered', async () => {
      const full = await ctx.formatChat([{ role: 'user', content: 'Tell me more.' }]);
      const turn = await ctx.formatChat([
        { role: 'system', content: '' },
        { role: 'user', content: 'Tell me more.' },
      ]);
      // the new turn exactly as the template renders it after earlier turns (here: as a first turn)
      assert.equal(turn.prompt, full.prompt);
      assert.equal(turn.prompt, '<start_of_turn>user\nTell me more.<end_of_turn>\n<start_of_turn>model\n');
      // ChatML (a template with a system header) loses the empty system block entirely
      const chatml =
        '{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}';
      const r = await ctx.formatChat(
        [
          { role: 'system', content: '' },
          { role: 'user', content: 'Q' },
        ],
        { templateOverride: chatml },
      );
      assert.equal(r.prompt, '<|im_start|>user\nQ<|im_end|>\n<|im_start|>assistant\n');
    });

    it('accepts tools with toolChoice auto (scenario 6)', async () => {
      const r = await ctx.formatChat([{ role: 'user', content: 'Weather in Paris?' }], {
        tools: JSON.stringify([WEATHER_TOOL]),
        toolChoice: 'auto',
      });
      assert.equal(typeof r.format, 'number');
      assert.equal(typeof r.grammar, 'string');
      assert.ok(r.prompt.includes('Weather in Paris?'));
    });

    it('builds a lazy tool-call grammar for a template that supports tools', async () => {
      const r = await ctx.formatChat([{ role: 'user', content: 'Weather in Paris?' }], {
        templateOverride: TOOL_TEMPLATE,
        tools: [WEATHER_TOOL],
        toolChoice: 'auto',
      });
      assert.ok(r.prompt.includes('get_weather'), 'tools are rendered into the prompt');
      assert.ok(r.grammar.length > 0);
      assert.equal(r.grammarLazy, true);
      assert.ok(
        r.grammarTriggers.some((t) => t.value.includes('<tool_call>')),
        JSON.stringify(r.grammarTriggers),
      );
      assert.ok(r.preservedTokens.includes('<tool_call>'));
      assert.ok(r.parser.length > 0);
    });

    it('rejects bad input with coded errors', async () => {
      await rejects(() => ctx.formatChat('not json'), 'ERR_INVALID_ARG', /messages is not valid JSON/);
      await rejects(() => ctx.formatChat('{"role":"user"}'), 'ERR_INVALID_ARG', /array/);
      await rejects(() => ctx.formatChat([{ content: 'no role' }]), 'ERR_INVALID_ARG', /role/);
      await rejects(() => ctx.formatChat(42), 'ERR_INVALID_ARG', /messages must be/);
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { toolChoice: 'sometimes', tools: [WEATHER_TOOL] }),
        'ERR_INVALID_ARG',
        /toolChoice/,
      );
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { tools: 'nope' }),
        'ERR_INVALID_ARG',
        /tools/,
      );
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { reasoningFormat: 'loud' }),
        'ERR_INVALID_ARG',
        /reasoningFormat/,
      );
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { addGenerationPrompt: 'yes' }),
        'ERR_INVALID_ARG',
        /addGenerationPrompt must be a boolean/,
      );
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { templateOverride: '{% for %}' }),
        'ERR_CHAT_TEMPLATE',
        /could not be parsed/,
      );
      await rejects(
        () =>
          ctx.formatChat([{ role: 'user', content: 'x' }], {
            templateOverride: '{{ raise_exception("no users here") }}',
          }),
        'ERR_CHAT_TEMPLATE',
        /no users here/,
      );
      // Gemma's template requires alternating roles
      await rejects(
        () =>
          ctx.formatChat([
            { role: 'user', content: 'a' },
            { role: 'user', content: 'b' },
          ]),
        'ERR_CHAT_TEMPLATE',
        /alternate/,
      );
      // Values JSON.stringify throws on: a coded error, no pending exception left behind.
      const cyclic = [{ role: 'user', content: 'x' }];
      cyclic[0].self = cyclic;
      await rejects(() => ctx.formatChat(cyclic), 'ERR_INVALID_ARG', /JSON.stringify \(cyclic or not serialisable\)/);
      throwsSync(
        () =>
          ctx.formatChatSync([
            {
              toJSON() {
                throw new Error('boom');
              },
            },
          ]),
        'ERR_INVALID_ARG',
        /JSON.stringify/,
      );
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { tools: [{ big: 1n }] }),
        'ERR_INVALID_ARG',
        /options.tools/,
      );
      assert.equal(typeof (await ctx.formatChat([{ role: 'user', content: 'still works' }])).prompt, 'string');
    });
  });

  describe('parseChatOutput', () => {
    it('returns plain text as content (scenario 6)', async () => {
      const r = await ctx.formatChat([{ role: 'user', content: 'Hello' }]);
      const out = ctx.parseChatOutput('Hello world', r.format);
      assert.equal(out.content, 'Hello world');
      assert.equal(out.reasoningContent, '');
      assert.deepEqual(out.toolCalls, []);
      const withOpts = ctx.parseChatOutput('Hello world', r.format, {
        reasoningFormat: r.reasoningFormat,
        isPartial: false,
        thinkingForcedOpen: false,
      });
      assert.equal(withOpts.content, 'Hello world');
      // the whole formatChat result works as options (parser + generation prompt)
      assert.equal(ctx.parseChatOutput('Hello world', r.format, r).content, 'Hello world');
    });

    it('extracts tool calls with the parser formatChat built', async () => {
      const r = await ctx.formatChat([{ role: 'user', content: 'Weather in Paris?' }], {
        templateOverride: TOOL_TEMPLATE,
        tools: [WEATHER_TOOL],
      });
      const out = ctx.parseChatOutput(
        '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>',
        r.format,
        r,
      );
      assert.equal(out.toolCalls.length, 1);
      assert.equal(out.toolCalls[0].name, 'get_weather');
      assert.deepEqual(JSON.parse(out.toolCalls[0].arguments), { city: 'Paris' });
      assert.equal(typeof out.toolCalls[0].id, 'string');
      assert.equal(out.content, '');
      const plain = ctx.parseChatOutput('It is sunny.', r.format, r);
      assert.equal(plain.content, 'It is sunny.');
      assert.deepEqual(plain.toolCalls, []);
    });

    it('partial output: every prefix gives content and calls that only grow toward the final ones', async () => {
      const ask = [{ role: 'user', content: 'Weather in Paris?' }];
      const generic = await ctx.formatChat(ask, { tools: [WEATHER_TOOL] }); // Gemma 3: the generic format
      const hermes = await ctx.formatChat(ask, { templateOverride: TOOL_TEMPLATE, tools: [WEATHER_TOOL] });
      const cases = [
        [
          generic,
          '{"tool_calls": [{"name": "get_weather", "arguments": {"city": "Par\\u00eds \\"x\\"", "days": 12, ' +
            '"deep": {"a": [1, 2.5e3, true, null, "é😀"]}}}, {"name": "get_weather", "arguments": {}}]}',
        ],
        [generic, '{ "response" : "Hello, wor\\nld é😀" }'],
        [hermes, '<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris", "days": [1, 2]}}\n</tool_call>'],
      ];
      for (const [r, text] of cases) {
        const final = ctx.parseChatOutput(text, r.format, r);
        assert.ok(final.content !== '' || final.toolCalls.length > 0, text);
        let before = { content: '', toolCalls: [] };
        let grew = 0;
        for (let i = 0; i <= text.length; i++) {
          const code = text.charCodeAt(i - 1);
          if (code >= 0xd800 && code < 0xdc00) continue; // inside a surrogate pair: no stream has this text
          const now = ctx.parseChatOutput(text.slice(0, i), r.format, { ...r, isPartial: true });
          const where = `${JSON.stringify(text.slice(0, i))} → ${JSON.stringify(now)}`;
          assert.ok(final.content.startsWith(now.content) && now.content.startsWith(before.content), where);
          assert.ok(now.toolCalls.length >= before.toolCalls.length, where);
          for (const [k, call] of now.toolCalls.entries()) {
            assert.equal(call.name, final.toolCalls[k].name, where);
            assert.ok(final.toolCalls[k].arguments.startsWith(call.arguments), where);
            if (before.toolCalls[k]) assert.ok(call.arguments.startsWith(before.toolCalls[k].arguments), where);
          }
          if (JSON.stringify(now) !== JSON.stringify(before)) grew++;
          before = now;
        }
        assert.ok(grew >= 5, `${text}: the parse grew ${grew} times`);
      }
    });

    it('takes reasoningFormat as a ReasoningFormat value or name', async () => {
      assert.deepEqual({ ...ReasoningFormat }, { NONE: 0, AUTO: 1, DEEPSEEK_LEGACY: 2, DEEPSEEK: 3 });
      assert.deepEqual({ ...GrammarTriggerType }, { TOKEN: 0, WORD: 1, PATTERN: 2, PATTERN_FULL: 3 });
      const r = await ctx.formatChat([{ role: 'user', content: 'Hi' }], { reasoningFormat: 'deepseek_legacy' });
      assert.equal(r.reasoningFormat, ReasoningFormat.DEEPSEEK_LEGACY);
      for (const reasoningFormat of [ReasoningFormat.DEEPSEEK, 'auto']) {
        assert.equal(
          ctx.parseChatOutput('Plain answer.', r.format, { ...r, reasoningFormat }).content,
          'Plain answer.',
        );
      }
    });

    it('rejects bad options with coded errors', async () => {
      const r = await ctx.formatChat([{ role: 'user', content: 'Hello' }]);
      throwsSync(() => ctx.parseChatOutput('x', -1), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.parseChatOutput('x', 1.5), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.parseChatOutput('x', 9999), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.parseChatOutput('x', r.format, { reasoningFormat: 7 }), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.parseChatOutput('x', r.format, { isPartial: 1 }), 'ERR_INVALID_ARG');
      throwsSync(() => ctx.parseChatOutput('x', r.format, { parser: 'not a parser' }), 'ERR_INVALID_ARG');
      throwsSync(
        () => ctx.parseChatOutput('x', r.format, { parser: r.parser, thinkingForcedOpen: true }),
        'ERR_INVALID_ARG',
      );
    });

    it('rejects output that does not match the format (ERR_CHAT_PARSE)', async () => {
      // a parser that must see the generation prompt first: without it, output cannot match
      const r = await ctx.formatChat([{ role: 'user', content: 'Hello' }]);
      const e = throwsSync(
        () => ctx.parseChatOutput('Hello', r.format, { parser: r.parser, generationPrompt: 'something else' }),
        'ERR_CHAT_PARSE',
      );
      assert.match(e.message, /does not match/);
    });
  });

  describe('validateChatTemplate', () => {
    it('accepts valid Jinja templates and rejects broken ones', async () => {
      assert.equal(await ctx.validateChatTemplate(TOOL_TEMPLATE), true);
      assert.equal(
        await ctx.validateChatTemplate('{% for m in messages %}{{ m.role }}: {{ m.content }}\n{% endfor %}'),
        true,
      );
      assert.equal(await ctx.validateChatTemplate('{{ bad'), false);
      assert.equal(await ctx.validateChatTemplate('{% for m in messages %}'), false);
      assert.equal(await ctx.validateChatTemplate(''), false);
      await rejects(() => ctx.validateChatTemplate(42), 'ERR_INVALID_ARG');
      // nesting llama.cpp's recursive parser could not survive is refused, not a crash
      const nested = (n) => `{{ ${'('.repeat(n)}1${')'.repeat(n)} }}`;
      assert.equal(await ctx.validateChatTemplate(nested(200)), true);
      assert.equal(await ctx.validateChatTemplate(nested(100000)), false);
      await rejects(
        () => ctx.formatChat([{ role: 'user', content: 'x' }], { templateOverride: nested(100000) }),
        'ERR_CHAT_TEMPLATE',
        /nests deeper/,
      );
    });
  });

  describe('multi-turn on a branch', () => {
    afterEach(async () => {
      for (const h of nativeOf(ctx)._storeLiveHandles()) nativeOf(ctx)._branchPrune(h);
      await ctx.kvCacheClear();
    });

    it('prefills warm turns with the separator + the new turn only; position advances exactly (scenario 9)', async () => {
      const cold = await ctx.formatChat([{ role: 'user', content: 'What is the capital of France?' }]);
      const root = Branch.create(ctx, 0, GREEDY);
      await root.prefill(await ctx.tokenize(cold.prompt));
      const first = await generate(root, 5);
      assert.ok(first.length > 0);
      for (const turn of [' Tell me more.', ' What about transportation?']) {
        // a warm turn usually follows a finished assistant turn; here it cuts one short on purpose
        const delta = await warmTurnTokens(ctx, turn);
        const before = root.position;
        await root.prefill(delta);
        assert.equal(root.position, before + delta.length);
        assert.equal(ctx.kvSeqPosMax(root.seqId), root.position - 1);
        assert.ok((await generate(root, 5)).length > 0);
      }
      await root.prune();
    });

    it('warm turns reproduce the cold rendering token for token, and earlier turns are recalled (scenario 10)', async function () {
      this.timeout(300000);
      // The default model is the base (not instruction-tuned) Gemma 3 270M: its own replies drift
      // off topic, so the assistant turns are scripted and only the answers are generated.
      const script = [
        ['Hi, my name is Lloyal.', 'Nice to meet you, Lloyal.'],
        ['My favourite food is pizza.', 'Pizza is a great choice.'],
      ];
      const history = [];
      const decoded = [];
      const root = Branch.create(ctx, 0, GREEDY);
      const feed = async (tokens) => {
        decoded.push(...tokens);
        await root.prefill(tokens);
      };
      for (const [i, [user, reply]] of script.entries()) {
        if (i === 0) {
          await feed(await ctx.tokenize((await ctx.formatChat([{ role: 'user', content: user }])).prompt));
        } else {
          await feed(await warmTurnTokens(ctx, user));
        }
        await feed(await ctx.tokenize(reply, false));
        history.push({ role: 'user', content: user }, { role: 'assistant', content: reply });
      }
      assert.equal(root.position, decoded.length);

      const answer = async (question) => {
        const branch = root.fork();
        await branch.prefill(await warmTurnTokens(ctx, question));
        const raw = await generate(branch, 10);
        await branch.prune();
        return raw;
      };
      const fmt = await ctx.formatChat([{ role: 'user', content: 'x' }]);
      const name = ctx.parseChatOutput(await answer('What is my name?'), fmt.format, fmt).content;
      const food = ctx.parseChatOutput(await answer('What is my favourite food?'), fmt.format, fmt).content;
      assert.match(name, /lloyal/i);
      assert.match(food, /pizza/i);

      // Same conversation formatted cold in one piece: identical tokens.
      await feed(await warmTurnTokens(ctx, 'What is my favourite food?'));
      const cold = await ctx.formatChat([...history, { role: 'user', content: 'What is my favourite food?' }]);
      assert.deepEqual(await ctx.tokenize(cold.prompt), decoded);
      await root.prune();

      // Control: without the earlier turns in the KV cache the model does not know the answer.
      const fresh = Branch.create(ctx, 0, GREEDY);
      await fresh.prefill(
        await ctx.tokenize((await ctx.formatChat([{ role: 'user', content: 'What is my favourite food?' }])).prompt),
      );
      assert.doesNotMatch(await generate(fresh, 10), /pizza/i);
      await fresh.prune();
    });
  });

  it('refuses every chat call after dispose', async () => {
    const c = await open();
    c.dispose();
    await rejects(() => c.formatChat([{ role: 'user', content: 'x' }]), 'ERR_CONTEXT_DISPOSED');
    await rejects(() => c.validateChatTemplate('{{ x }}'), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => c.parseChatOutput('x', 0), 'ERR_CONTEXT_DISPOSED');
    throwsSync(() => c.getTurnSeparator(), 'ERR_CONTEXT_DISPOSED');
  });
});
