'use strict';

// POST /v1/decisions on a real `llama-branch serve` process on 127.0.0.1, driven by OpenAI's own
// clients: the `openai` npm package (decisions.create, DecisionsToolRunner) and the Python
// `openai` package. The answers' shapes as the clients parse them, question order, names, typed
// choice values, refusals, usage and the prefix cache, OpenAI's error envelope (400 naming the
// field, 401, 404, 413, never a 500), and one question asked through /v1/decisions then
// /v1/systemone reusing the same cached forks.

const assert = require('node:assert/strict');
const path = require('node:path');
const { spawnSync, spawn } = require('node:child_process');
const { default: OpenAI } = require('openai');
const { DecisionsToolRunner } = require('openai/helpers/decisions-tool-runner');
const { startServer, stopServer } = require('./serve-helpers');
const { testPython } = require('../scripts/python');

const KEY = 'decisions-key';
const MODEL = 'gemma-3-270m-q4_k_m';
const sum = (xs) => xs.reduce((a, b) => a + b, 0);

const TICKET = 'Ticket from dana@example.com: I was charged twice for my subscription this month. Please refund one.';
const QUESTIONS = [
  { type: 'predicate', name: 'billing', instructions: 'Is this ticket about billing?' },
  {
    type: 'choice',
    name: 'team',
    instructions: 'Which team should handle this ticket?',
    choices: [
      { value: 'billing', description: 'Payments, invoices, refunds' },
      { value: 'technical', description: 'Bugs, errors, outages' },
      { value: 'true' },
      { value: true, description: 'anyone' },
    ],
  },
  {
    type: 'score',
    instructions: 'How urgent is this ticket?',
    levels: [{ label: 'low' }, { label: 'medium', description: 'this week' }, { label: 'high' }],
  },
];

/** Every invariant of one answer to `question` in the shape the clients parse. */
function checkAnswer(question, answer) {
  assert.equal(answer.name, question.name === undefined ? null : question.name);
  assert.equal(answer.type, question.type);
  if (question.type === 'predicate') {
    assert.deepEqual(Object.keys(answer).sort(), ['name', 'probability', 'type']);
    assert.ok(answer.probability >= 0 && answer.probability <= 1);
    return;
  }
  const p = answer.probabilities.map((x) => x.probability);
  assert.ok(Math.abs(sum(p) - 1) < 1e-9, `probabilities sum to ${sum(p)}`);
  const n = p.length;
  assert.ok(Math.abs(answer.confidence - (Math.max(...p) - 1 / n) / (1 - 1 / n)) < 1e-9);
  if (question.type === 'choice') {
    // values typed and in the question's order: the string "true" and the boolean true are two options
    assert.deepEqual(
      answer.probabilities.map((x) => x.value),
      question.choices.map((c) => c.value),
    );
    const best = p.indexOf(Math.max(...p));
    assert.equal(answer.choice, question.choices[best].value);
  } else {
    assert.deepEqual(
      answer.probabilities.map((x) => [x.label, x.value]),
      question.levels.map((l, i) => [l.label, i]),
    );
    assert.ok(Math.abs(answer.score - sum(p.map((x, i) => i * x))) < 1e-9, 'score = Σ i·p(i)');
  }
}

function checkUsage(usage) {
  assert.ok(Number.isInteger(usage.input_tokens) && usage.input_tokens > 0);
  assert.equal(usage.output_tokens, 0);
  assert.equal(usage.total_tokens, usage.input_tokens);
  assert.equal(usage.output_tokens_details.reasoning_tokens, 0);
  const { cached_tokens: cached, cache_write_tokens: written } = usage.input_tokens_details;
  assert.ok(Number.isInteger(cached) && cached >= 0 && cached <= usage.input_tokens);
  assert.ok(Number.isInteger(written) && written >= 0 && written <= usage.input_tokens);
}

