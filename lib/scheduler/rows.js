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
 * @property {number} [force] the token a teacher-forced row commits (no sampling)
 * @property {() => boolean} live
 * @property {(produced: any) => boolean} take
 * @property {(token: number) => void} committed
 * @property {(error: any) => void} fail
 */

/**
 * One `store.produce` for all rows that sample; if it throws (e.g. a grammar masks everything),
 * per branch to find whose. A teacher-forced row (`force`: a scoring line) takes its token as
 * given. Returns each row's `Produced` or Error, in row order.
 */
function produceAll(store, rows) {
  const sampled = rows.filter((r) => r.force === undefined);
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
  return rows.map((r) => (r.force === undefined ? produced[next++] : { token: r.force, text: '', isStop: false }));
}

/** ONE `store.commit` of `{row, token}`s; if it fails, per owner, so that one owner's failure stays its own. */
async function commitAll(store, commits) {
  try {
    await store.commit(commits.map(({ row, token }) => [row.branch, token]));
    for (const { row, token } of commits) row.committed(token);
    return;
  } catch {
    // fall through: isolate the failing owner(s)
  }
  for (const owner of new Set(commits.map((c) => c.row.owner))) {
    const own = commits.filter((c) => c.row.owner === owner);
    try {
      await store.commit(own.map(({ row, token }) => [row.branch, token]));
      for (const { row, token } of own) row.committed(token);
    } catch (e) {
      if (own[0].row.live()) own[0].row.fail(e);
    }
  }
}

module.exports = { produceAll, commitAll };
