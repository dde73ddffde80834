'use strict';

// The gauges routers balance on (docs/serving.md, "Behind a router"): /metrics parsed by a real
// Prometheus text parser (parse-prometheus-text-format), each value checked against the
// scheduler's stats() at the moment of the scrape, once with work queued and running, once idle.

const assert = require('node:assert/strict');
const parsePrometheus = require('parse-prometheus-text-format');
const { createServer } = require('..');
const { MODEL } = require('./helpers');

/** name → [{ value, labels }] of a /metrics text, as Prometheus' text format defines it. */
function parse(text) {
  const families = new Map();
  for (const family of parsePrometheus(text)) families.set(family.name, family);
  return families;
}

/** The one sample of a gauge family, as a number (its labels checked when given). */
function gauge(families, name, labels) {
  const family = families.get(name);
  assert.ok(family, `/metrics has no ${name}`);
  assert.equal(family.type, 'GAUGE', `${name} is a gauge`);
  assert.equal(family.metrics.length, 1, `${name} has one sample`);
  if (labels) assert.deepEqual(family.metrics[0].labels, labels);
  return Number(family.metrics[0].value);
}

describe('router metrics on /metrics', function () {
  this.timeout(300000);
  let server;
  let url;

  before(async () => {
    // One request at a time, so that the others queue.
    server = await createServer({ modelPath: MODEL, nCtx: 2048, nThreads: 2, parallel: 1, ui: false });
    ({ url } = await server.listen(0, '127.0.0.1'));
  });
  after(async () => {
    if (server) await server.close();
  });

  /**
   * /metrics and stats() at one moment: stats() read just before and just after the scrape, kept
   * only when the two agree on every field the gauges come from (a step between them changes the
   * cells), retried until they do.
   */
  async function scrapeAtRest() {
    const fields = (s) => [s.queued, s.running, s.programs, s.cellsUsed, s.cellsInUse, s.nCtx].join(' ');
    for (let attempt = 0; attempt < 200; attempt++) {
      const before = server.scheduler.stats();
      const text = await (await fetch(`${url}/metrics`)).text();
      const after = server.scheduler.stats();
      if (fields(before) === fields(after)) return { families: parse(text), stats: after };
    }
    throw new Error('stats() changed during every one of 200 scrapes');
  }

  function checkAgainst({ families, stats }) {
    assert.equal(gauge(families, 'llamabranch:num_requests_waiting'), stats.queued);
    assert.equal(gauge(families, 'llamabranch:num_requests_running'), stats.running + stats.programs);
    const usage = gauge(families, 'llamabranch:kv_cache_usage_perc');
    assert.ok(usage >= 0 && usage <= 1, `KV usage ${usage} is a fraction`);
    assert.ok(Math.abs(usage - stats.cellsInUse / stats.nCtx) < 1e-9, `${usage} vs ${stats.cellsInUse}/${stats.nCtx}`);
    assert.ok(stats.cellsInUse <= stats.cellsUsed, 'in use is part of what is held');
    assert.equal(gauge(families, 'llamabranch:cache_config_info', { block_size: '16' }), 1);
    // The older names stay, with the same values.
    assert.equal(gauge(families, 'llamabranch_requests_queued'), stats.queued);
    assert.equal(gauge(families, 'llamabranch_requests_running'), stats.running);
  }

  it('match stats() while requests queue behind a running one and a program holds its line', async () => {
    let release;
    const gate = new Promise((resolve) => {
      release = resolve;
    });
    // A branch program that holds its cells until released: one admitted item that never steps.
    // Small declared needs, so that requests are admitted beside it.
    const program = server.scheduler.run(
      async (s) => {
        await s.append('The committee met on a Tuesday to discuss the budget for the new library.');
        await gate;
      },
      { maxBranches: 1, maxCells: 64 },
    );
    const completions = [0, 1, 2].map((i) =>
      fetch(`${url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify({ prompt: `Count: ${i},`, max_tokens: 8, temperature: 0 }),
      }),
    );
    try {
      // Wait until one request runs and two wait, then check a scrape taken in that state.
      let seen;
      for (const until = Date.now() + 60000; Date.now() < until;) {
        const scrape = await scrapeAtRest();
        if (
          scrape.stats.running === 1 &&
          scrape.stats.queued === 2 &&
          scrape.stats.programs === 1 &&
          scrape.stats.cellsUsed > 0
        ) {
          seen = scrape;
          break;
        }
        await new Promise((r) => setTimeout(r, 20));
      }
      assert.ok(seen, 'never saw one request running, two queued and the program admitted');
      checkAgainst(seen);
      assert.equal(gauge(seen.families, 'llamabranch:num_requests_waiting'), 2);
      assert.equal(gauge(seen.families, 'llamabranch:num_requests_running'), 2);
      assert.ok(gauge(seen.families, 'llamabranch:kv_cache_usage_perc') > 0, 'running work holds cells');
    } finally {
      release();
      await program;
      for (const r of await Promise.all(completions)) assert.equal(r.status, 200, await r.text());
    }
  });

  it("POST /tokenize (vLLM's, which KV-aware routers ask) gives the tokens a chat request is prefilled with", async () => {
    const messages = [{ role: 'user', content: 'Which berth is free tomorrow?' }];
    const post = (route, body) =>
      fetch(`${url}${route}`, {
        method: 'POST',
        headers: { 'content-type': 'application/json' },
        body: JSON.stringify(body),
      });
    const tokenized = await (await post('/tokenize', { messages })).json();
    assert.equal(tokenized.count, tokenized.tokens.length);
    assert.equal(tokenized.max_model_len, 2048);
    const reply = await (await post('/v1/chat/completions', { messages, max_tokens: 1 })).json();
    assert.equal(tokenized.count, reply.usage.prompt_tokens, 'the chat template applied as for the request');
    // The request's prompt is now a cached prefix: exactly these tokens.
    const cached = server.scheduler.cachedPrefixes().map((p) => p.tokens.join(','));
    assert.ok(cached.includes(tokenized.tokens.join(',')), 'the cache holds the tokenized prompt');
    const bad = await post('/tokenize', { messages: 'no' });
    assert.equal(bad.status, 400);
  });

  it('match stats() when idle: the cached prefixes still hold cells, and none of them is load', async () => {
    const scrape = await scrapeAtRest();
    assert.equal(scrape.stats.queued, 0);
    assert.equal(scrape.stats.running + scrape.stats.programs, 0);
    checkAgainst(scrape);
    assert.ok(scrape.stats.cachedPrefixes > 0 && scrape.stats.cellsUsed > 0);
    // vLLM's kv_cache_usage_perc leaves out cached blocks nobody references; so does ours.
    assert.equal(gauge(scrape.families, 'llamabranch:kv_cache_usage_perc'), 0);
  });
});
