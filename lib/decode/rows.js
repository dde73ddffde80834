'use strict';

/**
 * The decode phase of a step, as data in and data out: ONE produce for every row that samples
 * (`produceAll`), then ONE commit of the tokens taken (`commitRows`, with drafts when the
 * scheduler speculates). A row is `{ branch, owner, carried? }`; a commit adds its `token` and,
 * when it speculates, `spec`. Nothing here calls back into a line or a program: each function
 * returns what became of every row (its token or its error; a speculative commit's accepted
 * draft and next token), and the caller — the Scheduler's `Programs`, or `Branch.generate` —
 * applies it and decides whose failure it is. A failure stays its owner's: when a commit of
 * several owners fails, each owner is committed alone, so one request's bad grammar or one
 * program's error never ends the others.
 */

/**
 * @typedef {object} DecodeRow
 * @property {any} branch
 * @property {any} owner rows of one owner fail together
 * @property {any} [carried] the `Produced` a speculative step sampled for this row: taken instead of sampling
 *
 * @typedef {object} Commit
 * @property {any} branch
 * @property {any} owner
 * @property {number} token the token taken, decoded now
 * @property {{ drafter: any, length: import('./speculation').DraftLength, limit: number }} [spec] a row that speculates
 * @property {number[]} [draft] the draft it was given
 *
 * @typedef {{ error?: any, verified?: { accepted: any[], next: any, drafted: number } | null }} Outcome a commit's
 *   error, or what was verified: null without speculation; with it, every commit's (a row that does
 *   not speculate gets none accepted, and its `next` is not its own to take: only rows with a
 *   `spec` use it)
 *
 * @typedef {{ outcomes: Outcome[], drafted: number, accepted: number, applied: () => void }} Committed
 *   each commit's outcome, the draft tokens drafted and accepted, and `applied()`, which the
 *   caller calls once it applied the outcomes: a speculative step's time (the cost fit's sample)
 *   runs from drafting to then, as the lines' intake of accepted tokens is part of a step's cost
 */

/**
 * Drafts for many lines, in one call per source that can batch.
 * @param {Array<{ source: any, drafter: any, token: number, k: number }>} jobs
 * @returns {Promise<number[][]>}
 */
async function draftAll(jobs) {
  const out = jobs.map(() => /** @type {number[]} */ ([]));
  const bySource = new Map();
  jobs.forEach((job, i) => {
    if (job.k <= 0) return;
    if (!bySource.has(job.source)) bySource.set(job.source, []);
    bySource.get(job.source).push(i);
  });
  for (const [source, indices] of bySource) {
    if (typeof source.draftMany === 'function') {
      const drafts = await source.draftMany(
        indices.map((i) => jobs[i].drafter),
        indices.map((i) => jobs[i].token),
        indices.map((i) => jobs[i].k),
      );
      indices.forEach((i, j) => (out[i] = drafts[j].slice(0, jobs[i].k)));
    } else {
      for (const i of indices) out[i] = (await jobs[i].drafter.draft(jobs[i].token, jobs[i].k)).slice(0, jobs[i].k);
    }
  }
  return out;
}

/**
 * One `store.produce` for all rows that sample; if it throws (e.g. a grammar masks everything),
 * per branch to find whose. A row a speculative step already sampled takes that token. Returns
 * each row's `Produced` or Error, in row order.
 * @param {any} store @param {DecodeRow[]} rows
 */
function produceAll(store, rows) {
  const sampled = rows.filter((r) => r.carried === undefined);
  let produced;
  try {
    produced = store.produce(sampled.map((r) => r.branch));
  } catch {
    produced = sampled.map(({ branch }) => {
      try {
        return branch.produce();
      } catch (e) {
        return e;
      }
    });
  }
  let next = 0;
  return rows.map((r) => (r.carried !== undefined ? r.carried : produced[next++]));
}

/**
 * Runs `attempt` on all `commits` at once; if it throws, once per owner, so that one owner's
 * failure stays its own. Returns each commit's outcome (`attempt` gives the successful ones').
 * @param {Commit[]} commits
 * @param {(list: Commit[]) => Promise<Outcome[]>} attempt
 * @returns {Promise<Outcome[]>}
 */
