'use strict';

// POST /v1/systemone on a real `llama-branch serve` process on 127.0.0.1: the protocol's request,
// response and error shapes, every one validated against the published Krite Protocol v1 schemas
// (test/krite/, from the krite-bench package), bad input answered 400 (never 500), API keys,
// /metrics, decisions beside streaming chat, and the Python `systemone-client` against it.

const assert = require('node:assert/strict');
const path = require('node:path');
const { spawnSync, spawn } = require('node:child_process');
const Ajv2020 = require('ajv/dist/2020').default;
const { startServer, stopServer } = require('./serve-helpers');
const { testPython } = require('../scripts/python');

const KEY = 'decisions-key';
const ajv = new Ajv2020({ strict: false, allErrors: true });
const validate = {
  request: ajv.compile(require('./krite/request.schema.json')),
  response: ajv.compile(require('./krite/response.schema.json')),
  error: ajv.compile(require('./krite/error.schema.json')),
};

function valid(kind, value) {
  assert.ok(
    validate[kind](value),
    `${kind} schema: ${ajv.errorsText(validate[kind].errors)}\n${JSON.stringify(value)}`,
  );
}

const QUESTIONS = {
  billing: {
    type: 'noul',
    instructions: 'Is this ticket about billing?',
    criteria: { true: 'payments or invoices', false: null },
  },
  team: {
    type: 'choice',
    instructions: 'Which team should handle this ticket?',
    criteria: { billing: 'Payments, invoices, refunds', technical: 'Bugs, errors, outages', sales: null },
  },
  urgency: { type: 'score', instructions: 'How urgent is this ticket?', criteria: ['low', 'medium', 'high'] },
};
const STATE = {
  ticket: { subject: 'Charged twice', body: 'I was charged twice this month; please refund one payment.' },
};

/** Checks that each answer fits its question (what the schema leaves open: types, names, argmax). */
function checkAnswers(questions, answers) {
  assert.deepEqual(Object.keys(answers).sort(), Object.keys(questions).sort());
  for (const [name, q] of Object.entries(questions)) {
    const a = answers[name];
    assert.equal(a.type, q.type);
    if (q.type === 'noul') continue;
    // A choice's probabilities are keyed by option name, a score's by level index as its legend is.
    const names = q.type === 'choice' ? Object.keys(q.criteria) : q.criteria.map((_, i) => String(i));
    assert.deepEqual(Object.keys(a.probabilities).sort(), [...names].sort());
    if (q.type === 'score') assert.deepEqual(a.legend, Object.fromEntries(q.criteria.map((l, i) => [String(i), l])));
    const p = names.map((n) => a.probabilities[n]);
    assert.ok(Math.abs(p.reduce((x, y) => x + y, 0) - 1) < 1e-9);
    if (q.type === 'choice') assert.equal(a.probabilities[a.choice], Math.max(...p));
    else assert.ok(a.score >= 0 && a.score <= names.length - 1);
  }
}

