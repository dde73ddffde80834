'use strict';

const assert = require('node:assert/strict');
const { Branch, BranchStore, jsonSchemaToGrammar } = require('..');
const { open, rejects, throwsSync, argmax } = require('./helpers');
const { nativeOf } = require('../lib/Context'); // internals, for checks the public API cannot make

describe('Sampling parameters, grammar and determinism', function () {
  let ctx;
  let store;
  let prompt;
  before(async () => {
    ctx = await open({ nSeqMax: 8, nCtx: 2048 });
    store = new BranchStore(ctx);
    prompt = await ctx.tokenize('Once upon a time, in a small village,');
  });
  after(() => ctx && ctx.dispose());
  afterEach(async () => {
    for (const h of nativeOf(ctx)._storeLiveHandles()) nativeOf(ctx)._branchPrune(h);
    await ctx.kvCacheClear();
  });

  async function root(params, text) {
    const tokens = text ? await ctx.tokenize(text) : prompt;
    await ctx.decode(tokens, 0, 0);
    const b = Branch.create(ctx, tokens.length, params);
    b.captureLogits();
    return b;
  }

  /** n samples from the same snapshot (sample() advances the RNG, never the KV). */
  function draws(b, n) {
    return Array.from({ length: n }, () => b.sample());
  }

  async function generate(b, n) {
    const out = [];
    for (let i = 0; i < n; i++) {
      const p = b.produce();
      if (p.isStop) break;
      out.push(p.token);
      await b.commit(p.token);
    }
    return out;
  }

  it('temperature <= 0 and topK 1 are exactly greedy', async () => {
    const greedy = await root({ temperature: 0 });
    const argmaxToken = argmax(greedy.getLogits());
    assert.deepEqual(draws(greedy, 5), Array(5).fill(argmaxToken));
    const k1 = greedy.fork();
    k1.setSamplerParams({ temperature: 1.5, topK: 1, seed: 3 });
    assert.deepEqual(draws(k1, 20), Array(20).fill(argmaxToken));
  });

  it('higher temperature and looser filters spread the distribution', async () => {
    const b = await root({ temperature: 0.2, topK: 0, topP: 1, minP: 0, seed: 11 });
    const cold = new Set(draws(b, 200)).size;
    b.setSamplerParams({ temperature: 2.0, topK: 0, topP: 1, minP: 0, seed: 11 });
    const hot = new Set(draws(b, 200)).size;
    assert.ok(hot > cold * 2, `distinct tokens cold ${cold} vs hot ${hot}`);
    b.setSamplerParams({ temperature: 2.0, topK: 3, seed: 11 });
    assert.ok(new Set(draws(b, 200)).size <= 3, 'topK 3 keeps at most 3 tokens');
    b.setSamplerParams({ temperature: 2.0, topK: 0, topP: 0.5, minP: 0, seed: 11 });
    assert.ok(new Set(draws(b, 200)).size < hot, 'topP 0.5 narrows the set');
    b.setSamplerParams({ temperature: 2.0, topK: 0, topP: 1, minP: 0.3, seed: 11 });
    assert.ok(new Set(draws(b, 200)).size < hot, 'minP 0.3 narrows the set');
    b.setSamplerParams({ temperature: 2.0, topK: 0, topP: 1, minP: 0, seed: 11, advanced: { typicalP: 0.3 } });
    assert.ok(new Set(draws(b, 200)).size < hot, 'typicalP 0.3 narrows the set');
  });

  it('same seed reproduces the same stream; forks diverge after reseeding', async () => {
    const params = { temperature: 1.0, topK: 0, topP: 1, minP: 0, seed: 1234 };
    const a = await root(params);
    const streamA = await generate(a, 12);
    await a.prune();
    await ctx.kvCacheClear();
    const b = await root(params);
    const streamB = await generate(b, 12);
    assert.deepEqual(streamB, streamA, 'same model, prompt, params and seed');
    await b.prune();
    await ctx.kvCacheClear();
    const parent = await root({ ...params, seed: 99 });
    const [x, y, z] = [parent.fork(), parent.fork(), parent.fork()];
    assert.deepEqual(draws(x, 8), draws(y, 8), 'forks share the cloned RNG state until reseeded');
    x.reseedSampler(1);
    y.reseedSampler(2);
    z.reseedSampler(1);
    const sx = draws(x, 30);
    assert.notDeepEqual(sx, draws(y, 30));
    assert.deepEqual(sx, draws(z, 30), 'the same seed reproduces the stream');
    const greedy = parent.fork();
    greedy.setSamplerParams({ temperature: 0 });
    const t = greedy.sample();
    greedy.reseedSampler(5); // no-op on a greedy chain
    assert.equal(greedy.sample(), t);
  });

  it('a large repeat penalty lowers repeats', async () => {
    const text = 'one one one one one one one one one one one one';
    const plain = await root({ temperature: 0 }, text);
    const without = await generate(plain, 20);
    await plain.prune();
    await ctx.kvCacheClear();
    const penalised = await root({ temperature: 0, penalties: { repeat: 2.0, lastN: -1 } }, text);
    const withPenalty = await generate(penalised, 20);
    const repeats = (seq) => seq.length - new Set(seq).size;
    assert.ok(repeats(withPenalty) < repeats(without), `repeats ${repeats(without)} -> ${repeats(withPenalty)}`);
    // frequency and presence penalties run and change the choice away from the repeated token
    await penalised.prune();
    await ctx.kvCacheClear();
    const freq = await root({ temperature: 0, penalties: { frequency: 5, presence: 5, lastN: 64 } }, text);
    const [oneTok] = await ctx.tokenize(' one', false);
    freq.accept(oneTok);
    freq.accept(oneTok);
    assert.notEqual(freq.sample(), oneTok);
  });

  it('mirostat (v1, v2), XTC, DRY and top-n-sigma run and are deterministic under a seed', async () => {
    const variants = [
      { temperature: 0.9, seed: 5, advanced: { mirostat: { mode: 2, tau: 4, eta: 0.1 } } },
      { temperature: 0.9, seed: 5, advanced: { mirostat: { mode: 1, tau: 4, eta: 0.1 } } },
      { temperature: 0.9, seed: 5, advanced: { xtc: { probability: 1, threshold: 0.05 } } },
      { temperature: 0.9, seed: 5, advanced: { dry: { multiplier: 0.8, base: 1.75, allowedLength: 2 } } },
      { temperature: 0.9, seed: 5, advanced: { topNSigma: 1.0 } },
    ];
    for (const params of variants) {
      const runs = [];
      for (let r = 0; r < 2; r++) {
        const b = await root(params);
        runs.push(await generate(b, 8));
        await b.prune();
        await ctx.kvCacheClear();
      }
      assert.ok(runs[0].length > 0);
      assert.deepEqual(runs[1], runs[0], JSON.stringify(params.advanced));
    }
    // XTC with probability 1 removes choices above the threshold (never the last of them)
    const plain = await root({ temperature: 0 });
    const top = plain.sample();
    const base = { temperature: 0.5, seed: 1, topK: 0, topP: 1, minP: 0 };
    plain.setSamplerParams(base);
    const offTop = draws(plain, 50).filter((t) => t === top).length;
    assert.ok(offTop >= 10, `without XTC the top token is drawn often (${offTop} of 50)`);
    plain.setSamplerParams({ ...base, advanced: { xtc: { probability: 1, threshold: 0.01 } } });
    const xtcTop = draws(plain, 50).filter((t) => t === top).length;
    // Same seed and params: a no-op XTC would draw exactly the same tokens.
    assert.ok(xtcTop * 2 <= offTop, `XTC at probability 1 cuts the top token's draws (${offTop} -> ${xtcTop} of 50)`);
  });

  it('logitBias bans and forces tokens and is cloned on fork', async () => {
    const probe = await root({ temperature: 0 });
    const greedy = probe.sample();
    await probe.prune();
    await ctx.kvCacheClear();
    const banned = await root({ temperature: 0, logitBias: [{ token: greedy, bias: -Infinity }] });
    assert.notEqual(banned.sample(), greedy);
    const child = banned.fork();
    assert.notEqual(child.sample(), greedy, 'static bias survives fork');
    child.setSamplerParams({ temperature: 0, logitBias: [{ token: 42, bias: 1000 }] });
    assert.equal(child.sample(), 42);
  });

  it('invalid values are clear errors, not silent clamps', async () => {
    const bad = [
      { temperature: Number.NaN },
      { topK: -1 },
      { topK: 1.5 },
      { topP: 0 },
      { topP: 1.5 },
      { minP: -0.1 },
      { minP: 2 },
      { seed: 1.5 },
      { penalties: { repeat: 0 } },
      { penalties: { lastN: -2 } },
      { advanced: { mirostat: { mode: 3 } } },
      { advanced: { mirostat: { mode: 2, tau: -1 } } },
      { advanced: { typicalP: 0 } },
      { advanced: { xtc: { probability: 2 } } },
      { advanced: { topNSigma: -1 } },
      { advanced: { dry: { base: 0.5 } } },
      { logitBias: [{ token: ctx.vocabSize, bias: 1 }] },
      { logitBias: [{ token: 5, bias: Number.NaN }] },
      { temperature: 'hot' },
    ];
    const b = await root({ temperature: 0 });
    for (const params of bad) {
      throwsSync(() => b.setSamplerParams(params), 'ERR_INVALID_ARG');
      throwsSync(() => Branch.create(ctx, 0, params), 'ERR_INVALID_ARG');
    }
    assert.equal(typeof b.sample(), 'number', 'the branch is still usable');
  });

  it('a GBNF grammar constrains generation and illegal accepts are errors, not aborts', async () => {
    const gbnf = 'root ::= "{" ws "}" ws\nws ::= [ \\t\\n]*';
    const b = await root({ temperature: 0, grammar: gbnf }, 'Output: ');
    let text = '';
    for (let i = 0; i < 10; i++) {
      const p = b.produce();
      if (p.isStop) break;
      text += p.text;
      await b.commit(p.token);
    }
    assert.match(text, /^\{\s*\}\s*$/);
    const [letter] = await ctx.tokenize('x', false);
    throwsSync(() => b.accept(letter), 'ERR_GRAMMAR_REJECTED');
    await rejects(() => b.commit(letter), 'ERR_GRAMMAR_REJECTED');
    throwsSync(() => b.setGrammar('root ::= ['), 'ERR_GRAMMAR');
  });

  it('a JSON-schema grammar yields parseable JSON that matches the schema; forks diverge independently', async () => {
    const schema = {
      type: 'object',
      properties: { name: { type: 'string' }, age: { type: 'integer' } },
      required: ['name', 'age'],
    };
    const grammar = await jsonSchemaToGrammar(schema);
    assert.match(grammar, /root/);
    await rejects(() => jsonSchemaToGrammar('not valid json {{{'), 'ERR_GRAMMAR');
    const b = await root({ temperature: 0, grammar }, 'A JSON object describing a person: ');
    // fork at the first decision point after "{", then steer the two forks apart
    const kids = [b, b.fork()];
    kids[1].setSamplerParams({ temperature: 1.2, seed: 77, grammar });
    const texts = ['', ''];
    const done = [false, false];
    for (let step = 0; step < 60 && done.includes(false); step++) {
      const live = kids.filter((_, i) => !done[i]);
      const produced = store.produce(live);
      const entries = [];
      live.forEach((k, j) => {
        const i = kids.indexOf(k);
        if (produced[j].isStop) done[i] = true;
        else {
          texts[i] += produced[j].text;
          entries.push([k, produced[j].token]);
        }
      });
      if (entries.length) await store.commit(entries);
    }
    for (const t of texts) {
      const obj = JSON.parse(t);
      assert.equal(typeof obj.name, 'string');
      assert.ok(Number.isInteger(obj.age));
    }
    assert.notEqual(texts[1], texts[0], 'the forks diverged: each followed its own sampler within the grammar');
  });

  it('a lazy grammar is unconstrained before its trigger and constrained after', async () => {
    const gbnf = 'root ::= "{" "\\"answer\\"" ":" " "? [0-9] "}"';
    const b = await root({ temperature: 0 }, 'Question: what is two plus two? Reply in JSON.');
    const free = b.sample();
    b.setGrammar(gbnf, { triggerWords: ['{'] });
    assert.equal(b.sample(), free, 'before the trigger nothing is masked');
    const [brace] = await ctx.tokenize('{', false);
    await b.commit(brace);
    let text = '{';
    for (let i = 0; i < 12; i++) {
      const p = b.produce();
      if (p.isStop) break;
      text += p.text;
      await b.commit(p.token);
    }
    assert.match(text, /^\{"answer": ?[0-9]\}$/);
  });
});
