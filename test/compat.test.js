'use strict';

// Programs written in the reference's call patterns (test/compat/*.js, our own code) run
// unchanged as child processes; each prints one JSON object whose contents are checked here.

const assert = require('node:assert/strict');
const path = require('node:path');
const { execFile } = require('node:child_process');
const { MODEL } = require('./helpers');

function runProgram(name, env = {}) {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [path.join(__dirname, 'compat', name)],
      { env: { ...process.env, LLAMA_TEST_MODEL: MODEL, ...env }, timeout: 240000, maxBuffer: 16 << 20 },
      (err, stdout, stderr) => {
        const line = stdout.trim().split('\n').pop();
        if (err) return reject(new Error(`${name} failed: ${err.message}\n${line}\n${stderr}`));
        resolve(JSON.parse(line));
      },
    );
  });
}

// The suites of the reference's own integration test (shared/spec/js-api.md §3.3), entered the
// way its file enters: through `loadBinary().createContext`, and through the package's
// `createContext`. A facade change that breaks either way in fails here.
describe('compatibility: the reference integration suites (test/compat/integration.js)', function () {
  this.timeout(600000);
  const results = {};

  for (const entry of ['loadBinary', 'createContext']) {
    it(`every suite passes entered through ${entry === 'loadBinary' ? 'loadBinary().createContext' : 'createContext'}`, async function () {
      const r = await runProgram('integration.js', { LLAMA_COMPAT_ENTRY: entry });
      assert.equal(r.entry, entry);
      assert.equal(r.failed, undefined);
      results[entry] = r;
      // Each suite of §3.3 but the two model-quality ones contributed its checks.
      for (const suite of [
        'createContext',
        'Core API',
        'KV Cache',
        'Metrics',
        'Tokenizer',
        'chat_in / chat_out',
        'Multi-Sequence KV',
        'Grammar Sampling',
        'Branch.prefill Multi-Turn',
        'Warm Multi-Turn Recall',
        'Branch.steer',
        'nBatch Ablation',
        'Determinism',
        'decodeAndCapture',
        'BranchStore',
        'PPL Sanity',
        'Commit Rollback',
        'Async Rejection',
        'Empty Input Edge Cases',
        'jsonSchemaToGrammar',
        'Disposed During Async',
        'Async Iterator',
        'Embeddings',
      ])
        assert.ok(
          r.checks.some((c) => c.startsWith(`${suite}: `)),
          `suite ${suite} ran`,
        );
      assert.ok(r.passed >= 120, `${r.passed} checks passed`);
    });
  }

  it('both ways in run the same checks', function () {
    assert.ok(results.loadBinary && results.createContext, 'both ways ran (the two tests above)');
    assert.deepEqual(results.loadBinary.checks, results.createContext.checks);
  });
});

describe('compatibility: programs in the reference style run unchanged', function () {
  this.timeout(300000);

  it('un-awaited commits, store.commit, prune and retainOnly followed by sync calls', async function () {
    const r = await runProgram('unawaited.js');
    assert.ok(r.text.trim().length > 0, 'generated text');
    assert.equal(r.afterLoop, r.promptLength + 6, 'the position read after un-awaited commits counts all of them');
    assert.deepEqual(r.positions, [r.afterLoop + 1, r.afterLoop + 1], 'store.commit ran before the getters');
    assert.equal(r.refork, 1, 'the un-awaited prune freed sequence 1 before the next fork');
    assert.deepEqual(r.survivors, { root: false, again: true, available: 3 });
    assert.equal(r.kv, r.afterLoop, 'the KV of sequence 0 ends where the root is');
  });

  it('ctx.jsonSchemaToGrammar and the sync twins', async function () {
    const r = await runProgram('sync-twins.js');
    assert.equal(r.sameGrammar, true);
    assert.equal(r.promptHasUser, true);
    assert.equal(typeof JSON.parse(r.json).answer, 'number', `grammar-constrained output: ${r.json}`);
    assert.equal(r.afterPruneSync, true);
    assert.equal(r.childDisposed, true);
    assert.equal(r.spareLive, true);
    assert.equal(r.liveLeases, 2, 'root and spare hold leases; the pruned subtree released its own');
  });

  it('explicit sequence ids: an id past nSeqMax names the option to raise', async function () {
    const r = await runProgram('seq-ids.js');
    assert.equal(r.refused.code, 'ERR_INVALID_ARG');
    assert.match(r.refused.message, /nSeqMax/);
    assert.match(r.refused.message, /larger nSeqMax|nSeqMax = 1/);
    assert.deepEqual(r.forks, [1, 2]);
  });

  it('best-of-N with a baseline created before its prefix is copied in', async function () {
    const r = await runProgram('best-of-n.js');
    assert.ok(r.baseline.text.trim().length > 0, 'the baseline generated');
    assert.ok(r.baseline.ppl >= 1 && r.baseline.ppl < 1000, `baseline perplexity ${r.baseline.ppl}`);
    assert.equal(r.candidates.length, 3);
    for (const c of r.candidates) {
      assert.ok(c.text.length > 0);
      assert.ok(c.ppl >= 1 && c.ppl < 1000, `candidate perplexity ${c.ppl}`);
    }
    // The program pruned every candidate but its best without awaiting: exactly the one with the
    // lowest perplexity (found here) is alive, and the pruned ones' leases are free already.
    const lowest = r.candidates.findIndex((c) => c.ppl === Math.min(...r.candidates.map((x) => x.ppl)));
    assert.deepEqual(
      r.kept,
      r.candidates.map((_, i) => i === lowest),
    );
    assert.equal(r.available, 5 - 3, 'nSeqMax 5 minus root, baseline and the kept candidate');
  });

  it('speculative decoding with un-awaited draft commits', async function () {
    const r = await runProgram('speculative.js');
    assert.ok(r.drafted > 0);
    assert.ok(r.text.trim().length > 0);
    // Every un-awaited commit on the main branch counted, none of the drafts' did, and every
    // draft's lease came back after its un-awaited prune.
    assert.equal(
      r.position,
      r.promptLength + r.accepted + r.ownTokens,
      'main advanced by exactly its accepted and own tokens',
    );
    assert.ok(r.accepted + r.ownTokens > 0, 'the main branch advanced');
    assert.equal(r.available, 4 - 1, 'nSeqMax 4 minus the main branch');
    assert.ok(Number.isFinite(r.ppl));
  });

  it('a steer loop: a banned token never comes back until the steer is cleared', async function () {
    const r = await runProgram('steer.js');
    assert.equal(r.steered.length, 5);
    assert.ok(!r.steered.includes(r.unsteered), 'the banned token was never produced');
    assert.equal(r.position, r.promptLength + 5);
    assert.ok(r.text.trim().length > 0);
  });
});
