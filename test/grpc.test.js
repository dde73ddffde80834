'use strict';

// `serve --grpc-port`: the gRPC worker for SMG (lib/server/grpc.js) driven by a real gRPC client
// (@grpc/grpc-js over loopback HTTP/2) with SMG's vLLM engine service: metadata, generation
// streamed and whole (greedy: the same tokens as the scheduler's own), stop token ids, Abort,
// bad requests answered with INVALID_ARGUMENT (and the worker serving on), the KV event stream
// (snapshot from 0, live batches numbered one by one, resume, OUT_OF_RANGE) and the tokenizer zip,
// whose tokenizer.json Python's zipfile and json read. SMG itself in front of replicas is
// test/smg.test.js.

const assert = require('node:assert/strict');
const { createHash } = require('node:crypto');
const { spawnSync } = require('node:child_process');
const grpc = require('@grpc/grpc-js');
const protoLoader = require('@grpc/proto-loader');
const { createServer } = require('..');
const { PROTO } = require('../lib/server/grpc');
const { blockHashes } = require('../lib/server/kv-blocks');
const { MODEL } = require('./helpers');

const definition = protoLoader.loadSync(PROTO, { keepCase: true, longs: String, defaults: true, oneofs: true });
const Engine = /** @type {any} */ (grpc.loadPackageDefinition(definition)).vllm.grpc.engine.VllmEngine;

/** A unary call as a promise. */
const unary = (client, method, req = {}) =>
  new Promise((resolve, reject) => client[method](req, (err, res) => (err ? reject(err) : resolve(res))));

/** A server stream's messages, until it ends (or `until(messages)` says enough: the call is cancelled). */
function collect(call, until = () => false) {
  return new Promise((resolve, reject) => {
    const messages = [];
    call.on('data', (m) => {
      messages.push(m);
      if (until(messages)) {
        call.cancel();
        resolve(messages);
      }
    });
    call.on('end', () => resolve(messages));
    call.on('error', (e) => (e.code === grpc.status.CANCELLED ? resolve(messages) : reject(e)));
  });
}

