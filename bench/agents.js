#!/usr/bin/env node
'use strict';

/**
 * Agent-server benchmark (issue 24), measured in one run through the real HTTP server on
 * loopback with the official `openai` client:
 *   forced calls   how many `tool_choice: 'required'` choices (sampled at temperature 0.7 and 1)
 *                  parse and validate against the tool's schema. The grammar makes every finished
 *                  call valid; a call can still be cut off by max_tokens (a string argument the
 *                  model never closes), and those are counted apart.
 *   tools vs chat  tokens/s of C = 4 concurrent tool-call requests vs C = 4 plain chat requests
 *   logprobs       tokens/s of C = 4 chat requests with `logprobs` + `top_logprobs: 5` vs without
 *                  (plain and logprob runs interleaved, medians of --reps)
 *
 * Usage: node bench/agents.js [--reps=3] [--calls=100] (or npm run bench -- --agents)
 * Writes bench/results/agents-<timestamp>.json and prints the numbers.
 */

const fs = require('node:fs');
const path = require('node:path');
const OpenAI = require('openai');
const { createServer, systemInfo } = require('..');
const { args, modelPath, median } = require('./common');

const REPS = Number(args.reps || 3);
const CALLS = Number(args.calls || 100);
const C = 4;
const log = (...a) => console.error('[bench:agents]', ...a);

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
const QUESTIONS = ['Weather in Paris?', 'Is it raining in Oslo?', 'How hot is Cairo today?', 'Snow in Denver?'];

function validCall(choice) {
  const call = choice.message.tool_calls && choice.message.tool_calls[0];
  if (!call || call.function.name !== 'get_weather') return false;
  try {
    const a = JSON.parse(call.function.arguments);
    return typeof a.city === 'string' && ['celsius', 'fahrenheit'].includes(a.unit);
  } catch {
    return false;
  }
}

/** Tokens/s of C concurrent chat requests made with `extra` fields. */
async function rate(client, model, extra) {
  const started = performance.now();
  const results = await Promise.all(
    QUESTIONS.slice(0, C).map((q, i) =>
      client.chat.completions.create({
        model,
        messages: [{ role: 'user', content: q }],
        max_tokens: 48,
        temperature: 0.7,
        seed: i,
        ...extra,
      }),
    ),
  );
  const tokens = results.reduce((n, r) => n + r.usage.completion_tokens, 0);
  return tokens / ((performance.now() - started) / 1000);
}

async function main() {
  // Decode-only steps (no prompt tokens, all C rows) of the phase running, to time a step
  // apart from the prompts' prefill (the tool prompts are ~10× longer) and reply lengths.
  const steps = { chat: [], tools: [], plain: [], logprobs: [] };
  let phase = null;
  const onStep = (info) => {
    if (phase && info.prefillTokens === 0 && info.rows === C) steps[phase].push(info.stepMs);
  };
  const server = await createServer({ modelPath: modelPath(), nCtx: 8192, parallel: C, scheduler: { onStep } });
  const { url } = await server.listen(0);
  const client = new OpenAI({ baseURL: `${url}/v1`, apiKey: 'x', maxRetries: 0 });
  const model = server.modelName;
  try {
    const forced = {};
    for (const temperature of [0.7, 1]) {
      const count = { valid: 0, cutOff: 0, total: 0 };
      for (let done = 0; done < CALLS; done += 10) {
        const r = await client.chat.completions.create({
          model,
          messages: [{ role: 'user', content: QUESTIONS[(done / 10) % QUESTIONS.length] }],
          tools: [WEATHER],
          tool_choice: 'required',
          n: Math.min(10, CALLS - done),
          max_tokens: 128,
          temperature,
          seed: done,
        });
        count.total += r.choices.length;
        count.valid += r.choices.filter(validCall).length;
        count.cutOff += r.choices.filter((c) => c.finish_reason === 'length').length;
      }
      forced[temperature] = count;
      log(
        `forced calls at T=${temperature}: ${count.valid}/${count.total} valid, ${count.cutOff} cut off by max_tokens`,
      );
    }
    const runs = { chat: [], tools: [], plain: [], logprobs: [] };
    await rate(client, model, {}); // warm the prefix cache and the threads
    const variants = {
      chat: {},
      tools: { tools: [WEATHER], tool_choice: 'required' },
      plain: {},
      logprobs: { logprobs: true, top_logprobs: 5 },
    };
    for (let rep = 0; rep < REPS; rep++) {
      for (const [name, extra] of Object.entries(variants)) {
        phase = name;
        runs[name].push(await rate(client, model, extra));
        phase = null;
      }
    }
    const m = Object.fromEntries(Object.entries(runs).map(([k, v]) => [k, median(v)]));
    const stepMs = Object.fromEntries(Object.entries(steps).map(([k, v]) => [k, median(v)]));
    const result = {
      system: systemInfo(),
      forcedCalls: forced,
      tokensPerSecond: m,
      toolsOverChat: m.tools / m.chat,
      logprobsOverPlain: m.logprobs / m.plain,
      decodeStepMs: stepMs,
      runs,
    };
    log(
      `C=${C} tokens/s: chat ${m.chat.toFixed(1)}, tool calls ${m.tools.toFixed(1)} (×${result.toolsOverChat.toFixed(3)})`,
    );
    log(
      `C=${C} tokens/s: plain ${m.plain.toFixed(1)}, logprobs top 5 ${m.logprobs.toFixed(1)} (×${result.logprobsOverPlain.toFixed(3)})`,
    );
    log(
      `decode step (${C} rows, no prefill) ms: chat ${stepMs.chat.toFixed(1)}, tool calls ${stepMs.tools.toFixed(1)}, plain ${stepMs.plain.toFixed(1)}, logprobs ${stepMs.logprobs.toFixed(1)}`,
    );
    const out = path.join(__dirname, 'results', `agents-${new Date().toISOString().replace(/[:.]/g, '-')}.json`);
    fs.writeFileSync(out, JSON.stringify(result, null, 2));
    log(`wrote ${path.relative(process.cwd(), out)}`);
  } finally {
    await server.close();
  }
}

module.exports = { main };

if (require.main === module) {
  main().catch((e) => {
    console.error(e);
    process.exit(1);
  });
}
