'use strict';

// `serve --kv-events`: the prefix cache of two servers published as KV events in vLLM's format,
// consumed by NVIDIA Dynamo's KV indexer (ai-dynamo-runtime 1.6.1's RadixTree, through pyzmq and
// msgpack: test/kv-consumer.py), a consumer from the field, not a decoder written here. The
// consumer joins late (after the first server filled its cache: the replay), a small context makes
// the cache evict (BlockRemoved), and then: the blocks Dynamo believes each server holds are the
// whole 16-token blocks of the prefixes its cache holds, and `find_matches` for a held prompt
// names the server holding it. Outside CI a machine without the Python packages skips with the
// reason; in CI (CI set) it fails.

const assert = require('node:assert/strict');
const path = require('node:path');
const readline = require('node:readline');
const { spawn, spawnSync } = require('node:child_process');
const { createServer } = require('..');
const { blockHashes } = require('../lib/server/kv-events');
const { MODEL } = require('./helpers');
const { waitFor } = require('./serve-helpers');
const { testPython } = require('../scripts/python');

const CONSUMER = path.join(__dirname, 'kv-consumer.py');
const PYTHON = testPython() || 'python3';

function consumerMissing() {
  const probe = spawnSync(PYTHON, ['-c', 'import zmq, msgpack; from dynamo._core import RadixTree'], {
    encoding: 'utf8',
  });
  return probe.status === 0
    ? null
    : (probe.stderr || probe.error || 'no python3 (npm run setup installs the consumer)').toString().trim();
}

/** The consumer process: `ask(command)` writes one JSON line and resolves with its answer. */
function startConsumer(endpoints) {
  const child = spawn(PYTHON, [CONSUMER, ...endpoints], { stdio: ['pipe', 'pipe', 'pipe'] });
  let stderr = '';
  child.stderr.on('data', (d) => (stderr += d));
  const lines = readline.createInterface({ input: child.stdout });
  const waiting = [];
  lines.on('line', (line) => waiting.shift()?.(JSON.parse(line)));
  const next = () => new Promise((resolve) => waiting.push(resolve));
  const ready = next();
  return {
    child,
    stderr: () => stderr,
    ready,
    ask(command) {
      const answer = next();
      child.stdin.write(`${JSON.stringify(command)}\n`);
      return answer;
    },
  };
}

/** The whole blocks of every prefix `server`'s cache holds, by hash (decimal strings). */
function heldBlocks(server) {
  const hashes = new Set();
  for (const p of server.scheduler.cachedPrefixes()) for (const h of blockHashes(p.tokens)) hashes.add(h.toString());
  return hashes;
}

describe('KV events (serve --kv-events) read by Dynamo’s indexer', function () {
  this.timeout(300000);
  const missing = consumerMissing();
  const servers = [];
  let consumer;
  // CI installs the consumer (scripts/setup.js --system), so there it must run. Elsewhere the
  // title says why it does not run, and the test checks that reason (as test/systemone.test.js does).
  if (missing && !process.env.CI) {
    it(`not run here: ${missing.split('\n').pop()} (npm run setup installs ai-dynamo-runtime, pyzmq, msgpack)`, function () {
      assert.ok(consumerMissing());
    });
    return;
  }

  before(async function () {
    if (missing) throw new Error(`the KV event consumer cannot run (npm run setup installs it): ${missing}`);
    for (let i = 0; i < 2; i++) {
      // A small context: the workload below makes the cache evict.
      const server = await createServer({
        modelPath: MODEL,
        nCtx: 512,
        nThreads: 2,
        parallel: 1,
        ui: false,
        kvEvents: 'tcp://127.0.0.1:0',
      });
      await server.listen(0, '127.0.0.1');
      servers.push(server);
    }
  });

  after(async () => {
    if (consumer) consumer.child.kill();
    for (const s of servers) await s.close();
  });

  const complete = (server, prompt) => server.scheduler.generate({ prompt, maxTokens: 2, temperature: 0 });

  it('the blocks Dynamo believes each server holds are those of its cache; find_matches names the holder', async () => {
    const [a, b] = servers;
    assert.match(a.kvEvents.topic, /^kv@.+@gemma-3-270m-q4_k_m$/);
    const topics = [
      'The ledger of the harbour office',
      'A field guide to northern mosses',
      'Notes on the repair of clocks',
    ];
    const text = (topic, i) =>
      `${topic}, part ${i}. ${'It lists every entry by date and place, with a short remark. '.repeat(9)}`;
    // Before the consumer joins: it learns this from the replay.
    await complete(a, text(topics[0], 0));

    consumer = startConsumer([`1=${a.kvEvents.address}`, `2=${b.kvEvents.address}`]);
    await consumer.ready;
    await waitFor(
      async () => {
        const { seq } = await consumer.ask({ cmd: 'state' });
        return seq['1'] !== undefined && seq['2'] !== undefined;
      },
      'the replay from both servers',
      30000,
    );

    // Live: more prompts than 512 cells hold on the first server (evictions), one on the second.
    for (let i = 1; i < 6; i++) await complete(a, text(topics[i % 2], i));
    await complete(b, text(topics[2], 0));
    assert.ok(a.scheduler.stats().evictions > 0, 'the first server evicted cached prefixes');

    const state = await waitFor(
      async () => {
        const s = await consumer.ask({ cmd: 'state' });
        const caughtUp = servers.every((srv, i) => s.seq[String(i + 1)] === srv.kvEvents.publisher.sequence);
        return caughtUp && s;
      },
      'the consumer to reach the last sequence number of both servers',
      30000,
    );
    assert.deepEqual(state.errors, [], 'Dynamo applied every event');
    servers.forEach((srv, i) => {
      const expected = heldBlocks(srv);
      assert.ok(expected.size > 0);
      assert.deepEqual(new Set(state.blocks[String(i + 1)] || []), expected, `server ${i + 1}'s blocks`);
    });

    // find_matches on a prompt each server holds names that server, with all its whole blocks.
    for (const [i, srv] of servers.entries()) {
      const held = srv.scheduler.cachedPrefixes().sort((x, y) => y.tokens.length - x.tokens.length)[0];
      const { scores } = await consumer.ask({ cmd: 'match', tokens: held.tokens });
      const mine = String(i + 1);
      const other = String(2 - i);
      assert.equal(scores[mine], Math.floor(held.tokens.length / 16), JSON.stringify(scores));
      assert.ok((scores[other] || 0) < scores[mine], JSON.stringify(scores));
    }
  });
});
