'use strict';

/**
 * The Scheduler's decode phase works on rows: one per branch that samples this step, whatever
 * owns it (a request's choice or a program's line). A row is
 * `{ branch, owner, live(), take(produced), committed(token), fail(error) }`: `take` says
 * whether the sampled token is to be decoded now, `committed` hears that it was, and a failure
 * goes to `fail` of the rows of one owner only, so one request's bad grammar or one program's
 * error never ends the others.
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

module.exports = { produceAll, commitAll, commitDraftsAll };
