'use strict';

/**
 * The Scheduler's decode phase works on rows: one per line that samples this step
 * (`lineRow`: a program's line or a request's choice, both Lines), or `Branch.generate`'s one
 * branch. A row is
 * `{ branch, owner, live(), take(produced), committed(token), fail(error) }`: `take` says
 * whether the sampled token is to be decoded now, `committed` hears that it was, and a failure
 * goes to `fail` of the rows of one owner only, so one request's bad grammar or one program's
 * error never ends the others. `decodeAll` is the phase's one produce and one commit (with
 * drafts when the scheduler speculates).
 */

/**
 * @typedef {object} DecodeRow
 * @property {any} branch
 * @property {any} owner
 * @property {any} [carried] the `Produced` a speculative step sampled for this row: taken instead of sampling
 * @property {{ drafter: any, length: any, limit: () => number }} [spec] a row that speculates
 * @property {(token: number, accepted: any[], next: any, drafted: number) => void} [verified] a speculative step's outcome
 * @property {() => boolean} live
 * @property {(produced: any) => boolean} take
 * @property {(token: number) => void} committed
 * @property {(error: any) => void} fail
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
  return rows.map((r) => {
    return r.carried !== undefined ? r.carried : produced[next++];
  });
}

/**
 * Runs `attempt` on all `commits` at once; if it throws, once per owner, so that one owner's
 * failure (its grammar, its draft) stays its own: that owner's first live row hears the error.
 * Returns the sum of what the successful attempts returned.
 * @param {Array<{ row: DecodeRow }>} commits
 * @param {(list: any[]) => Promise<number>} attempt
 */
async function perOwnerOnFailure(commits, attempt) {
  try {
    return await attempt(commits);
  } catch {
    // fall through: isolate the failing owner(s)
  }
  let total = 0;
  for (const owner of new Set(commits.map((c) => c.row.owner))) {
    const own = commits.filter((c) => c.row.owner === owner);
    try {
      total += await attempt(own);
    } catch (e) {
      if (own[0].row.live()) own[0].row.fail(e);
    }
  }
  return total;
}

/** ONE `store.commit` of `{row, token}`s; if it fails, per owner. */
async function commitAll(store, commits) {
  await perOwnerOnFailure(commits, async (list) => {
    await store.commit(list.map(({ row, token }) => [row.branch, token]));
    for (const { row, token } of list) row.committed(token);
    return 0;
  });
}

/**
 * A speculative step's ONE `store.commitDrafts` of `{row, token, draft}`s (rows that do not
 * speculate have empty drafts: plain commits in the same decode); if it fails, per owner.
 * Returns the number of draft tokens accepted.
 */
function commitDraftsAll(store, commits) {
  return perOwnerOnFailure(commits, async (list) => {
    const verified = await store.commitDrafts(list.map(({ row, token, draft }) => [row.branch, token, draft]));
    let accepted = 0;
    list.forEach(({ row, token, draft }, i) => {
      const v = verified[i];
      row.committed(token);
      accepted += v.accepted.length;
      if (row.spec) row.spec.length.observe(draft.length, v.accepted.length);
      if (row.verified && row.live()) row.verified(token, v.accepted, v.next, draft.length);
    });
    return accepted;
  });
}

/**
 * The commit of a speculating scheduler: rows that speculate get a draft (its length adapted
 * per row; all rows together within one decode's `nOutputs`), every row's token and draft go
 * into ONE `store.commitDrafts`, and the step's time feeds the cost fit. Returns the count of
 * draft tokens drafted and accepted.
 * @param {any} store
 * @param {{ ctx: any, spec: any }} speculation the context and the scheduler's speculation
 * @param {Array<{ row: any, token: number, draft?: number[] }>} commits
 */
async function commitSpeculative(store, { ctx, spec }, commits) {
  const wanted = commits.map((c) => (c.row.spec ? c.row.spec.length.next(c.row.spec.limit(), commits.length) : 0));
  let over = wanted.reduce((a, b) => a + b, 0) - (Math.min(ctx.nOutputs, ctx.nBatch) - commits.length);
  while (over > 0 && Math.max(...wanted) > 0) {
    wanted[wanted.indexOf(Math.max(...wanted))]--;
    over--;
  }
  const jobs = commits.map((c, i) => ({
    source: spec.source,
    drafter: c.row.spec && c.row.spec.drafter,
    token: c.token,
    k: wanted[i],
  }));
  let started = 0;
  let drafts;
  try {
    // A new line's one-time work (a draft model prefilling its prompt) stays out of the step's
    // measured cost; the drafting itself counts.
    for (const job of jobs) if (job.k > 0 && typeof job.drafter.prepare === 'function') await job.drafter.prepare();
    started = performance.now();
    drafts = await draftAll(jobs);
  } catch (e) {
    started = performance.now();
    // The draft source failed (e.g. its context was disposed): the rows that drafted fail.
    for (const c of commits.filter((_, i) => wanted[i] > 0)) if (c.row.live()) c.row.fail(e);
    commits = commits.filter((c) => c.row.live());
    drafts = commits.map(() => []);
    if (commits.length === 0) return { drafted: 0, accepted: 0 };
  }
  commits.forEach((c, i) => (c.draft = drafts[i] || []));
  const accepted = await commitDraftsAll(store, commits);
  const drafted = commits.reduce((sum, c) => sum + c.draft.length, 0);
  spec.cost.observe(commits.length + drafted, performance.now() - started);
  return { drafted, accepted };
}

/**
 * The decode of one step: ONE produce for all `rows` (a row whose sampling failed hears it),
 * then ONE commit of every live row that takes its token; with `speculation` (the context and
 * the scheduler's speculation), a commit with drafts. Returns the count of rows committed and
 * of draft tokens drafted and accepted.
 * @param {any} store
 * @param {DecodeRow[]} rows
 * @param {{ ctx: any, spec: any } | null} speculation
 * @returns {Promise<{ committed: number, drafted: number, accepted: number }>}
 */
async function decodeAll(store, rows, speculation) {
  const produced = produceAll(store, rows);
  rows.forEach((row, i) => {
    if (produced[i] instanceof Error && row.live()) row.fail(produced[i]);
  });
  const commits = [];
  rows.forEach((row, i) => {
    if (row.live() && row.take(produced[i])) commits.push({ row, token: produced[i].token });
  });
  let drafts = { drafted: 0, accepted: 0 };
  if (commits.length > 0) {
    if (speculation) drafts = await commitSpeculative(store, speculation, commits);
    else await commitAll(store, commits);
  }
  return { committed: commits.length, ...drafts };
}

/**
 * The decode row of `line`'s gen (a program's line or a request's choice); its owner and what
 * its failure does are its `program`'s (a request's rows fail together). A line whose gen
 * drafts speculates.
 * @param {any} line @param {any} job @param {import('./program').Program} program
 */
function lineRow(line, job, program) {
  const live = () => line.job === job && line.decoding;
  /** @type {DecodeRow} */
  const row = {
    branch: line.branch,
    owner: program.ownerOf(line),
    carried: job.next,
    live,
    take: (produced) => line.take(produced),
    committed: (token) => line.committed(token),
    fail: (error) => program.lineFailed(line, error),
  };
  if (!job.drafter) return row;
  return {
    ...row,
    spec: {
      drafter: job.drafter,
      length: job.draftLength,
      // The last token comes from `next`, accepted without a decode, as without speculation.
      limit: () => job.maxTokens - job.tokens.length - 1,
    },
    verified: (token, accepted, next, drafted) => line.verified({ token, accepted, next, drafted }),
  };
}

module.exports = { decodeAll, lineRow };
