#!/usr/bin/env node
'use strict';

/**
 * Examples smoke test (`npm run test:examples`, and a step of `npm test`).
 *
 * Runs every example in examples/ with `--jsonl` on the test model (LLAMA_TEST_MODEL, else the
 * default model) and small token budgets, parses its stdout as JSON lines, requires exit code 0
 * and checks the events for what the example claims to show. Prints one PASS/FAIL line per
 * example and finally `N passed, M failed`; exits 1 if any example failed.
 *
 * Usage: node test/examples.js [name ...]     (names filter, e.g. `node test/examples.js beam`)
 */

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawn } = require('node:child_process');

const ROOT = path.join(__dirname, '..');
const EXAMPLES = path.join(ROOT, 'examples');

function modelPath() {
  if (process.env.LLAMA_TEST_MODEL) return path.resolve(process.env.LLAMA_TEST_MODEL);
  return require('../scripts/fetch-model').ensureModel();
}

const byEvent = (events, name) => events.filter((e) => e.event === name);
function one(events, name) {
  const found = byEvent(events, name);
  assert.equal(found.length, 1, `expected exactly one "${name}" event, got ${found.length}`);
  return found[0];
}
const isNum = (x) => typeof x === 'number' && Number.isFinite(x);

/**
 * The branch-tree events an example writes with --jsonl (docs/events.md), for the server's page:
 * a `hello` first, every branch forked before anything else names it, parents before children,
 * and tokens that grow each branch. Examples that trace say so with `traced: true`.
 */
function checkTrace(events) {
  const trace = events.filter(
    (e) =>
      typeof e.t === 'number' &&
      ['hello', 'fork', 'append', 'token', 'finish', 'prune', 'admit', 'done', 'step'].includes(e.event),
  );
  assert.equal(trace[0] && trace[0].event, 'hello', 'the trace starts with hello');
  const forked = new Set();
  for (const e of trace) {
    if (e.event === 'fork') {
      assert.ok(!forked.has(e.branch), `${e.branch} forked twice`);
      if (e.parent !== null) assert.ok(forked.has(e.parent), `${e.branch}'s parent ${e.parent} unknown`);
      forked.add(e.branch);
    } else if (e.branch !== undefined) {
      assert.ok(forked.has(e.branch), `${e.event} of ${e.branch} before its fork`);
    }
  }
  assert.ok(forked.size >= 2, `a tree: ${forked.size} branches`);
  assert.ok(
    trace.some((e) => e.event === 'token' || e.event === 'append'),
    'what went into the branches is traced',
  );
}

/**
 * Each example: its file, extra flags (small budgets keep the whole run short on 2 cores), an
 * optional stdin text, and the checks on its events.
 */
/** speculative.js: drafts verified in fewer decodes than tokens, output plain greedy's. */
function validateSpeculative(events) {
  const start = one(events, 'start');
  assert.ok(start.maxDraft > 0);
  const done = one(events, 'complete');
  assert.equal(done.outputTokens, start.maxTokens);
  assert.ok(done.drafted > 0 && done.accepted > 0, `drafted ${done.drafted}, accepted ${done.accepted}`);
  assert.ok(done.accepted <= done.drafted);
  assert.ok(done.decodes < done.outputTokens, `${done.outputTokens} tokens took ${done.decodes} decodes`);
  // Each token ranked in plain one-token-per-decode decoding of the same prefix: greedy
  // verification makes it the top choice except near-ties a different batch shape breaks the
  // other way (CPU decodes are not batch-invariant): at least 85 % top-1, all within the top 2.
  assert.equal(done.greedyRanks.length, done.outputTokens);
  const top1 = done.greedyRanks.filter((r) => r === 0).length;
  assert.ok(top1 >= 0.85 * done.outputTokens, `only ${top1}/${done.outputTokens} are plain greedy's choice`);
  assert.ok(
    done.greedyRanks.every((r) => r < 2),
    `ranks ${done.greedyRanks.join(',')}`,
  );
  assert.ok(done.greedyAgreement >= 1);
  assert.ok(done.tokS > 0 && done.plainTokS > 0);
}