describe('POST /v1/decisions (llama-branch serve, OpenAI clients)', function () {
  let server;
  let client;
  before(async () => {
    server = await startServer(['--parallel', '2', '--ctx-size', '4096', '--threads', '2', '--api-key', KEY]);
    client = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: KEY, maxRetries: 0 });
  });
  after(() => server && stopServer(server.child));

  it('answers predicate, choice and score about a string input, in question order, as the client parses them', async () => {
    const d = await client.decisions.create({ model: MODEL, input: TICKET, questions: QUESTIONS });
    assert.equal(d.model, MODEL);
    assert.equal(d.answers.length, QUESTIONS.length);
    QUESTIONS.forEach((q, i) => checkAnswer(q, d.answers[i]));
    checkUsage(d.usage);
    // The same request again: the input and every question's fork come from the prefix cache.
    const again = await client.decisions.create({ model: MODEL, input: TICKET, questions: QUESTIONS });
    checkUsage(again.usage);
    assert.equal(again.usage.input_tokens, d.usage.input_tokens);
    assert.ok(
      again.usage.input_tokens_details.cached_tokens > d.usage.input_tokens_details.cached_tokens,
      JSON.stringify([d.usage, again.usage]),
    );
    assert.equal(again.usage.input_tokens_details.cache_write_tokens, 0);
    assert.deepEqual(again.answers, d.answers);
  });

  it('renders messages with a function call and its output once, and refuses only the question it cannot ask', async () => {
    const questions = [
      { type: 'predicate', name: 'lost', instructions: 'Was the order lost?' },
      // An image part on a server without a vision projector: this question alone is refused.
      {
        type: 'predicate',
        name: 'photo',
        instructions: [
          { type: 'input_text', text: 'Does the photo show a parcel?' },
          { type: 'input_image', image_url: 'data:image/png;base64,iVBORw0KGgo=' },
        ],
      },
      {
        type: 'choice',
        instructions: [{ type: 'input_text', text: 'What should we do next?' }],
        choices: [{ value: 'refund' }, { value: 'resend' }],
      },
    ];
    const d = await client.decisions.create({
      model: MODEL,
      input: [
        { role: 'developer', content: 'You are a support triage assistant.' },
        {
          role: 'user',
          content: [
            { type: 'input_text', text: 'My order #12 never arrived.', prompt_cache_breakpoint: { mode: 'explicit' } },
            { type: 'input_json', data: { order: 12, paid: true } },
          ],
        },
        { type: 'function_call', call_id: 'call_1', name: 'track_order', arguments: '{"order":12}' },
        { type: 'function_call_output', call_id: 'call_1', output: 'status: lost in transit' },
        { role: 'assistant', content: [{ type: 'output_text', text: 'Sorry, it was lost.' }] },
        { type: 'custom_tool_call', call_id: 'call_2', name: 'note', input: 'customer informed' },
        { type: 'custom_tool_call_output', call_id: 'call_2', output: [{ type: 'input_text', text: 'saved' }] },
      ],
      questions,
      prompt_cache_key: 'support-42',
      safety_identifier: 'user-1234',
    });
    assert.deepEqual(
      d.answers.map((a) => [a.type, a.name]),
      [
        ['predicate', 'lost'],
        ['refusal', 'photo'],
        ['choice', null],
      ],
    );
    checkAnswer(questions[0], d.answers[0]);
    checkAnswer(questions[2], d.answers[2]);
    checkUsage(d.usage);
  });

  it('answers bad input in OpenAI error envelope (400 naming the field, 401, 404, 413), never a 500, and keeps serving', async () => {
    const q = [QUESTIONS[0]];
    const cases = [
      [
        { input: [{ type: 'function_call_output', call_id: 'nope', output: 'x' }], questions: q },
        400,
        'input[0].call_id',
      ],
      [
        {
          input: [
            { type: 'custom_tool_call', call_id: 'a', name: 'n', input: 'i' },
            { type: 'function_call_output', call_id: 'a', output: 'x' },
          ],
          questions: q,
        },
        400,
        'input[1].call_id',
      ],
      [{ input: 'x', questions: [] }, 400, 'questions'],
      [{ input: 'x', questions: Array.from({ length: 401 }, () => QUESTIONS[0]) }, 400, 'questions'],
      [{ input: 'x', questions: [{ type: 'maybe', instructions: 'x' }] }, 400, 'questions[0].type'],
      [
        { input: 'x', questions: [{ type: 'choice', instructions: 'x', choices: [{ value: 'a' }] }] },
        400,
        'questions[0].choices',
      ],
      [
        { input: 'x', questions: [{ type: 'choice', instructions: 'x', choices: [{ value: 'a' }, { value: 'a' }] }] },
        400,
        'questions[0].choices[1]',
      ],
      [
        { input: 'x', questions: [{ type: 'score', instructions: 'x', levels: [{ label: 'a' }] }] },
        400,
        'questions[0].levels',
      ],
      [{ input: 'x', questions: [{ type: 'predicate', instructions: '' }] }, 400, 'questions[0].instructions'],
      [{ input: 42, questions: q }, 400, 'input'],
      [{ input: [{ role: 'robot', content: 'x' }], questions: q }, 400, 'input[0].role'],
      [
        { input: [{ role: 'user', content: [{ type: 'input_image', image_url: 'x' }] }], questions: q },
        400,
        'input[0].content[0]',
      ],
      [{ input: 'word '.repeat(6000), questions: q }, 400, 'input'],
      [{ input: 'x', questions: q, temperature: 1 }, 400, 'temperature'],
      [{ input: 'x', questions: q, prompt_cache_key: 7 }, 400, 'prompt_cache_key'],
      [{ input: 'x', questions: q, model: 'gpt-6-luna' }, 404, 'model'],
    ];
    for (const [body, status, param] of cases) {
      const err = await client.decisions.create({ model: MODEL, ...body }).then(
        () => assert.fail(`${JSON.stringify(body).slice(0, 100)} was answered`),
        (e) => e,
      );
      assert.ok(err instanceof OpenAI.APIError, String(err));
      assert.equal(err.status, status, `${JSON.stringify(body).slice(0, 100)} → ${err.status} ${err.message}`);
      assert.equal(err.param, param, err.message);
      assert.equal(typeof err.type, 'string');
      assert.ok(err.message.length > 10);
    }
    const noKey = new OpenAI({ baseURL: `${server.url}/v1`, apiKey: 'wrong', maxRetries: 0 });
    await assert.rejects(
      noKey.decisions.create({ model: MODEL, input: 'x', questions: q }),
      OpenAI.AuthenticationError,
    );
    const res = await fetch(`${server.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ model: MODEL, input: 'x'.repeat(5 * 1024 * 1024), questions: q }),
    });
    assert.equal(res.status, 413);
    assert.equal(typeof (await res.json()).error.message, 'string');
    const after = await client.decisions.create({ model: MODEL, input: 'still here?', questions: q });
    assert.equal(after.answers.length, 1);
  });

  it('fuzz: mutated bodies of every field get a 2xx or a 4xx in the envelope, never a 5xx', async () => {
    // A seeded generator: the same bodies on every run.
    let seed = 42;
    const rand = () => (seed = (seed * 1103515245 + 12345) % 2 ** 31) / 2 ** 31;
    const pick = (xs) => xs[Math.floor(rand() * xs.length)];
    const junk = () =>
      pick([null, true, 0, -1, 1e308, '', 'x', '\u0000', [], [null], {}, { type: 'input_text' }, 'a'.repeat(3000)]);
    const base = () => ({
      model: MODEL,
      input: [
        { role: 'user', content: [{ type: 'input_text', text: 'x' }] },
        { type: 'function_call', call_id: 'c', name: 'f', arguments: '{}' },
        { type: 'function_call_output', call_id: 'c', output: 'y' },
      ],
      questions: [
        { type: 'choice', name: 'n', instructions: 'q', choices: [{ value: 'a' }, { value: false, description: 'd' }] },
        { type: 'score', instructions: [{ type: 'input_text', text: 'q' }], levels: [{ label: 'l' }, { label: 'h' }] },
      ],
    });
    /** Every path to a value in `o`. */
    const paths = (o, at = []) =>
      o !== null && typeof o === 'object' ? [at, ...Object.keys(o).flatMap((k) => paths(o[k], [...at, k]))] : [at];
    const statuses = new Map();
    for (let i = 0; i < 40; i++) {
      const body = base();
      const targets = paths(body).filter((p) => p.length > 0);
      for (let m = 0; m < 1 + Math.floor(rand() * 2); m++) {
        const path = pick(targets);
        let parent = body;
        for (const k of path.slice(0, -1)) parent = parent && typeof parent === 'object' ? parent[k] : undefined;
        if (parent && typeof parent === 'object') {
          if (rand() < 0.2) delete parent[path[path.length - 1]];
          else parent[path[path.length - 1]] = junk();
        }
      }
      const res = await fetch(`${server.url}/v1/decisions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
        body: JSON.stringify(body),
      });
      const json = await res.json();
      statuses.set(res.status, (statuses.get(res.status) || 0) + 1);
      assert.ok(res.status < 500, `${res.status} for ${JSON.stringify(body).slice(0, 300)}: ${JSON.stringify(json)}`);
      if (res.status >= 400) {
        assert.equal(typeof json.error.message, 'string');
        assert.ok(json.error.param === null || typeof json.error.param === 'string');
      } else assert.equal(json.answers.length, body.questions.length);
    }
    assert.ok(statuses.get(400) > 0, JSON.stringify([...statuses]));
  });

  it('reuses the forks of /v1/decisions when /v1/systemone asks the same question about the same state', async () => {
    const state = `Shift log.\n${Array.from({ length: 12 }, (_, i) => `Line ${i}: the pump in hall ${i} was checked.`).join('\n')}`;
    const instructions = 'Was a pump in hall three checked during this shift, according to the log above?';
    const d = await client.decisions.create({
      model: MODEL,
      input: state,
      questions: [{ type: 'predicate', instructions }],
    });
    const res = await fetch(`${server.url}/v1/systemone`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
      body: JSON.stringify({ state, questions: { pump: { type: 'noul', instructions } } }),
    });
    const json = await res.json();
    assert.equal(res.status, 200, JSON.stringify(json));
    assert.equal(json.usage.input_tokens, d.usage.input_tokens);
    // the same tokens, read from the same cached fork's logits
    assert.equal(json.answers.pump.noul, d.answers[0].probability);
  });

  it('DecisionsToolRunner drives a scripted task to completion', async () => {
    // A counter to raise to 2. Whatever the model picks, the run ends: `finish` is verified only at
    // 2, and once there it is the sole candidate (the runner then asks nothing).
    let count = 0;
    const runner = new DecisionsToolRunner({
      observe: () => `The counter shows ${count}. The task is done when it shows 2.`,
      candidates: () =>
        count >= 2
          ? [{ id: 'finish', description: 'The counter shows 2: the task is done.', done: true }]
          : [
              { id: 'increment', description: 'Add one to the counter.', execute: () => void count++ },
              { id: 'finish', description: 'The counter shows 2: the task is done.', done: true },
            ],
      verify: () => count >= 2,
    });
    let result;
    try {
      result = await runner.run(
        client,
        { model: MODEL, input: 'Raise the counter to 2, then finish.' },
        { maxSteps: 12 },
      );
    } catch (e) {
      assert.fail(`the runner stopped: ${e.reason} (attempted ${e.attemptedCandidateIds})`);
    }
    assert.equal(result.status, 'verified');
    assert.equal(count, 2);
    assert.deepEqual(result.completedCandidateIds, ['increment', 'increment']);
    assert.ok(result.decisions.length >= 2);
    for (const d of result.decisions) {
      assert.equal(d.answers[0].name, 'next_action');
      assert.equal(d.answers[0].type, 'choice');
      checkUsage(d.usage);
    }
  });

  describe("OpenAI's Python client", function () {
    const python = testPython();
    const clientImports = () =>
      Boolean(python) &&
      spawnSync(
        python,
        ['-c', 'import openai, sys; sys.exit(0 if hasattr(openai.OpenAI(api_key="x"), "decisions") else 1)'],
        {
          stdio: 'ignore',
        },
      ).status === 0;
    const hasClient = clientImports();
    const missing = python
      ? "the Python openai package (3.5x) is not installed (pip install 'openai>=3.57,<4')"
      : 'no python3';
    // CI installs the client (scripts/setup.js --system), so there it must run. Elsewhere the title
    // says why it does not run, and the test checks that reason (as test/systemone.test.js does).
    if (!hasClient && process.env.CI !== 'true') {
      it(`not run here: ${missing}`, function () {
        assert.ok(!clientImports());
      });
      return;
    }
    it('client.decisions.create with messages, a function call and all three types', async function () {
      assert.ok(hasClient, `${missing}: CI installs it with node scripts/setup.js --system`);
      const child = spawn(python, [path.join(__dirname, 'decisions', 'client.py'), server.url, KEY, MODEL], {
        stdio: ['ignore', 'pipe', 'pipe'],
      });
      let out = '';
      let err = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (err += d));
      const code = await new Promise((resolve) => child.on('exit', resolve));
      assert.equal(code, 0, `python client: ${err}`);
      const r = JSON.parse(out);
      assert.deepEqual(r.types, ['predicate', 'choice', 'score']);
      assert.deepEqual(r.names, ['lost', 'action', null]);
      assert.ok(r.probability >= 0 && r.probability <= 1);
      assert.deepEqual(r.values, ['refund', 'resend', true]);
      assert.ok(['refund', 'resend', true].includes(r.choice));
      assert.ok(r.score >= 0 && r.score <= 1);
      assert.deepEqual(r.labels, ['calm', 'angry']);
      assert.ok(r.input_tokens > 0);
      assert.equal(r.error_status, 400);
      assert.equal(r.error_param, 'input[0].call_id');
    });
  });
});
