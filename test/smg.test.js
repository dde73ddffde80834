'use strict';

// Three `llama-branch serve --grpc-port` replicas behind the real SMG (Shepherd Model Gateway,
// PyPI `smg` 1.13.0, installed by `npm run setup`) over gRPC: SMG detects the vLLM engine
// service, fetches the tokenizer from a worker (GetTokenizer: built from the GGUF) and tokenizes
// as llama.cpp does, subscribes to each replica's KV events and routes a session's next turn to
// the replica holding its prefix (its `event_hit` count), also once that replica's cache is
// full (a warm cache is not overload); the `openai` client streams through it;
// a client gone mid-stream is aborted on the replica; a killed replica leaves the rest serving.
// Run by scripts/test.js as its own step. Outside CI a machine without smg skips with the reason;
// in CI (CI set) it fails.

const assert = require('node:assert/strict');
const OpenAI = require('openai');
const { startServer, stopServer, waitFor } = require('./serve-helpers');
const { freePort } = require('../bench/common');
const { smgCommand, startSmg, smgTokenize, smgBranchCount } = require('../bench/smg');

const MODEL_NAME = 'gemma-3-270m-q4_k_m';
const REPLICA_ARGS = ['--ctx-size', '2048', '--threads', '1', '--parallel', '2', '--no-ui'];

const tokenize = (smg, prompt) => smgTokenize(smg.url, MODEL_NAME, prompt);

/** SMG's count of event-driven routing decisions that found a worker holding the prefix. */
const eventHits = (smg) => smgBranchCount(smg, 'event_hit');

const healthOf = async (r) => (await fetch(`${r.url}/health`)).json();

/**
 * Sends `prompt` through SMG as a completion and says which of `replicas` served it: its index,
 * the tokens it prefilled for it and the KV cells it holds after.
 */
async function served(client, replicas, prompt) {
  const before = await Promise.all(replicas.map(healthOf));
  await client.completions.create({ model: MODEL_NAME, prompt, max_tokens: 2, temperature: 0 });
  const after = await Promise.all(replicas.map(healthOf));
  const moved = after.flatMap((h, i) => (h.completed - before[i].completed === 1 ? [i] : []));
  assert.equal(moved.length, 1, 'one replica served the request');
  const [i] = moved;
  return { i, prefilled: after[i].prefilledTokens - before[i].prefilledTokens, cellsUsed: after[i].cellsUsed };
}

