'use strict';

// Branch programs: scheduler.run(async (s) => ...) with append, gen, fork and release, sharing
// the Scheduler's steps with plain requests and other programs. Greedy outputs made in mixed
// batches are checked token by token against plain decoding (teacher-forced ranks), never for
// exact equality (llama.cpp on CPU is not batch-invariant).

const assert = require('node:assert/strict');
const { Scheduler, BranchStore, Branch } = require('..');
const { open, rejects, greedyRanks } = require('./helpers');

const GREEDY = { temperature: 0 };

/** Asserts a greedy output is plain decoding's choice token by token (near-ties may flip). */
async function assertGreedy(ctx, prompt, tokens, label) {
  const ranks = await greedyRanks(ctx, prompt, tokens);
  const top1 = ranks.filter((r) => r === 0).length;
  assert.ok(top1 >= Math.ceil(tokens.length * 0.8), `${label}: ${top1}/${tokens.length} top-1 (ranks ${ranks})`);
  assert.ok(
    ranks.every((r) => r < 3),
    `${label}: ranks ${ranks}`,
  );
}

describe('Scheduler.run: branch programs', function () {
  this.timeout(300000);
  let ctx;
  let store;
  before(async () => {
    ctx = await open({ nCtx: 2048, nSeqMax: 16 });
    store = new BranchStore(ctx);
  });
  after(() => ctx && ctx.dispose());

  let scheduler;
  let steps;
  function start(options = {}) {
    steps = [];
    scheduler = new Scheduler(ctx, { onStep: (s) => steps.push(s), ...options });
    return scheduler;
  }
  afterEach(async () => {
    if (scheduler) await scheduler.close();
    scheduler = null;
  });

  it('gen appends to the line; forks continue from it, decoded in the same steps', async () => {
    const s = start();
    const available = store.available;
    const result = await s.run(async (line) => {
      line.append('The capital of France is');
      const first = await line.gen({ maxTokens: 6, params: GREEDY });
      assert.equal(line.text, `The capital of France is${first.text}`);
      const forks = line.fork(3);
      const seen = forks.map((f) => f.tokens);
      const outs = await Promise.all(forks.map((f) => f.gen({ maxTokens: 8, params: GREEDY })));
      return { first, outs, seen, prefix: line.tokens, forkTexts: forks.map((f) => f.text) };
    });
    assert.equal(result.first.finishReason, 'length');
    assert.equal(result.first.tokens.length, 6);
    const prompt = ctx.tokenizeSync('The capital of France is', true);
    assert.deepEqual(result.prefix, [...prompt, ...result.first.tokens]);
    for (const seen of result.seen) assert.deepEqual(seen, result.prefix, 'a fork starts with its parent tokens');
    await assertGreedy(ctx, prompt, result.first.tokens, 'root gen');
    for (const [i, out] of result.outs.entries()) {
      assert.equal(out.tokens.length, 8);
      assert.ok(result.forkTexts[i].endsWith(out.text));
      await assertGreedy(ctx, result.prefix, out.tokens, `fork ${i}`);
    }
    // The three forks sampled in shared decodes: 3 rows per step while they ran.
    assert.ok(steps.filter((st) => st.rows === 3).length >= 7, `rows per step: ${steps.map((st) => st.rows)}`);
    assert.equal(store.available, available, 'every branch of the program is back');
  });

  it('a program interleaves with plain requests; each output is still greedy', async () => {
    const s = start();
    const plain = s.generate({ prompt: 'Once upon a time, in a small village,', maxTokens: 16, params: GREEDY });
    const program = s.run(async (line) => {
      line.append('The three primary colors are');
      const a = await line.gen({ maxTokens: 10, params: GREEDY });
      line.append(' and');
      const b = await line.gen({ maxTokens: 6, params: GREEDY });
      return { a, b, tokens: line.tokens };
    });
    const other = s.generate({ prompt: 'My favourite food is', maxTokens: 12, params: GREEDY });
    const [p, r1, r2] = await Promise.all([program, plain, other]);
    const colors = ctx.tokenizeSync('The three primary colors are', true);
    await assertGreedy(ctx, colors, p.a.tokens, 'program gen 1');
    const before = p.tokens.slice(0, p.tokens.length - p.b.tokens.length);
    assert.deepEqual(before.slice(0, colors.length + 10), [...colors, ...p.a.tokens]);
    await assertGreedy(ctx, before, p.b.tokens, 'program gen 2');
    await assertGreedy(
      ctx,
      ctx.tokenizeSync('Once upon a time, in a small village,', true),
      r1.choices[0].tokens,
      'plain 1',
    );
    await assertGreedy(ctx, ctx.tokenizeSync('My favourite food is', true), r2.choices[0].tokens, 'plain 2');
    // Program lines and plain requests shared decodes.
    assert.ok(
      steps.some((st) => st.rows === 3),
      `rows per step: ${steps.map((st) => st.rows)}`,
    );
  });

  it('two programs forking 4 ways each advance in the same steps', async () => {
    const s = start();
    const program = (prompt) => async (line) => {
      line.append(prompt);
      const forks = line.fork(4);
      return Promise.all(forks.map((f) => f.gen({ maxTokens: 10, params: { temperature: 0.9 } })));
    };
    const [a, b] = await Promise.all([
      s.run(program('The best way to learn a language is'), { maxBranches: 5, maxCells: 128, seed: 1 }),
      s.run(program('In the morning, the baker'), { maxBranches: 5, maxCells: 128, seed: 2 }),
    ]);
    for (const outs of [a, b]) for (const o of outs) assert.equal(o.tokens.length, 10);
    const eight = steps.filter((st) => st.rows === 8).length;
    assert.ok(eight >= 8, `8 rows in ${eight} steps: ${steps.map((st) => st.rows)}`);
    // Each fork samples with its own seed: the four continuations are not all the same.
    assert.ok(new Set(a.map((o) => o.text)).size > 1, JSON.stringify(a.map((o) => o.text)));
  });

  it('programs sharing a prompt prefill it once: the first fills a cache entry, the others fork it', async () => {
    const s = start();
    const shared = 'You answer questions about the weather in one short sentence, kindly and without lists.';
    const questions = ['\nQ: Is it cold in winter?\nA:', '\nQ: Does it rain in April?\nA:'];
    const outs = await Promise.all(
      questions.map((q) =>
        s.run(async (line) => {
          line.append(shared + q);
          const [a, b] = line.fork(2);
          await Promise.all([a.gen({ maxTokens: 3 }), b.gen({ maxTokens: 3 })]);
          return line.tokens;
        }),
      ),
    );
    let common = 0;
    while (outs[0][common] === outs[1][common]) common++;
    assert.ok(common >= 16, `the prompts share ${common} tokens`);
    const expected = outs[0].length + outs[1].length - common;
    assert.equal(s.stats().prefilledTokens, expected, 'the shared start was prefilled once');
    assert.equal(s.stats().cachedPrefixes, 1);
  });

  it('chat messages start a line: rendered with the template, its end of turn stops gens', async () => {
    const s = start();
    const messages = [{ role: 'user', content: 'Say hello.' }];
    const out = await s.run(async (line) => {
      line.append(messages);
      const [child] = line.fork(1);
      assert.throws(
        () => child.append(messages),
        (e) => e.code === 'ERR_INVALID_ARG' && /assistant turn is open/.test(e.message),
      );
      child.release();
      const reply = await line.gen({ maxTokens: 40, params: GREEDY });
      return { reply, tokens: line.tokens, text: line.text };
    });
    const formatted = ctx.formatChatSync(messages);
    const prompt = ctx.tokenizeSync(formatted.prompt, true);
    assert.deepEqual(out.tokens.slice(0, prompt.length), prompt);
    assert.ok(out.text.startsWith(formatted.prompt));
    for (const stop of formatted.stopTokens.filter((t) => t !== '')) assert.ok(!out.reply.text.includes(stop), stop);
    await assertGreedy(ctx, prompt, out.reply.tokens.slice(0, 8), 'chat reply');
  });

  it('a later turn appends as messages after the reply: the turn separator, then the turn alone', async () => {
    const s = start();
    const first = [{ role: 'user', content: 'Say hello.' }];
    const next = [{ role: 'user', content: 'Now say goodbye.' }];
    const out = await s.run(
      async (line) => {
        line.append(first);
        const reply = await line.gen({ maxTokens: 12, params: GREEDY });
        const before = line.tokens;
        const [twin] = line.fork(1); // forks inherit where the chat stands
        line.append(next);
        twin.append(next);
        const second = await line.gen({ maxTokens: 6, params: GREEDY });
        return {
          reply,
          before,
          after: line.tokens.slice(0, line.tokens.length - second.tokens.length),
          twin: twin.tokens,
        };
      },
      { maxBranches: 2 },
    );
    const separator = ctx.getTurnSeparator();
    const turn = ctx.tokenizeSync(ctx.formatChatSync([{ role: 'system', content: '' }, ...next]).prompt, false);
    assert.ok(separator.length > 0 && turn.length > 0);
    assert.deepEqual(out.after.slice(0, out.before.length), out.before, 'nothing before is re-rendered');
    assert.deepEqual(out.after.slice(-(separator.length + turn.length)), [...separator, ...turn]);
    assert.ok(out.after.length - out.before.length <= separator.length + turn.length);
    assert.deepEqual(out.twin, out.after);

    await rejects(
      () =>
        s.run(async (line) => {
          line.append('Plain text first.');
          line.append(next);
        }),
      'ERR_INVALID_ARG',
      /did not start with chat messages/,
    );
  });

  it('the same seed gives the same program output (a gen seed of -1 is none: the program picks it)', async () => {
    const s = start();
    const program = (genSeed) => async (line) => {
      line.append('Here is a list of fruits:');
      const forks = line.fork(3);
      const params = { temperature: 1, ...(genSeed === undefined ? {} : { seed: genSeed }) };
      return (await Promise.all(forks.map((f) => f.gen({ maxTokens: 8, params })))).map((o) => o.text);
    };
    const first = await s.run(program(undefined), { seed: 42 });
    const second = await s.run(program(undefined), { seed: 42 });
    assert.deepEqual(second, first);
    assert.deepEqual(await s.run(program(-1), { seed: 42 }), first);
  });

  it('a fork taken before more text was appended and decoded still sees only its own text', async () => {
    const s = start();
    const result = await s.run(async (line) => {
      line.append('Numbers: one, two, three,');
      const [child] = line.fork(1);
      const anchor = line.tokens;
      line.append(' four, five,');
      await line.gen({ maxTokens: 4, params: GREEDY }); // the parent goes past the fork point first
      const out = await child.gen({ maxTokens: 6, params: GREEDY }); // forks the parent part-way
      return { anchor, out, childTokens: child.tokens };
    });
    assert.deepEqual(result.childTokens, [...result.anchor, ...result.out.tokens]);
    await assertGreedy(ctx, result.anchor, result.out.tokens, 'child forked part-way');
  });

  it('stop strings and jsonSchema work inside a program', async () => {
    const s = start();
    const schema = {
      type: 'object',
      properties: { name: { type: 'string', maxLength: 12 }, age: { type: 'integer', minimum: 0, maximum: 120 } },
      required: ['name', 'age'],
    };
    const r = await s.run(async (line) => {
      line.append('A person, as JSON: ');
      const json = await line.gen({ maxTokens: 48, jsonSchema: schema, params: GREEDY });
      line.append('\nCount: 1, 2, 3,');
      const counted = await line.gen({ maxTokens: 30, stop: ' 6', params: GREEDY });
      return { json, counted, text: line.text };
    });
    const parsed = JSON.parse(r.json.text);
    assert.equal(typeof parsed.name, 'string');
    assert.ok(Number.isInteger(parsed.age));
    assert.equal(r.counted.finishReason, 'stop');
    // The schema's grammar ended with its gen: the count goes on unconstrained to the stop string.
    assert.match(r.counted.text, / 4, 5,/);
    assert.ok(!r.counted.text.includes(' 6'), r.counted.text);
    assert.ok(r.text.endsWith(r.counted.text));
  });

  it('fork past maxBranches throws ERR_TOO_MANY_BRANCHES at once; release makes room', async () => {
    const s = start();
    await s.run(
      async (line) => {
        line.append('Hello there');
        const forks = line.fork(2); // 3 lines
        assert.throws(
          () => line.fork(1),
          (e) => e.code === 'ERR_TOO_MANY_BRANCHES' && /maxBranches 3/.test(e.message),
        );
        await forks[0].gen({ maxTokens: 2 });
        forks[0].release();
        assert.equal(forks[0].released, true);
        await rejects(() => forks[0].gen(), 'ERR_PROGRAM_STATE');
        const [again] = line.fork(1); // a fork after a queued free
        return again.gen({ maxTokens: 3 });
      },
      { maxBranches: 3 },
    );
  });

  it('a program that throws frees every branch and rejects with its error', async () => {
    const s = start();
    const available = store.available;
    await assert.rejects(
      s.run(
        async (line) => {
          line.append('Once upon a time');
          const forks = line.fork(3);
          await Promise.all(forks.map((f) => f.gen({ maxTokens: 4 })));
          line.fork(1)[0].append(' more'); // never generated: still freed
          throw new Error('the program gives up');
        },
        { maxBranches: 5 },
      ),
      /the program gives up/,
    );
    assert.equal(store.available, available);
    assert.equal(s.stats().programs, 0);
  });

  it('an AbortSignal stops a program within a step and frees everything', async () => {
    const s = start();
    const available = store.available;
    const controller = new AbortController();
    let gens = 0;
    let abortedAt = -1;
    const run = s.run(
      async (line) => {
        line.append('The history of the world, in many chapters.');
        const forks = line.fork(4);
        gens = forks.length;
        await Promise.all(forks.map((f) => f.gen({ maxTokens: 200 })));
      },
      { signal: controller.signal, maxBranches: 5 },
    );
    while (steps.filter((st) => st.rows === 4).length < 3) await new Promise((r) => setTimeout(r, 5));
    abortedAt = steps.length;
    controller.abort();
    const error = await run.then(
      () => null,
      (e) => e,
    );
    assert.equal(gens, 4);
    assert.equal(error && error.code, 'ERR_ABORTED');
    assert.equal(error.name, 'AbortError');
    assert.ok(steps.length - abortedAt <= 2, `${steps.length - abortedAt} steps after the abort`);
    assert.equal(store.available, available);
    // Aborted before it starts: rejected at once.
    await rejects(() => s.run(async () => 1, { signal: AbortSignal.abort() }), 'ERR_ABORTED');
  });

  it('programs that fill every lease never deadlock: they wait for admission, not inside fork', async () => {
    const small = await open({ nCtx: 1024, nSeqMax: 4 });
    try {
      const s = new Scheduler(small);
      const program = (prompt) => async (line) => {
        line.append(prompt);
        const forks = line.fork(3); // all 4 leases of the context
        return Promise.all(forks.map((f) => f.gen({ maxTokens: 4 })));
      };
      const runs = [
        s.run(program('First,'), { maxBranches: 4, maxCells: 256 }),
        s.run(program('Second,'), { maxBranches: 4, maxCells: 256 }),
      ];
      const plain = s.generate({ prompt: 'Third,', maxTokens: 4 });
      const done = await Promise.all([...runs, plain]);
      assert.equal(done[0].length, 3);
      assert.equal(done[1].length, 3);
      assert.equal(done[2].choices[0].tokens.length, 4);
      await s.close();
    } finally {
      small.dispose();
    }
  });

  it('forks made right after releases wait for the freed leases: never more than maxBranches', async () => {
    const small = await open({ nCtx: 1024, nSeqMax: 4 });
    try {
      const s = new Scheduler(small);
      const out = await s.run(
        async (root) => {
          root.append('Once upon a time');
          const children = root.fork(3);
          await Promise.all(children.map((c) => c.gen({ maxTokens: 2 })));
          for (let i = 0; i < 4; i++) await null; // as a program with more awaits in between
          root.release();
          children[1].release();
          children[2].release(); // three leases come back at the next step, not now
          const grandchildren = children[0].fork(2);
          return Promise.all(grandchildren.map((g) => g.gen({ maxTokens: 2 })));
        },
        { maxBranches: 4 },
      );
      assert.equal(out.length, 2);
      await s.close();
    } finally {
      small.dispose();
    }
  });

  it('maxCells bounds what a program writes: ERR_KV_FULL, and the program can catch it', async () => {
    const s = start();
    const r = await s.run(
      async (line) => {
        line.append('Tell me a long story about a dragon.');
        const err = await line.gen({ maxTokens: 100 }).then(
          () => null,
          (e) => e,
        );
        return { code: err && err.code, message: err && err.message };
      },
      { maxCells: 40 },
    );
    assert.equal(r.code, 'ERR_KV_FULL');
    assert.match(r.message, /maxCells 40/);
  });

  it('refuses bad programs and bad line calls with coded errors', async () => {
    const s = start();
    await rejects(() => s.run('not a function'), 'ERR_INVALID_ARG');
    await rejects(() => s.run(async () => 1, { maxBranches: 0 }), 'ERR_INVALID_ARG');
    await rejects(() => s.run(async () => 1, { maxBranches: ctx.nSeqMax + 1 }), 'ERR_INVALID_ARG');
    await rejects(() => s.run(async () => 1, { maxCells: ctx.nCtx + 1 }), 'ERR_INVALID_ARG');
    let kept;
    const value = await s.run(async (line) => {
      kept = line;
      await rejects(() => line.gen({ maxTokens: 2 }), 'ERR_INVALID_ARG'); // empty line
      assert.throws(
        () => line.append([ctx.vocabSize]),
        (e) => e.code === 'ERR_INVALID_ARG',
      );
      assert.throws(
        () => line.fork(0),
        (e) => e.code === 'ERR_INVALID_ARG',
      );
      line.append('Hi').append(ctx.tokenizeSync(' there', false));
      assert.equal(line.text, 'Hi there');
      const pending = line.gen({ maxTokens: 3 });
      assert.throws(
        () => line.append('x'),
        (e) => e.code === 'ERR_PROGRAM_STATE',
      );
      await rejects(() => line.gen(), 'ERR_PROGRAM_STATE');
      await rejects(() => line.gen({ maxTokens: -1 }), 'ERR_PROGRAM_STATE');
      await pending;
      await rejects(() => line.gen({ maxTokens: -1 }), 'ERR_INVALID_ARG');
      return 7;
    });
    assert.equal(value, 7);
    assert.throws(
      () => kept.append('after the end'),
      (e) => e.code === 'ERR_PROGRAM_STATE',
    );
    await s.close();
    await rejects(() => s.run(async () => 1), 'ERR_SCHEDULER_CLOSED');
  });

  describe('select, choices and logprobs', () => {
    /** Σ log p(option token | prefix, earlier option tokens), one option on its own branch. */
    async function referenceScore(prefix, option, on = ctx) {
      const b = Branch.create(on, 0, GREEDY);
      try {
        await b.prefill(prefix);
        let sum = 0;
        for (const t of option) {
          sum += b.logprob(t).logprob;
          await b.commit(t);
        }
        return sum;
      } finally {
        await b.prune();
      }
    }

    it('select scores each option in shared steps and appends the best', async () => {
      const s = start();
      const options = [' Paris', ' a city in the north of Spain', ' London', ' the moon'];
      const result = await s.run(
        async (line) => {
          line.append('The capital of France is');
          const prefix = line.tokens;
          const picked = await line.select(options);
          const [tokens, text] = [line.tokens, line.text];
          const mark = steps.length;
          const next = await line.gen({ maxTokens: 3, params: GREEDY });
          return { picked, prefix, text, tokens, next, after: steps.slice(mark) };
        },
        { maxBranches: 5 },
      );
      const { picked, prefix } = result;
      // The winner's scoring fork became the line's KV: the gen after it prefilled nothing (its
      // first step only sampled) and is greedy after the winner.
      assert.deepEqual(
        result.after.map((st) => st.prefillTokens),
        result.after.map(() => 0),
        'the winner is not decoded again',
      );
      await assertGreedy(ctx, result.tokens, result.next.tokens, 'gen after select');
      assert.equal(picked.scores.length, 4);
      const best = picked.scores.indexOf(Math.max(...picked.scores));
      assert.equal(picked.index, best);
      assert.equal(picked.choice, options[best]);
      assert.ok(result.text.endsWith(picked.choice));
      const tokens = options.map((o) => ctx.tokenizeSync(o, false));
      assert.deepEqual(result.tokens, [...prefix, ...tokens[best]]);
      // The options were scored in ONE step's prefill (a logits row per token; one decode, as
      // the step's rows fit nOutputs), not a token per step: nothing was sampled.
      const total = tokens.reduce((n, t) => n + t.length, 0);
      assert.ok(total <= ctx.nOutputs, `${total} option tokens fit one decode's ${ctx.nOutputs} rows`);
      assert.deepEqual(
        steps
          .map((st) => [st.rows, st.prefillTokens])
          .filter(([rows, prefill]) => rows + prefill > 0)
          .slice(0, 2),
        [
          [0, prefix.length],
          [0, total],
        ],
      );
      // One token at a time is another batch shape (CPU decodes are not batch-invariant): close,
      // not equal; a row read off by one would be nats away.
      const reference = [];
      for (const t of tokens) reference.push(await referenceScore(prefix, t));
      for (const [i, score] of picked.scores.entries()) {
        assert.ok(Math.abs(score - reference[i]) < 0.25, `option ${i}: ${score} vs one at a time ${reference[i]}`);
      }
      const refBest = reference.indexOf(Math.max(...reference));
      const sorted = [...reference].sort((a, b) => b - a);
      if (sorted[0] - sorted[1] > 0.1) assert.equal(picked.index, refBest);
    });

    it('options sharing a prefix score its tokens once; a prefix option is scored on the way', async () => {
      const s = start();
      const options = [
        ' a small red house',
        ' a small red house with a garden',
        ' a small red car',
        ' a blue boat on the lake',
        ' a small red house with a garden and a dog',
      ];
      const tokens = options.map((o) => ctx.tokenizeSync(o, false));
      // The trie of the options: every distinct prefix is one node, one scored token.
      const nodes = new Set(tokens.flatMap((t) => t.map((_, i) => t.slice(0, i + 1).join(','))));
      const total = tokens.reduce((n, t) => n + t.length, 0);
      assert.ok(nodes.size < total - 10, `${nodes.size} distinct of ${total} option tokens`);
      const out = await s.run(
        async (line) => {
          line.append('Out of the window I saw');
          const prefix = line.tokens;
          await line.logprob(' a'); // the prompt is decoded: what follows is the select's alone
          const mark = steps.length;
          const picked = await line.select(options);
          const scoring = steps.slice(mark);
          const selected = line.tokens;
          const afterSelect = steps.length;
          const next = await line.gen({ maxTokens: 3, params: GREEDY });
          return { prefix, picked, scoring, selected, after: steps.slice(afterSelect), next };
        },
        // The line and one fork per option that is no other's prefix (3): two fewer than options.
        { maxBranches: 4 },
      );
      assert.equal(
        out.scoring.reduce((n, st) => n + st.prefillTokens, 0),
        nodes.size,
        'each distinct option prefix scored once',
      );
      const best = out.picked.scores.indexOf(Math.max(...out.picked.scores));
      assert.equal(out.picked.index, best);
      assert.deepEqual(out.selected, [...out.prefix, ...tokens[best]]);
      // Every option's sum, read off the paths it shares, is its own score. One token at a time is
      // another batch shape: drift, seen up to 0.06 nats a token here (scoring an option alone in
      // one decode drifts as far the other way); a token missed or read at the wrong depth costs
      // 1 to 5 nats.
      for (const [i, option] of tokens.entries()) {
        const reference = await referenceScore(out.prefix, option);
        assert.ok(
          Math.abs(out.picked.scores[i] - reference) < 0.1 * option.length,
          `option ${i}: ${out.picked.scores[i]} vs ${reference}`,
        );
      }
      // A winner that ends where its fork's KV ends is adopted; one that is a prefix of another
      // option (its fork went on) is appended and decoded again by the next gen.
      const isPrefix = tokens.some(
        (t, j) => j !== best && t.length > tokens[best].length && tokens[best].every((x, k) => x === t[k]),
      );
      assert.equal(
        out.after.reduce((n, st) => n + st.prefillTokens, 0),
        isPrefix ? tokens[best].length : 0,
      );
      await assertGreedy(ctx, out.selected, out.next.tokens, 'gen after a shared-prefix select');
    });

    it('a fork made before a select still forks the line where it was made', async () => {
      const s = start();
      const out = await s.run(
        async (line) => {
          line.append('The capital of France is');
          const [early] = line.fork(); // waits for the line's KV at the prompt's end
          const before = line.tokens;
          const picked = await line.select([' Paris', ' London']);
          const mark = steps.length;
          const next = await early.gen({ maxTokens: 3, params: GREEDY });
          return { before, picked, next, after: steps.slice(mark), tokens: line.tokens };
        },
        { maxBranches: 4 },
      );
      // The line did not take the winner's fork (that would move its KV past the early fork's
      // point, to be decoded again): the fork started where it was made, with nothing to prefill.
      assert.equal(
        out.after.reduce((n, st) => n + st.prefillTokens, 0),
        0,
        'the early fork decoded nothing again',
      );
      assert.deepEqual(out.tokens, [...out.before, ...ctx.tokenizeSync(out.picked.choice, false)]);
      await assertGreedy(ctx, out.before, out.next.tokens, 'the early fork');
    });

    it('options longer than nBatch are scored over several steps, every token once, and the line goes on', async () => {
      // A context of its own with a small nBatch (and nOutputs): the long option cannot fit one decode.
      const small = await open({ nCtx: 1024, nSeqMax: 4, nBatch: 8, nOutputs: 8 });
      const seen = [];
      const s = new Scheduler(small, { onStep: (st) => seen.push(st) });
      try {
        const options = [
          ' a city of many bridges, old streets, cafes, museums, parks and a great river that runs to the sea',
          ' Paris',
        ];
        const tokens = options.map((o) => small.tokenizeSync(o, false));
        assert.ok(tokens[0].length > 2 * small.nBatch, `${tokens[0].length} tokens: longer than two decodes`);
        const out = await s.run(
          async (line) => {
            line.append('The capital of France is');
            const prefix = line.tokens;
            const picked = await line.select(options);
            const selectSteps = seen.length;
            const after = line.tokens;
            const next = await line.gen({ maxTokens: 4, params: GREEDY });
            return { prefix, picked, selectSteps, after, next };
          },
          { maxBranches: 3 },
        );
        const best = out.picked.scores.indexOf(Math.max(...out.picked.scores));
        assert.equal(out.picked.index, best);
        assert.deepEqual(out.after, [...out.prefix, ...tokens[best]], 'the winner is appended whole');
        // A line scores at most min(nOutputs, nBatch) tokens a step (the engine splits a step's
        // prefill into nBatch-sized decodes): the long option spans steps.
        const scoring = seen
          .slice(0, out.selectSteps)
          .filter((st) => st.prefillTokens > 0)
          .slice(1); // after the prompt's
        assert.ok(
          scoring.length >= 3,
          `the options took ${scoring.length} steps: ${seen.map((st) => st.prefillTokens)}`,
        );
        assert.equal(
          scoring.reduce((n, st) => n + st.prefillTokens, 0),
          tokens[0].length + tokens[1].length,
          'every option token scored once',
        );
        // Against one token at a time (another batch shape): a chunk lost or scored twice would be
        // tens of nats away; drift stays well under 0.05 nats a token.
        for (const [i, option] of tokens.entries()) {
          const [score, sum] = [out.picked.scores[i], await referenceScore(out.prefix, option, small)];
          assert.ok(Math.abs(score - sum) < 0.05 * option.length, `option ${i}: ${score} vs ${sum}`);
        }
        // The KV holds exactly the winner after the prefix: the next gen is greedy after it.
        await assertGreedy(small, out.after, out.next.tokens, 'gen after a long select');
      } finally {
        await s.close();
        small.dispose();
      }
    });

    it('one option alone equals store.score on a branch (the same batch shape) within 1e-3', async () => {
      const s = start();
      const option = ' a little girl who lived in a village';
      const { scores, prefix } = await s.run(async (line) => {
        line.append('Once upon a time there was');
        const prefix = line.tokens;
        return { prefix, scores: (await line.select([option])).scores };
      });
      const tokens = ctx.tokenizeSync(option, false);
      const b = Branch.create(ctx, 0, GREEDY);
      let scored;
      try {
        await b.prefill(prefix);
        [scored] = await store.score([[b, tokens]]);
        assert.equal(b.position, prefix.length + tokens.length, 'the scored tokens stay in the branch');
      } finally {
        await b.prune();
      }
      assert.ok(Math.abs(scores[0] - scored) < 1e-3, `${scores[0]} vs ${scored}`);
      // One token at a time is another batch shape (CPU decodes are not batch-invariant): close,
      // not equal. A row read off by one would be several nats away.
      const oneAtATime = await referenceScore(prefix, tokens);
      assert.ok(Math.abs(scored - oneAtATime) < 0.25, `${scored} vs one at a time ${oneAtATime}`);
    });

    it('logprob(text): one token from the held logits, several scored in a fork; the line is unchanged', async () => {
      const s = start();
      const out = await s.run(async (line) => {
        line.append('The capital of France is');
        const prefix = line.tokens;
        const one = await line.logprob(' Paris', { top: 5 });
        const many = await line.logprob(' a small village');
        return { prefix, one, many, after: line.tokens, text: line.text };
      });
      assert.deepEqual(out.after, out.prefix);
      assert.equal(out.text, 'The capital of France is');
      const paris = ctx.tokenizeSync(' Paris', false);
      assert.equal(paris.length, 1);
      assert.equal(out.one.top.length, 5);
      assert.ok(out.one.top[0].logprob >= out.one.logprob);
      const refOne = await referenceScore(out.prefix, paris);
      assert.ok(Math.abs(out.one.logprob - refOne) < 0.05, `${out.one.logprob} vs ${refOne}`);
      const refMany = await referenceScore(out.prefix, ctx.tokenizeSync(' a small village', false));
      assert.ok(Math.abs(out.many.logprob - refMany) < 0.05, `${out.many.logprob} vs ${refMany}`);
      assert.ok(out.many.logprob < out.one.logprob);
    });

    it("select's normalized and unconditional methods", async () => {
      const s = start();
      // Three share their first token and one of them is a prefix of two: scored once on each
      // side (the line's forks, and the fresh lines after only the BOS token), a fork per option
      // that is no other's prefix (3 each; a fork per option would pass maxBranches).
      const options = [' blue', ' very very green', ' very very blue', ' very'];
      const out = await s.run(
        async (line) => {
          line.append('The sky is');
          const prefix = line.tokens;
          const [a, b] = line.fork(2);
          const total = await a.select(options);
          const normalized = await b.select(options, { method: 'normalized' });
          const unconditional = await line.select(options, { method: 'unconditional' });
          return { prefix, total, normalized, unconditional };
        },
        { maxBranches: 9 }, // the line, a and b, and 3 forks twice for 'unconditional'
      );
      const lengths = options.map((o) => ctx.tokenizeSync(o, false).length);
      for (const i of options.keys()) {
        assert.ok(Math.abs(out.normalized.scores[i] - out.total.scores[i] / lengths[i]) < 0.05);
        const bos = ctx.tokenizeSync('', true);
        const alone = await referenceScore(bos, ctx.tokenizeSync(options[i], false));
        const expected = out.total.scores[i] - alone;
        // Across batch shapes (the reference scores alone, the select in one decode with the other
        // options) CPU scores drift: up to ~0.3 nats over these 4 tokens on an AVX-512 build. A
        // select that forgot to subtract the unconditional score would be off by ~10 nats or more.
        assert.ok(
          Math.abs(out.unconditional.scores[i] - expected) < 0.5,
          `${out.unconditional.scores[i]} vs ${expected}`,
        );
      }
      await rejects(
        () => s.run(async (line) => line.append('x').select(['a', 'b', 'c'], { method: 'unconditional' })),
        'ERR_TOO_MANY_BRANCHES',
      );
      await rejects(() => s.run(async (line) => line.append('x').select([])), 'ERR_INVALID_ARG');
      await rejects(() => s.run(async (line) => line.append('x').select(['a'], { method: 'best' })), 'ERR_INVALID_ARG');
    });

    it('choices: every sampled output is one of them', async () => {
      const s = start();
      const choices = ['red', 'green', 'blue', 'yellow "quoted"\\'];
      const outs = await s.run(
        async (line) => {
          line.append('My favourite colour is ');
          const forks = line.fork(6);
          return Promise.all(forks.map((f) => f.gen({ choices, params: { temperature: 1.5 }, maxTokens: 16 })));
        },
        { maxBranches: 7, seed: 3 },
      );
      for (const o of outs) assert.ok(choices.includes(o.text), JSON.stringify(o.text));
      await rejects(() => s.run(async (line) => line.append('x').gen({ choices: [] })), 'ERR_INVALID_ARG');
      await rejects(
        () => s.run(async (line) => line.append('x').gen({ choices: ['a'], grammar: 'root ::= "a"' })),
        'ERR_INVALID_ARG',
      );
    });

    it('regex: every sampled output matches the whole expression', async () => {
      const s = start();
      const outs = await s.run(
        async (line) => {
          line.append('Order number:');
          const forks = line.fork(4);
          return Promise.all(
            forks.map((f) => f.gen({ regex: '[0-9]{3}-[a-z]{2,5}', params: { temperature: 1.2 }, maxTokens: 16 })),
          );
        },
        { maxBranches: 5, seed: 9 },
      );
      for (const o of outs) assert.match(o.text, /^[0-9]{3}-[a-z]{2,5}$/);
      await rejects(() => s.run(async (line) => line.append('x').gen({ regex: 42 })), 'ERR_INVALID_ARG');
      await rejects(
        () => s.run(async (line) => line.append('x').gen({ regex: 'a+', choices: ['a'] })),
        'ERR_INVALID_ARG',
      );
    });

    it('logprobs: per token, from the logits it was sampled from, with top alternatives', async () => {
      const s = start();
      const prompt = 'The three primary colors are';
      const out = await s.run(async (line) => {
        line.append(prompt);
        return line.gen({ maxTokens: 6, params: GREEDY, logprobs: 3 });
      });
      assert.equal(out.logprobs.length, out.tokens.length);
      const b = Branch.create(ctx, 0, GREEDY);
      await b.prefill(ctx.tokenizeSync(prompt, true));
      for (const [i, lp] of out.logprobs.entries()) {
        assert.equal(lp.token, out.tokens[i]);
        assert.equal(lp.top.length, 3);
        assert.equal(lp.top[0].token, lp.token, 'greedy picks the most likely token');
        assert.ok(lp.top[0].logprob >= lp.top[1].logprob && lp.top[1].logprob >= lp.top[2].logprob);
        // Against a log-softmax of the same position's logits, computed here.
        const logits = b.getLogits();
        let max = -Infinity;
        for (const x of logits) if (x > max) max = x;
        let z = 0;
        for (const x of logits) z += Math.exp(x - max);
        const expected = logits[lp.token] - max - Math.log(z);
        assert.ok(Math.abs(lp.logprob - expected) < 0.05, `${lp.logprob} vs ${expected}`);
        await b.commit(lp.token);
      }
      await b.prune();
      // The plain surfaces: Branch.produce and Scheduler.generate.
      const c = Branch.create(ctx, 0, GREEDY);
      await c.prefill(ctx.tokenizeSync(prompt, true));
      const produced = c.produce({ logprobs: 2 });
      assert.equal(produced.top.length, 2);
      assert.equal(produced.top[0].token, produced.token);
      assert.ok(produced.logprob < 0 && produced.logprob === produced.top[0].logprob);
      assert.equal(c.produce().logprob, undefined);
      assert.throws(
        () => c.produce({ logprobs: 21 }),
        (e) => e.code === 'ERR_INVALID_ARG',
      );
      assert.throws(
        () => c.logprob(ctx.vocabSize),
        (e) => e.code === 'ERR_TOKEN_OUT_OF_RANGE' || e.code === 'ERR_INVALID_ARG',
      );
      await c.prune();
      const gen = s.generate({ prompt, maxTokens: 4, params: GREEDY, logprobs: true });
      const events = [];
      for await (const e of gen) if (e.token !== null) events.push(e);
      const result = await gen;
      assert.equal(result.choices[0].logprobs.length, 4);
      assert.deepEqual(
        events.map((e) => e.logprob),
        result.choices[0].logprobs.map((l) => l.logprob),
      );
      assert.ok(events.every((e) => e.top.length === 0 && e.logprob <= 0));
      assert.equal((await s.generate({ prompt, maxTokens: 2 })).choices[0].logprobs, undefined);
    });
  });
});