describe('POST /v1/systemone (llama-branch serve)', function () {
  let server;
  let url;
  before(async () => {
    server = await startServer(['--parallel', '2', '--ctx-size', '4096', '--threads', '2', '--api-key', KEY]);
    url = server.url;
  });
  after(() => server && stopServer(server.child));

  /** Posts `body` (an object, or raw text), validating the reply against the protocol's schemas. */
  async function post(body, { key = KEY, raw = false } = {}) {
    if (!raw) valid('request', body);
    const res = await fetch(`${url}/v1/systemone`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(key ? { authorization: `Bearer ${key}` } : {}) },
      body: raw ? body : JSON.stringify(body),
    });
    const json = await res.json();
    valid(res.status === 200 ? 'response' : 'error', json);
    return { status: res.status, json };
  }

  it('answers a decision in the protocol shape', async () => {
    const { status, json } = await post({ state: STATE, questions: QUESTIONS });
    assert.equal(status, 200, JSON.stringify(json));
    assert.equal(json.model, 'gemma-3-270m-q4_k_m');
    checkAnswers(QUESTIONS, json.answers);
    assert.ok(json.usage.input_tokens > 0);
    assert.equal(json.usage.output_tokens, 0);
    assert.ok(json.latency_ms > 0);
    const named = await post({ model: json.model, state: 'Plain text state.', questions: { b: QUESTIONS.billing } });
    assert.equal(named.status, 200);
  });

  it('answers bad input with a 400 (or 401, 404) in the protocol error shape, and keeps serving', async () => {
    const choice = (n) => ({
      type: 'choice',
      instructions: 'Pick one',
      criteria: Object.fromEntries(Array.from({ length: n }, (_, i) => [`o${i}`, null])),
    });
    const levels = Array.from({ length: 11 }, (_, i) => `l${i}`);
    const cases = [
      [{ state: 'x', questions: { a: { type: 'maybe', instructions: 'x' } } }, 400, 'invalid_request'],
      [{ state: 'x', questions: { a: choice(1) } }, 400, 'invalid_request'],
      [{ state: 'x', questions: { a: choice(256) } }, 400, 'too_many_options'],
      [
        { state: 'x', questions: { a: { type: 'score', instructions: 'x', criteria: levels } } },
        400,
        'too_many_options',
      ],
      [{ state: 'x', questions: { 'no spaces': QUESTIONS.billing } }, 400, 'invalid_request'],
      [{ state: 'x', questions: { ['n'.repeat(65)]: QUESTIONS.billing } }, 400, 'invalid_request'],
      [{ state: 'word '.repeat(6000), questions: QUESTIONS }, 400, 'state_too_long'],
      [{ state: 'x', questions: {} }, 400, 'invalid_request'],
      [{ state: 7, questions: QUESTIONS }, 400, 'invalid_request'],
      [{ state: 'x' }, 400, 'invalid_request'],
      [{ state: 'x', questions: QUESTIONS, temperature: 1 }, 400, 'invalid_request'],
      [{ model: 'other-model', state: 'x', questions: QUESTIONS }, 404, 'unknown_model'],
      [
        {
          state: 'x',
          questions: Object.fromEntries(Array.from({ length: 65 }, (_, i) => [`q${i}`, QUESTIONS.billing])),
        },
        400,
        'too_many_questions',
      ],
    ];
    for (const [body, status, type] of cases) {
      // Some are invalid on purpose: sent without the request-schema check.
      const { status: got, json } = await post(JSON.stringify(body), { raw: true });
      assert.equal(got, status, `${JSON.stringify(body).slice(0, 120)} → ${JSON.stringify(json)}`);
      assert.equal(json.error.type, type, json.error.message);
      assert.ok(json.error.message.length > 10);
    }
    const notJson = await post('{"state": ', { raw: true });
    assert.equal(notJson.status, 400);
    const noKey = await post({ state: 'x', questions: QUESTIONS }, { key: null });
    assert.equal(noKey.status, 401);
    const wrongKey = await post({ state: 'x', questions: QUESTIONS }, { key: 'nope' });
    assert.equal(wrongKey.status, 401);
    const after = await post({ state: 'still here?', questions: { b: QUESTIONS.billing } });
    assert.equal(after.status, 200);
  });

  it('counts decisions in /metrics', async () => {
    const res = await fetch(`${url}/metrics`, { headers: { authorization: `Bearer ${KEY}` } });
    const text = await res.text();
    const value = (name) => Number(new RegExp(`^llamabranch_${name} (\\S+)$`, 'm').exec(text)[1]);
    assert.ok(value('decisions_total') >= 3, text);
    assert.ok(value('decision_questions_total') >= value('decisions_total'));
    assert.ok(value('decision_input_tokens_total') > 0);
    assert.match(text, /llamabranch_requests_total\{endpoint="\/v1\/systemone",status="400"\} \d+/);
    assert.match(text, /llamabranch_requests_total\{endpoint="\/v1\/systemone",status="200"\} \d+/);
  });

  it('answers decisions on different states beside a streaming chat, neither starving', async () => {
    const chat = (async () => {
      const res = await fetch(`${url}/v1/chat/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: `Bearer ${KEY}` },
        body: JSON.stringify({ messages: [{ role: 'user', content: 'Count to ten.' }], max_tokens: 24, stream: true }),
      });
      const text = await res.text();
      return { status: res.status, chunks: text.split('\n\n').filter((e) => e.startsWith('data: {')).length };
    })();
    const states = [
      'The printer is on fire.',
      'Please cancel my order.',
      'Where is my parcel?',
      'Invoice #42 is wrong.',
    ];
    const decisions = await Promise.all(states.map((state) => post({ state, questions: QUESTIONS })));
    for (const d of decisions) {
      assert.equal(d.status, 200);
      checkAnswers(QUESTIONS, d.json.answers);
    }
    const streamed = await chat;
    assert.equal(streamed.status, 200);
    assert.ok(streamed.chunks >= 2, `${streamed.chunks} chunks`);
  });

  describe('the Python systemone-client against the server', function () {
    const python = testPython();
    const hasClient = python && spawnSync(python, ['-c', 'import systemone'], { stdio: 'ignore' }).status === 0;
    const missing = python
      ? 'the systemone-client package is not installed (pip install systemone-client)'
      : 'no python3';
    // CI installs the client (scripts/setup.js --system), so there it must run: without it the
    // test below fails. Elsewhere its title says why it does not run, and it checks that reason.
    if (!hasClient && process.env.CI !== 'true') {
      it(`not run here: ${missing}`, function () {
        assert.ok(!python || spawnSync(python, ['-c', 'import systemone'], { stdio: 'ignore' }).status !== 0);
      });
      return;
    }
    it('asks noul, choice and score through systemone.Client and gets typed answers', async function () {
      assert.ok(hasClient, `${missing}: CI installs it with node scripts/setup.js --system`);
      const script = path.join(__dirname, 'krite', 'client.py');
      const child = spawn(python, [script, url, KEY], { stdio: ['ignore', 'pipe', 'pipe'] });
      let out = '';
      let err = '';
      child.stdout.on('data', (d) => (out += d));
      child.stderr.on('data', (d) => (err += d));
      const code = await new Promise((resolve) => child.on('exit', resolve));
      assert.equal(code, 0, `python client: ${err}`);
      const r = JSON.parse(out);
      assert.ok(r.noul >= 0 && r.noul <= 1);
      assert.ok(['billing', 'technical', 'sales'].includes(r.choice));
      assert.ok(r.score >= 0 && r.score <= 2);
      assert.deepEqual(r.legend, { 0: 'low', 1: 'medium', 2: 'high' });
      assert.ok(r.input_tokens > 0);
      assert.equal(r.error_status, 400);
    });
  });
});