describe('replicas behind SMG over gRPC (exact, KV-event routing)', function () {
  this.timeout(300000);
  const command = smgCommand();
  let replicas = [];
  let smg;
  if (!command && !process.env.CI) {
    it('not run here: smg is not installed (`npm run setup` installs it from PyPI)', () =>
      assert.equal(smgCommand(), null));
    return;
  }

  before(async function () {
    if (!command) throw new Error('smg is not installed: CI runs `node scripts/setup.js --system`');
    replicas = await Promise.all(
      [0, 1, 2].map(async () => {
        const grpcPort = await freePort();
        const server = await startServer([...REPLICA_ARGS, '--grpc-port', String(grpcPort)]);
        return { ...server, grpc: `grpc://127.0.0.1:${grpcPort}` };
      }),
    );
    smg = await startSmg(
      command,
      replicas.map((r) => r.grpc),
      // GetLoads polled every second (10 by default): the overload test sees a poll at once.
      { tokenizerModel: MODEL_NAME, extra: ['--load-monitor-interval', '1'] },
    );
  });

  after(async () => {
    if (smg) await stopServer(smg.child);
    for (const r of replicas) await stopServer(r.child);
  });

  it("registers the replicas as vLLM gRPC workers and tokenizes as the replicas' llama.cpp does", async () => {
    const { workers } = await (await fetch(`${smg.url}/workers`)).json();
    for (const w of workers) {
      assert.equal(w.runtime_type, 'vllm', JSON.stringify(w));
      assert.equal(w.connection_mode, 'grpc');
      assert.equal(w.model_id, MODEL_NAME);
    }
    for (const text of ['The capital of France is', '  two spaces,\n\nnew lines\tand a tab', 'naïve café 日本語 🙂']) {
      const ours = await (
        await fetch(`${replicas[0].url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: text }) })
      ).json();
      assert.deepEqual(
        (await tokenize(smg, text)).tokens,
        ours.tokens.slice(1),
        `${JSON.stringify(text)} (ours after its BOS)`,
      );
    }
  });

  it('streams through the openai client, and routes each session back to the replica holding its prefix', async () => {
    const client = new OpenAI({ baseURL: `${smg.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    const stream = await client.chat.completions.create({
      model: MODEL_NAME,
      messages: [{ role: 'user', content: 'Name three colors.' }],
      max_tokens: 6,
      temperature: 0,
      stream: true,
    });
    let chunks = 0;
    for await (const chunk of stream) chunks += chunk.choices.length;
    assert.ok(chunks >= 3, `${chunks} chunks`);

    const sessions = ['shipping parcels', 'baking bread', 'repairing bicycles'].map(
      (topic) =>
        `You are a helpful assistant about ${topic}. ${`Always answer about ${topic} in one short sentence. `.repeat(8)}`,
    );
    const first = [];
    for (const s of sessions) first.push((await served(client, replicas, `${s}Question: what is first?`)).i);
    await new Promise((r) => setTimeout(r, 500)); // the KV event batches reach SMG
    const hits = await eventHits(smg);
    for (const [i, s] of sessions.entries()) {
      const again = await served(client, replicas, `${s}Question: what comes next?`);
      assert.equal(again.i, first[i], `session ${i} went back to the replica holding its prefix`);
    }
    assert.ok((await eventHits(smg)) >= hits + sessions.length, 'each follow-up was an event_hit');
  });

  it("keeps routing a session to its replica once that replica's cache fills past SMG's overload mark", async () => {
    // SMG 1.13 leaves a worker out of routing while GetLoads says token_usage >= 0.8. A warm
    // cache is not load: a session whose ~1,750-token prefix fills 85 % of a replica's 2,048
    // cells, idle, must come back to that replica and reuse the prefix.
    const client = new OpenAI({ baseURL: `${smg.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    const line = 'The warehouse ledger lists each crate by its aisle, its shelf and the day it arrived. ';
    const prefix = line.repeat(95);
    const ours = await (
      await fetch(`${replicas[0].url}/tokenize`, { method: 'POST', body: JSON.stringify({ prompt: prefix }) })
    ).json();
    assert.ok(ours.tokens.length > 0.8 * 2048 && ours.tokens.length < 1900, `${ours.tokens.length} prefix tokens`);
    const first = await served(client, replicas, `${prefix}Question: which aisle?`);
    assert.ok(first.cellsUsed >= 0.8 * 2048, `its cache holds ${first.cellsUsed} of 2,048 cells`);
    await new Promise((r) => setTimeout(r, 3000)); // three GetLoads polls of the replica, idle with its cache full
    // The next turn extends the first prompt (a prefix past Gemma 3's sliding window is reused
    // whole, never forked part-way).
    const again = await served(client, replicas, `${prefix}Question: which aisle? And which shelf?`);
    assert.equal(again.i, first.i, 'the follow-up went back to the replica holding its prefix');
    assert.ok(again.prefilled < 100, `the follow-up prefilled ${again.prefilled} tokens: its prefix was reused`);
  });

  it('aborts a request on its replica when the client leaves; a killed replica leaves the rest serving', async () => {
    const client = new OpenAI({ baseURL: `${smg.url}/v1`, apiKey: 'unused', maxRetries: 0, timeout: 120000 });
    const before = await Promise.all(replicas.map(healthOf));
    const controller = new AbortController();
    const stream = await client.completions.create(
      { model: MODEL_NAME, prompt: 'Once upon a time, in a land far away,', max_tokens: 400, stream: true },
      { signal: controller.signal },
    );
    let seen = 0;
    try {
      for await (const chunk of stream) if (++seen === 3 && chunk) controller.abort();
    } catch (e) {
      assert.match(String(e.name || e), /Abort/);
    }
    assert.equal(seen, 3, 'the client stopped reading after 3 chunks');
    await waitFor(
      async () => (await Promise.all(replicas.map(healthOf))).every((h) => h.running === 0),
      'the replica to end the aborted request',
      30000,
    );
    const after = await Promise.all(replicas.map(healthOf));
    const generated = after.reduce((n, h, i) => n + h.generatedTokens - before[i].generatedTokens, 0);
    assert.ok(generated < 400, `the replica stopped after ${generated} of 400 tokens`);

    replicas[1].child.kill('SIGKILL');
    await waitFor(
      async () => {
        const { workers } = await (await fetch(`${smg.url}/workers`)).json();
        return !workers.some((w) => w.url === replicas[1].grpc && w.is_healthy);
      },
      'smg to mark the killed replica unhealthy',
      60000,
    );
    for (let i = 0; i < 4; i++) {
      const r = await client.completions.create({ model: MODEL_NAME, prompt: `After the kill ${i}:`, max_tokens: 2 });
      assert.equal(r.choices.length, 1);
    }
  });
});