async function perOwnerOnFailure(commits, attempt) {
  try {
    return await attempt(commits);
  } catch {
    // fall through: isolate the failing owner(s)
  }
  /** @type {Outcome[]} */
  const outcomes = new Array(commits.length);
  for (const owner of new Set(commits.map((c) => c.owner))) {
    const own = commits.flatMap((c, i) => (c.owner === owner ? [i] : []));
    try {
      const done = await attempt(own.map((i) => commits[i]));
      own.forEach((i, j) => (outcomes[i] = done[j]));
    } catch (error) {
      for (const i of own) outcomes[i] = { error };
    }
  }
  return outcomes;
}

/**
 * A speculating scheduler's commit: rows that speculate get a draft (its length adapted per
 * row; all rows together within one decode's `nOutputs`), every row's token and draft go into
 * ONE `store.commitDrafts` (rows without a draft are plain commits in the same decode), and the
 * step's time feeds the cost fit. A draft source that fails fails the owners that drafted.
 * @param {any} store
 * @param {{ ctx: any, spec: any }} speculation the context and the scheduler's speculation
 * @param {Commit[]} commits
 * @returns {Promise<Committed>}
 */
async function commitSpeculative(store, { ctx, spec }, commits) {
  const wanted = commits.map((c) => (c.spec ? c.spec.length.next(c.spec.limit, commits.length) : 0));
  let over = wanted.reduce((a, b) => a + b, 0) - (Math.min(ctx.nOutputs, ctx.nBatch) - commits.length);
  while (over > 0 && Math.max(...wanted) > 0) {
    wanted[wanted.indexOf(Math.max(...wanted))]--;
    over--;
  }
  const jobs = commits.map((c, i) => ({
    source: spec.source,
    drafter: c.spec && c.spec.drafter,
    token: c.token,
    k: wanted[i],
  }));
  /** @type {Outcome[]} */
  const outcomes = new Array(commits.length);
  let started = 0;
  let drafts;
  let going = commits.map((_, i) => i);
  try {
    // A new line's one-time work (a draft model prefilling its prompt) stays out of the step's
    // measured cost; the drafting itself counts.
    for (const job of jobs) if (job.k > 0 && typeof job.drafter.prepare === 'function') await job.drafter.prepare();
    started = performance.now();
    drafts = await draftAll(jobs);
  } catch (error) {
    started = performance.now();
    // The draft source failed (e.g. its context was disposed): the owners that drafted fail.
    const failed = new Set(commits.filter((_, i) => wanted[i] > 0).map((c) => c.owner));
    for (const i of going) if (failed.has(commits[i].owner)) outcomes[i] = { error };
    going = going.filter((i) => !failed.has(commits[i].owner));
    drafts = commits.map(() => []);
  }
  const list = going.map((i) => ({ ...commits[i], draft: drafts[i] || [] }));
  // Every owner's draft source failed: nothing is left to decode, and no step to time.
  if (list.length === 0) return { outcomes, drafted: 0, accepted: 0, applied: () => {} };
  let drafted = 0;
  let accepted = 0;
  const done = await perOwnerOnFailure(list, async (part) => {
    const verified = await store.commitDrafts(part.map(({ branch, token, draft }) => [branch, token, draft]));
    return part.map((c, j) => {
      const v = verified[j];
      if (c.spec) c.spec.length.observe(c.draft.length, v.accepted.length);
      return { verified: { accepted: v.accepted, next: v.next, drafted: c.draft.length } };
    });
  });
  going.forEach((i, j) => {
    outcomes[i] = done[j];
    drafted += list[j].draft.length;
    if (!done[j].error) accepted += done[j].verified.accepted.length;
  });
  const applied = () => spec.cost.observe(going.length + drafted, performance.now() - started);
  return { outcomes, drafted, accepted, applied };
}

/**
 * ONE commit of `commits` (the tokens rows took), with drafts when `speculation` (the context
 * and the scheduler's speculation) is given; if it fails, per owner. See `Committed` for what
 * it returns.
 * @param {any} store
 * @param {Commit[]} commits
 * @param {{ ctx: any, spec: any } | null} speculation
 * @returns {Promise<Committed>}
 */
async function commitRows(store, commits, speculation) {
  const none = () => {};
  if (commits.length === 0) return { outcomes: [], drafted: 0, accepted: 0, applied: none };
  if (speculation) return commitSpeculative(store, speculation, commits);
  const outcomes = await perOwnerOnFailure(commits, async (list) => {
    await store.commit(list.map(({ branch, token }) => [branch, token]));
    return list.map(() => ({ verified: null }));
  });
  return { outcomes, drafted: 0, accepted: 0, applied: none };
}

module.exports = { produceAll, commitRows };