const CASES = [
  {
    name: 'demo',
    file: 'demo.js',
    human: true, // the demo has no --jsonl mode: it is the first thing a newcomer runs
    validate(_events, stdout) {
      assert.match(stdout, /\[greedy\] The capital of France is/);
      assert.match(stdout, /\[best-of-4\]/);
      assert.match(stdout, /winner: #[0-3]/);
      assert.match(stdout, /winner still live: true, root disposed: true/);
    },
  },
  {
    name: 'best-of-n',
    file: 'best-of-n.js',
    traced: true,
    args: ['--n', '4', '--max-tokens', '16'],
    validate(events) {
      const start = one(events, 'start');
      assert.equal(start.n, 4);
      const baseline = one(events, 'baseline');
      assert.ok(isNum(baseline.ppl) && baseline.ppl >= 1, `baseline ppl ${baseline.ppl}`);
      const candidates = byEvent(events, 'candidate');
      assert.equal(candidates.length, 4);
      for (const c of candidates) {
        assert.ok(c.ppl >= 1 && c.ppl < 1000, `candidate ppl ${c.ppl} out of range`);
        assert.ok(c.tokens > 0 && c.tokens <= 16, `candidate tokens ${c.tokens}`);
        assert.ok(c.text.length > 0);
      }
      assert.ok(new Set(candidates.map((c) => c.text)).size > 1, 'reseeded candidates should differ');
      const done = one(events, 'complete');
      assert.equal(done.bestPpl, Math.min(...candidates.map((c) => c.ppl)), 'the winner has the lowest perplexity');
      assert.equal(candidates[done.bestIndex].ppl, done.bestPpl);
      assert.equal(done.liveBranchesAfter, 1, 'retainOnly leaves one branch');
      assert.ok(done.kvCellsAfter < done.kvCellsBefore, 'retainOnly frees KV cells');
      assert.equal(done.kvCellsAfter, done.winnerPosition, "only the winner's cells remain");
    },
  },
  {
    name: 'self-consistency',
    file: 'self-consistency.js',
    traced: true,
    args: ['--paths', '4', '--questions', '2', '--max-tokens', '24'],
    validate(events) {
      const start = one(events, 'start');
      assert.equal(start.paths, 4);
      assert.equal(start.questions, 2);
      const paths = byEvent(events, 'path');
      assert.equal(paths.length, 8);
      const votes = byEvent(events, 'vote');
      assert.equal(votes.length, 2);
      for (const v of votes) {
        const own = paths.filter((p) => p.question === v.question);
        assert.equal(own.length, 4);
        for (const p of own) {
          assert.ok(['stop', 'length'].includes(p.finishReason));
          assert.ok(!p.text.includes('\n'), 'the stop string ends each chain');
        }
        assert.deepEqual(
          v.answers,
          own.map((p) => p.answer),
        );
        const counts = {};
        for (const a of v.answers) if (a !== null) counts[a] = (counts[a] || 0) + 1;
        const top = Math.max(0, ...Object.values(counts));
        assert.equal(v.votes, top, 'the winner has the most votes');
        if (top > 0) assert.equal(counts[v.answer], top);
      }
      const done = one(events, 'complete');
      assert.equal(done.maxRowsPerStep, 8, 'all 8 chains of both programs advanced in one decode');
      assert.equal(done.prefilledTokens, start.promptTokens[0] + start.promptTokens[1], 'each prompt decoded once');
    },
  },
  {
    name: 'rerank',
    file: 'rerank.js',
    traced: true,
    args: [],
    validate(events) {
      const start = one(events, 'start');
      const docs = byEvent(events, 'document');
      assert.equal(docs.length, start.documents);
      assert.deepEqual(
        docs.map((d) => d.rank),
        [...docs.keys()],
      );
      assert.deepEqual([...new Set(docs.map((d) => d.index))].sort(), [...docs.keys()]);
      for (const [i, d] of docs.entries()) {
        assert.ok(d.yes < 0 && d.no < 0, 'log-probabilities');
        assert.ok(Math.abs(d.score - (d.yes - d.no)) < 1e-3, 'score = log p(yes) - log p(no)');
        if (i > 0) assert.ok(docs[i - 1].score >= d.score, 'ranked by score');
      }
      const done = one(events, 'complete');
      assert.equal(done.generatedTokens, 0, 'nothing is generated');
      assert.equal(done.prefillSteps, 2, 'the query once, then every document in one prefill');
    },
  },
  {
    name: 'route-tickets',
    file: 'route-tickets.js',
    traced: true,
    args: [],
    validate(events) {
      const start = one(events, 'start');
      const tickets = byEvent(events, 'ticket');
      assert.equal(tickets.length, start.tickets);
      for (const t of tickets) {
        assert.ok(['spam', 'billing', 'technical', 'sales', 'a person'].includes(t.route), t.route);
        assert.ok(t.spam >= 0 && t.spam <= 1);
        const p = Object.values(t.teamProbabilities);
        assert.ok(Math.abs(p.reduce((a, b) => a + b, 0) - 1) < 1e-9, 'probabilities over the options sum to 1');
        assert.equal(t.teamProbabilities[t.team], Math.max(...p), 'the team is the most likely option');
        assert.ok(t.urgency >= 0 && t.urgency <= 2);
      }
      const done = one(events, 'complete');
      assert.equal(done.generatedTokens, 0, 'nothing is generated');
      assert.equal(done.prefilledTokens, done.inputTokens, 'each ticket decoded once, then only the questions');
    },
  },
  {
    name: 'json-best-of-n',
    file: 'json-best-of-n.js',
    traced: true,
    args: ['--n', '4', '--max-tokens', '64'],
    validate(events) {
      const candidates = byEvent(events, 'candidate');
      assert.equal(candidates.length, 4);
      for (const c of candidates) {
        assert.ok(c.perplexity >= 1, `perplexity ${c.perplexity}`);
        if (c.kept) {
          const v = JSON.parse(c.text);
          assert.deepEqual(Object.keys(v).sort(), ['age', 'city', 'name']);
          assert.ok(Number.isInteger(v.age) && v.age >= 0 && v.age <= 120);
        } else {
          assert.ok(c.reason, 'a refused candidate says why');
        }
      }
      const kept = candidates.filter((c) => c.kept);
      const done = one(events, 'complete');
      assert.equal(done.kept, kept.length);
      if (kept.length > 0) {
        const best = candidates[done.bestIndex];
        assert.ok(best.kept);
        assert.equal(best.perplexity, Math.min(...kept.map((c) => c.perplexity)));
        assert.deepEqual(done.best, JSON.parse(best.text));
      }
    },
  },
  {
    name: 'tree-of-thought',
    file: 'tree-of-thought.js',
    traced: true,
    args: ['--k', '3', '--b', '2', '--levels', '3', '--max-tokens', '10'],
    validate(events) {
      const start = one(events, 'start');
      const levels = byEvent(events, 'level');
      assert.equal(levels.length, 3);
      assert.deepEqual(
        levels.map((l) => l.candidates),
        [3, 6, 6],
        'k candidates from each of the b kept lines',
      );
      for (const l of levels) {
        assert.equal(l.kept.length, 2);
        const sorted = [...l.scores].sort((a, b) => b - a);
        assert.deepEqual(
          l.kept.map((k) => k.score),
          sorted.slice(0, 2),
          'the best b are kept',
        );
      }
      const done = one(events, 'complete');
      assert.equal(done.steps.length, 3, 'one step per level');
      assert.equal(done.score, levels[2].kept[0].score);
      assert.ok(done.mostRowsPerDecode > 3, 'candidates of both kept lines in one decode');
      assert.equal(start.maxBranches, 1 + 2 + 2 * 3);
    },
  },
  {
    name: 'cot-decoding',
    file: 'cot-decoding.js',
    traced: true,
    args: ['--k', '4', '--max-tokens', '24'],
    validate(events) {
      const paths = byEvent(events, 'path');
      assert.equal(paths.length, 4);
      assert.equal(new Set(paths.map((p) => p.first)).size, 4, 'each path starts with a different first token');
      for (const [i, p] of paths.entries()) {
        assert.ok(p.text.startsWith(p.first));
        assert.ok(p.confidence >= 0 && p.confidence <= 1, `confidence ${p.confidence}`);
        if (i > 0) assert.ok(paths[i - 1].firstLogprob >= p.firstLogprob, 'the top-k first tokens, most likely first');
      }
      const done = one(events, 'complete');
      assert.equal(paths[done.bestIndex].confidence, Math.max(...paths.map((p) => p.confidence)));
      assert.equal(done.mostRowsPerDecode, 4, 'the k paths continue in one decode');
    },
  },
  {
    name: 'beam-search',
    file: 'beam-search.js',
    traced: true,
    args: ['--width', '3', '--max-tokens', '8'],
    validate(events) {
      const start = one(events, 'start');
      const steps = byEvent(events, 'beam');
      assert.ok(steps.length > 0 && steps.length <= 8);
      for (const s of steps) {
        assert.ok(s.beams.length >= 1 && s.beams.length <= start.width);
        assert.ok(s.liveBranches <= start.width, 'never more than k live branches');
        const scores = s.beams.map((b) => b.score);
        assert.ok(
          scores.every((x) => isNum(x) && x <= 0),
          'log-prob scores are <= 0',
        );
      }
      const hyps = byEvent(events, 'hypothesis');
      assert.ok(hyps.length >= 1);
      for (let i = 1; i < hyps.length; i++) assert.ok(hyps[i - 1].score >= hyps[i].score, 'hypotheses are ranked');
      const done = one(events, 'complete');
      assert.equal(done.decodes, steps.length, 'one batched commit per step');
      assert.ok(done.forks > 0, 'beam search forks');
      assert.equal(done.bestScore, hyps[0].score);
      assert.equal(done.liveBranchesAfter, 1);
      assert.ok(done.bestText.length > 0);
    },
  },
  {
    name: 'speculative (prompt lookup)',
    file: 'speculative.js',
    traced: true,
    args: ['--source', 'lookup', '--max-tokens', '32'],
    validate: validateSpeculative,
  },
  {
    name: 'speculative (draft model)',
    file: 'speculative.js',
    traced: true,
    args: ['--source', 'draft', '--max-draft', '4', '--max-tokens', '16'],
    validate: validateSpeculative,
  },
  {
    name: 'tree-search',
    file: 'tree-search.js',
    traced: true,
    args: ['--depth', '2', '--branching', '3', '--keep', '2', '--segment', '4'],
    validate(events) {
      one(events, 'start');
      const levels = byEvent(events, 'level');
      assert.equal(levels.length, 2);
      assert.equal(levels[0].expanded, 3);
      assert.equal(levels[1].expanded, 6);
      for (const l of levels) {
        assert.equal(l.kept.length, 2);
        assert.equal(l.prunedIds.length, l.expanded - 2);
        assert.ok(l.kept[0].ppl <= l.kept[1].ppl, 'kept children are the best-scored');
      }
      const done = one(events, 'complete');
      assert.equal(done.bestId, levels[1].kept[0].id);
      assert.equal(done.liveAfter, 1, 'retainOnly leaves only the best leaf');
      assert.ok(done.liveBefore > 1);
      assert.ok(done.kvCellsAfter <= done.kvCellsBefore);
      assert.equal(done.kvCellsAfter, done.bestPosition);
    },
  },
  {
    name: 'checkpoint-search',
    file: 'checkpoint-search.js',
    // The defaults (depth 3, 3 children, keep 2, 6 tokens, checkpoint after level 2), which
    // find the same continuation only on a deterministic context (issue 51).
    args: [],
    validate(events) {
      const start = one(events, 'start');
      assert.equal(start.deterministic, true, 'the example runs deterministic by default');
      const checkpoint = one(events, 'checkpoint');
      assert.equal(checkpoint.level, 2);
      assert.equal(checkpoint.branches, 5, 'the root, the two kept children and their two kept children');
      assert.equal(checkpoint.branches, checkpoint.live);
      assert.ok(checkpoint.kvBytes > 0 && checkpoint.bytes > checkpoint.kvBytes);
      const done = one(events, 'complete');
      assert.equal(done.same, true, 'the search resumed in a child process finds the same continuation');
      assert.equal(done.resumedBestId, done.bestId);
      assert.equal(done.resumedText, done.bestText);
    },
  },
  {
    name: 'grammar-json',
    file: 'grammar-json.js',
    traced: true,
    args: ['--forks', '3', '--max-tokens', '48'],
    validate(events) {
      one(events, 'start');
      const point = one(events, 'branch_point');
      assert.match(point.prefix, /"city"/);
      const branches = byEvent(events, 'branch_complete');
      assert.equal(branches.length, 3);
      for (const b of branches) {
        assert.ok(b.text.startsWith(point.prefix), 'every fork continues the shared prefix');
        if (b.finished) {
          assert.ok(b.validJson, `a finished fork must be valid JSON: ${b.text}`);
          assert.equal(typeof b.value.city, 'string');
          assert.ok(Number.isInteger(b.value.population));
        }
      }
      const done = one(events, 'complete');
      assert.ok(done.validJsonCount > 0);
      assert.equal(done.validJsonCount, branches.filter((b) => b.validJson).length);
    },
  },
  {
    name: 'entropy',
    file: 'entropy.js',
    traced: true,
    args: ['--max-tokens', '16', '--fork-threshold', '2.5', '--max-forks', '1', '--lookahead', '3'],
    validate(events) {
      const start = one(events, 'start');
      const check = one(events, 'entropy_check');
      assert.ok(
        Math.abs(check.branchEntropy - check.modelEntropy) < 1e-4,
        'branch.entropy() === ctx.modelEntropy(logits)',
      );
      const points = byEvent(events, 'branch_point');
      const tokens = byEvent(events, 'sample');
      for (const p of points) {
        assert.ok(p.entropy > start.forkThreshold, 'branch points only above the threshold');
        assert.equal(p.candidates.length, start.fanOut);
        const ppls = p.candidates.map((c) => c.ppl);
        assert.equal(ppls[p.chosen], Math.min(...ppls), 'the lowest-perplexity lookahead wins');
      }
      for (const t of tokens) {
        assert.ok(isNum(t.entropy) && t.entropy >= 0);
        assert.ok(t.temperature >= 0 && t.temperature <= 0.9 + 1e-9);
      }
      const done = one(events, 'complete');
      assert.equal(done.branchPoints, points.length);
      assert.ok(done.branchPoints <= 1);
      assert.equal(done.sampledSteps, tokens.length);
      assert.ok(done.tokens > 0 && done.tokens <= 16);
      assert.ok(isNum(done.avgTemp));
      assert.equal(done.liveBranches, 1);
    },
  },
  {
    name: 'chat',
    file: 'chat.js',
    args: ['--max-tokens', '12'],
    input: 'Hi, my name is Ada.\nWhat is my name?\n', // then EOF: the example must exit 0
    validate(events) {
      one(events, 'start');
      const turns = byEvent(events, 'turn');
      assert.equal(turns.length, 2);
      assert.deepEqual(
        turns.map((t) => t.warm),
        [false, true],
      );
      for (const t of turns) {
        assert.ok(t.tokens > 0 && t.tokens <= 12, `turn tokens ${t.tokens}`);
        assert.equal(
          byEvent(events, 'token').filter((e) => e.turn === t.turn).length,
          t.tokens,
          'every token is streamed',
        );
        assert.equal(typeof t.content, 'string');
      }
      // Warm turn: only the separator and the new user turn are decoded, nothing twice.
      assert.equal(turns[0].position, turns[0].prefillTokens + turns[0].tokens);
      assert.equal(turns[1].position, turns[0].position + turns[1].prefillTokens + turns[1].tokens);
      assert.ok(turns[1].prefillTokens < turns[0].position, 'the warm prefill is shorter than the history');
      assert.equal(one(events, 'complete').turns, 2);
    },
  },
  {
    name: 'park-search',
    file: 'park-search.js',
    args: ['--width', '3', '--depth', '3', '--n-seq-max', '4', '--spill-dir', 'build/park-spill', '--ram-mib', '0'],
    validate(events) {
      assert.equal(one(events, 'start').nSeqMax, 4);
      const done = one(events, 'complete');
      assert.equal(done.nodes, 3 + 9 + 27, 'every node of the tree was made');
      assert.ok(done.nodes > 4 * 8, 'more nodes than nSeqMax x 8');
      assert.ok(done.peakLeases <= 4, `peak leases ${done.peakLeases}`);
      assert.ok(done.bestText.length > 0 && done.bestPerplexity >= 1, JSON.stringify(done));
      assert.equal(done.spilledAtEnd, 0, 'every spill file went with its branch');
    },
  },
  {
    name: 'backtrack-search',
    file: 'backtrack-search.js',
    traced: true,
    args: ['--k', '3', '--expansions', '5', '--max-tokens', '8'],
    validate(events) {
      const start = one(events, 'start');
      assert.equal(start.maxBranches, 4);
      const expansions = byEvent(events, 'expand');
      assert.equal(expansions.length, 5);
      assert.deepEqual(
        expansions.map((e) => e.frontier),
        [3, 5, 7, 9, 11],
        'each expansion takes one line off the frontier and adds k',
      );
      for (const e of expansions) assert.equal(e.parked, e.frontier, 'every frontier line is parked');
      const done = one(events, 'complete');
      assert.ok(done.peakLeases <= start.maxBranches, `peak leases ${done.peakLeases}`);
      assert.ok(done.peakParked > start.maxBranches, 'the program held more lines than leases');
      assert.equal(done.steps.length, done.depth, 'one step per level of the best line');
      assert.equal(done.parkedAtEnd, 0, 'parked lines are freed with their program');
    },
  },
  {
    name: 'embeddings',
    file: 'embeddings.js',
    validate(events) {
      const start = one(events, 'start');
      assert.ok(start.embeddingDim > 0);
      assert.equal(start.hasPooling, true);
      const embeddings = byEvent(events, 'embedding');
      assert.equal(embeddings.length, start.documents);
      for (const e of embeddings) {
        assert.equal(e.dim, start.embeddingDim);
        assert.ok(Math.abs(e.norm - 1) < 1e-3, `normalised embeddings have norm 1, got ${e.norm}`);
      }
      const pairs = byEvent(events, 'similarity');
      assert.equal(pairs.length, (start.documents * (start.documents - 1)) / 2);
      for (const p of pairs) assert.ok(p.cosine >= -1 - 1e-6 && p.cosine <= 1 + 1e-6);
      const sim = (a, b) => pairs.find((p) => p.a === a && p.b === b).cosine;
      assert.ok(sim(0, 1) > sim(0, 2), 'the two cat sentences are closer than cat and finance');
      assert.ok(sim(2, 3) > sim(2, 4), 'the two finance sentences are closer than finance and food');
      const search = one(events, 'search');
      assert.deepEqual(search.ranking.map((r) => r.index).sort(), [0, 1, 2, 3, 4]);
      for (let i = 1; i < search.ranking.length; i++) assert.ok(search.ranking[i - 1].score >= search.ranking[i].score);
      assert.deepEqual(
        search.ranking
          .slice(0, 2)
          .map((r) => r.index)
          .sort(),
        [0, 1],
        'the cat documents rank first for a cat query',
      );
      assert.equal(one(events, 'complete').embeddings, start.documents);
    },
  },
];

/** Runs one example; resolves {code, stdout, stderr, ms}. */
function runExample(file, args, input, timeoutMs) {
  return new Promise((resolve) => {
    const started = Date.now();
    const child = spawn(process.execPath, [path.join(EXAMPLES, file), ...args], {
      cwd: ROOT,
      env: process.env,
      stdio: ['pipe', 'pipe', 'pipe'],
    });
    let stdout = '';
    let stderr = '';
    child.stdout.on('data', (d) => (stdout += d));
    child.stderr.on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout, stderr, ms: Date.now() - started });
    });
    child.stdin.end(input || '');
  });
}