describe('serve --grpc-port: the gRPC worker for SMG (real grpc-js client)', function () {
  this.timeout(120000);
  let server;
  let client;
  let prompt;

  before(async () => {
    server = await createServer({ modelPath: MODEL, nCtx: 2048, parallel: 2, grpcPort: 0 });
    client = new Engine(`127.0.0.1:${server.grpc.port}`, grpc.credentials.createInsecure());
    prompt = Array.from(await server.ctx.tokenize('The history of the printing press in Europe begins', false));
    // Past two whole blocks, so that the prefix cache publishes some.
    prompt = [
      ...prompt,
      ...Array.from(
        await server.ctx.tokenize(
          ' with movable type, paper, ink and a press adapted from wine presses; within fifty years, presses ran in more than two hundred towns across the continent',
          false,
        ),
      ),
    ];
    assert.ok(prompt.length >= 32, `${prompt.length} prompt tokens`);
  });

  after(async () => {
    client?.close();
    await server?.close();
  });

  const generate = (req, until) => collect(client.Generate({ request_id: `r-${Math.random()}`, ...req }), until);
  const greedy = (maxTokens, extra = {}) => ({
    temperature: 0,
    max_tokens: maxTokens,
    stop: [],
    stop_token_ids: [],
    ...extra,
  });

  it('answers HealthCheck, GetModelInfo, GetServerInfo and GetLoads as SMG reads them', async () => {
    assert.deepEqual(await unary(client, 'HealthCheck'), { healthy: true, message: 'ok' });
    const info = await unary(client, 'GetModelInfo');
    assert.equal(info.served_model_name, 'gemma-3-270m-q4_k_m');
    assert.equal(info.vocab_size, server.ctx.vocabSize);
    assert.equal(info.max_context_length, 2048);
    assert.deepEqual(info.eos_token_ids, [1]);
    assert.equal(info.bos_token_id, 2);
    assert.match(info.model_path, /\.gguf$/); // not a tokenizer source: SMG asks GetTokenizer
    const serverInfo = await unary(client, 'GetServerInfo');
    assert.equal(serverInfo.block_size, 16);
    assert.equal(serverInfo.max_num_seqs, 2);
    const loads = await unary(client, 'GetLoads', { include: ['core'] });
    assert.equal(loads.dp_rank_count, 1);
    assert.equal(loads.loads[0].max_total_num_tokens, 2048);
  });

  it('GetLoads counts the cells running work holds: a warm prefix cache is not load', async () => {
    const loadNow = async () => (await unary(client, 'GetLoads', { include: ['core'] })).loads[0];
    let during = null;
    await generate({ tokenized: { input_ids: prompt }, sampling_params: greedy(64), stream: true }, (messages) => {
      if (messages.length === 8) loadNow().then((load) => (during = { load, stats: server.scheduler.stats() }));
      return false;
    });
    assert.ok(during, 'GetLoads answered while the request ran');
    assert.ok(during.load.num_used_tokens >= prompt.length, `${during.load.num_used_tokens} cells in use while it ran`);
    assert.ok(during.load.num_used_tokens <= during.stats.cellsUsed);
    const stats = server.scheduler.stats();
    assert.ok(stats.cellsUsed >= prompt.length, `the prompt stays cached: ${stats.cellsUsed} cells`);
    assert.equal(stats.cellsInUse, 0, 'nothing runs: every cached cell is reclaimable');
    const idle = await loadNow();
    assert.equal(idle.num_used_tokens, 0);
    assert.equal(idle.token_usage, 0, "SMG's overload veto reads token_usage: a warm cache must not trip it");
  });

  it('streams the new tokens chunk by chunk, then one complete; whole, the same tokens at once', async () => {
    const streamed = await generate({ tokenized: { input_ids: prompt }, sampling_params: greedy(6), stream: true });
    const chunks = streamed.filter((m) => m.response === 'chunk').map((m) => m.chunk);
    const [done] = streamed.filter((m) => m.response === 'complete').map((m) => m.complete);
    assert.equal(streamed.at(-1).response, 'complete');
    assert.equal(chunks.length, 6);
    assert.equal(done.finish_reason, 'length');
    assert.equal(done.prompt_tokens, prompt.length);
    assert.equal(done.completion_tokens, 6);
    const tokens = chunks.flatMap((c) => c.token_ids);

    const whole = await generate({ tokenized: { input_ids: prompt }, sampling_params: greedy(6), stream: false });
    assert.equal(whole.length, 1);
    assert.deepEqual(whole[0].complete.output_ids, tokens);
    assert.ok(
      whole[0].complete.cached_tokens >= 16,
      `the repeated prompt came from the cache (${whole[0].complete.cached_tokens})`,
    );
    const own = await server.scheduler.generate({ tokens: prompt, params: { temperature: 0 }, maxTokens: 6 });
    assert.deepEqual(own.choices[0].tokens, tokens, "the scheduler's own greedy tokens");
  });

  it('stops at a stop token id (matched_token_id) and aborts a request by its id', async () => {
    const whole = await generate({ tokenized: { input_ids: prompt }, sampling_params: greedy(6) });
    const tokens = whole[0].complete.output_ids;
    const stopped = await generate({
      tokenized: { input_ids: prompt },
      sampling_params: greedy(6, { stop_token_ids: [tokens[2]] }),
    });
    const done = stopped[0].complete;
    assert.deepEqual(done.output_ids, tokens.slice(0, tokens.indexOf(tokens[2]) + 1));
    assert.equal(done.finish_reason, 'stop');
    assert.equal(done.matched_token_id, tokens[2]);

    const call = client.Generate({
      request_id: 'to-abort',
      tokenized: { input_ids: prompt },
      sampling_params: greedy(400),
      stream: true,
    });
    let aborted = false;
    const messages = await collect(call, () => {
      if (!aborted) {
        aborted = true;
        unary(client, 'Abort', { request_ids: ['to-abort'] });
      }
      return false;
    });
    const complete = messages.at(-1).complete;
    assert.equal(complete.finish_reason, 'abort');
    assert.ok(messages.length - 1 < 400, `${messages.length - 1} chunks before the abort took`);
  });

  it('answers bad requests with INVALID_ARGUMENT saying what to change, and serves on', async () => {
    const refuse = async (req, pattern) => {
      await assert.rejects(generate(req), (e) => e.code === grpc.status.INVALID_ARGUMENT && pattern.test(e.details));
    };
    await refuse({ tokenized: { input_ids: [] }, sampling_params: greedy(2) }, /input_ids is empty/);
    await refuse({ sampling_params: greedy(2) }, /needs tokenized.input_ids or text/);
    await refuse(
      { tokenized: { input_ids: [5, server.ctx.vocabSize + 7] }, sampling_params: greedy(2) },
      /token ids in \[0, 262144\)/,
    );
    await refuse(
      { tokenized: { input_ids: prompt }, sampling_params: greedy(2, { logprobs: 2 }) },
      /logprobs are not served/,
    );
    await refuse({ tokenized: { input_ids: prompt }, sampling_params: greedy(2, { regex: 'a+' }) }, /regex/);
    await refuse(
      { tokenized: { input_ids: prompt }, sampling_params: greedy(2, { stop_token_ids: [1], n: 2 }) },
      /n > 1/,
    );
    assert.equal((await unary(client, 'HealthCheck')).healthy, true);
    const ok = await generate({ text: 'Hello', sampling_params: greedy(2) });
    assert.equal(ok[0].complete.completion_tokens, 2);
  });

  it('streams KV events: the held blocks from 0, then live batches one by one; resume and OUT_OF_RANGE', async () => {
    const snapshot = await collect(client.SubscribeKvEvents({ start_sequence_number: 0 }), (m) => m.length === 1);
    const [first] = snapshot;
    assert.equal(first.events[0].data, 'cleared');
    const stored = first.events.slice(1).map((e) => e.stored.blocks[0]);
    const held = blockHashes(prompt).map(String);
    for (const hash of held.slice(0, 2))
      assert.ok(
        stored.some((b) => b.block_hash === hash),
        `block ${hash} in the snapshot`,
      );
    const firstBlock = stored.find((b) => b.block_hash === held[0]);
    assert.deepEqual(firstBlock.token_ids, prompt.slice(0, 16));
    assert.equal(firstBlock.block_size, 16);
    const at = Number(first.sequence_number);

    // Live: a new prompt's blocks arrive in the next batch; a subscriber resuming at `at` gets it too.
    const live = collect(client.SubscribeKvEvents({ start_sequence_number: 0 }), (m) => m.length === 2);
    await new Promise((r) => setTimeout(r, 200));
    const other = Array.from(
      await server.ctx.tokenize(`A different text entirely, ${'about rivers and their deltas, '.repeat(4)}`, false),
    );
    await generate({ tokenized: { input_ids: other }, sampling_params: greedy(1) });
    const [, next] = await live;
    assert.equal(Number(next.sequence_number), at + 1);
    const otherHashes = blockHashes(other).map(String);
    const nextStored = next.events
      .filter((e) => e.data === 'stored')
      .flatMap((e) => e.stored.blocks.map((b) => b.block_hash));
    assert.ok(
      otherHashes.every((h) => nextStored.includes(h)),
      'the new blocks in the live batch',
    );
    const resumed = await collect(client.SubscribeKvEvents({ start_sequence_number: at }), (m) => m.length === 1);
    assert.equal(Number(resumed[0].sequence_number), at + 1);

    await assert.rejects(
      collect(client.SubscribeKvEvents({ start_sequence_number: at + 100 })),
      (e) => e.code === grpc.status.OUT_OF_RANGE && /subscribe from 0/.test(e.details),
    );
  });

  it("hands out the model's tokenizer as a zip of Hugging Face files (sha256 on the last chunk)", async () => {
    const chunks = await collect(client.GetTokenizer({}));
    assert.ok(chunks.length > 1, `${chunks.length} chunks`);
    const zip = Buffer.concat(chunks.map((c) => c.data));
    assert.equal(chunks.at(-1).sha256, createHash('sha256').update(zip).digest('hex'));
    assert.ok(chunks.slice(0, -1).every((c) => c.sha256 === ''));
    const read = spawnSync(
      'python3',
      [
        '-c',
        'import io,json,sys,zipfile; z=zipfile.ZipFile(io.BytesIO(sys.stdin.buffer.read())); t=json.loads(z.read("tokenizer.json")); c=json.loads(z.read("tokenizer_config.json")); print(json.dumps([sorted(z.namelist()), t["model"]["type"], len(t["model"]["vocab"]), c["bos_token"], "<start_of_turn>" in c["chat_template"]]))',
      ],
      { input: zip, encoding: 'utf8' },
    );
    assert.equal(read.status, 0, read.stderr);
    assert.deepEqual(JSON.parse(read.stdout), [
      ['tokenizer.json', 'tokenizer_config.json'],
      'BPE',
      server.ctx.vocabSize,
      '<bos>',
      true,
    ]);
  });
});