function parseEvents(stdout) {
  const events = [];
  for (const line of stdout.split('\n')) {
    if (!line.startsWith('{')) continue;
    events.push(JSON.parse(line)); // a malformed line fails the example
  }
  return events;
}

async function main() {
  const filters = process.argv.slice(2);
  const model = modelPath();
  const timeoutMs = Number(process.env.EXAMPLE_TIMEOUT_MS || 600000);

  // Every script in examples/ must have a case here, so a new example cannot go untested.
  const scripts = fs.readdirSync(EXAMPLES).filter((f) => /\.(c|m)?js$/.test(f) && !f.startsWith('_'));
  const untested = scripts.filter((f) => !CASES.some((c) => c.file === f));

  const selected = CASES.filter((c) => filters.length === 0 || filters.some((f) => c.name.includes(f)));
  let passed = 0;
  let failed = 0;
  const startedAll = Date.now();
  for (const c of selected) {
    const args = c.human ? [] : ['--jsonl', '--model', model, ...(c.args || [])];
    const env = c.human ? { LLAMA_TEST_MODEL: model } : {};
    Object.assign(process.env, env);
    const res = await runExample(c.file, args, c.input, timeoutMs);
    let error = null;
    try {
      if (res.signal) throw new Error(`killed by ${res.signal} (timeout ${timeoutMs} ms?)`);
      assert.equal(res.code, 0, `exit code ${res.code}`);
      const events = c.human ? [] : parseEvents(res.stdout);
      if (!c.human) {
        assert.ok(events.length > 0, 'no JSON events on stdout');
        const stray = res.stdout.split('\n').filter((l) => l.trim() !== '' && !l.startsWith('{'));
        assert.deepEqual(stray, [], '--jsonl stdout must contain only JSON lines');
      }
      c.validate(events, res.stdout);
      if (c.traced) checkTrace(events);
    } catch (e) {
      error = e;
    }
    const secs = `${(res.ms / 1000).toFixed(1)}s`;
    if (error) {
      failed++;
      console.log(`FAIL  ${c.name.padEnd(14)} ${secs.padStart(7)}  ${error.message}`);
      const tail = (res.stderr || '').trim().split('\n').slice(-8).join('\n      ');
      if (tail) console.log(`      stderr: ${tail}`);
    } else {
      passed++;
      console.log(`PASS  ${c.name.padEnd(14)} ${secs.padStart(7)}`);
    }
  }
  if (filters.length === 0) {
    for (const f of untested) {
      failed++;
      console.log(`FAIL  ${f.padEnd(14)}          no test case in test/examples.js`);
    }
  }
  console.log(`\n${passed} passed, ${failed} failed (${((Date.now() - startedAll) / 1000).toFixed(1)}s)`);
  process.exitCode = failed === 0 && passed > 0 ? 0 : 1;
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
