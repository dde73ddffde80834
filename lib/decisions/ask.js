'use strict';

/**
 * Asking a planned decision (./plan.js) on a state line, over the public API of branch programs
 * only (a line's `fork`, `append`, `logprobs`, `select`, `logprob`, `release`): each task is a
 * fork of the state with its question appended; every fork's read is issued at once, so the
 * Scheduler prefills the forks' texts and reads their answers in the same steps (and beside
 * everything else it runs). The probabilities are a softmax over the options alone, averaged over
 * a question's `permute` orders. Both `scheduler.decide` and `line.decide` call `ask`.
 */

/** A counting semaphore over the lines a decision may hold at once. */
function lineBudget(total) {
  let free = total;
  const waiting = [];
  return {
    async take(n) {
      const want = Math.min(n, total);
      if (free >= want && waiting.length === 0) {
        free -= want;
        return want;
      }
      await new Promise((resolve) => waiting.push({ want, resolve }));
      return want;
    },
    give(n) {
      free += n;
      while (waiting.length > 0 && free >= waiting[0].want) {
        const next = waiting.shift();
        free -= next.want;
        next.resolve();
      }
    },
  };
}

/**
 * One task on a fork of `stateLine`: its log-scores per option (option order). Label mode reads
 * the label tokens from the fork's one logits row; text mode scores the option texts with
 * `select`, in chunks of what the budget allows when there are many.
 */
async function scoreTask(stateLine, task, budget, forks) {
  const held = await budget.take(task.lines);
  const line = stateLine.fork(1)[0];
  forks.push(line.id);
  try {
    line.append(task.text);
    if (task.ids) return await line.logprobs(task.ids);
    const { texts, order } = task;
    const n = texts.length;
    const scores = new Array(n);
    const put = (from, list) =>
      list.forEach((s, j) => {
        scores[order[from + j]] = s;
      });
    if (n <= held - 1) {
      put(0, (await line.select(texts)).scores); // every option's fork at once: one trie
    } else if (held - 2 >= 2) {
      // More options than lines: a fork per chunk scores its options (the sums are absolute
      // log-probabilities, so chunks compare), one chunk after another.
      const chunk = held - 2;
      for (let from = 0; from < n; from += chunk) {
        const scorer = line.fork(1)[0];
        try {
          put(from, (await scorer.select(texts.slice(from, from + chunk))).scores);
        } finally {
          scorer.release();
        }
      }
    } else {
      for (let i = 0; i < n; i++) put(i, [(await line.logprob(texts[i])).logprob]);
    }
    return scores;
  } finally {
    line.release();
    budget.give(held);
  }
}

/**
 * One planned question's tasks, on forks of `stateLine`; a question with images on forks of one
 * line holding its head (its text up to its instructions' end, images and all), which takes one
 * line of the budget with what its widest task needs: each image is encoded once for every order.
 */
async function scoreItem(stateLine, { tasks, head }, budget, forks) {
  if (!head) return Promise.all(tasks.map((t) => scoreTask(stateLine, t, budget, forks)));
  const held = await budget.take(1 + Math.max(...tasks.map((t) => t.lines)));
  const line = stateLine.fork(1)[0];
  forks.push(line.id);
  try {
    line.append(head);
    const own = lineBudget(held - 1); // the plan's width check leaves it ≥ the tasks' need
    return await Promise.all(tasks.map((t) => scoreTask(line, t, own, forks)));
  } finally {
    line.release();
    budget.give(held);
  }
}

/** Softmax of log-scores. */
function softmax(scores) {
  const max = Math.max(...scores);
  const e = scores.map((s) => Math.exp(s - max));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / sum);
}

/** The protocols' confidence: 0 when every option is as likely, 1 when one holds all. */
function confidenceOf(p) {
  const n = p.length;
  return Math.min(1, Math.max(0, (Math.max(...p) - 1 / n) / (1 - 1 / n)));
}

/**
 * Asks every item of `items` (planned questions) on forks of `stateLine`, at most `parallel`
 * lines at once. Resolves with each item's option probabilities (option order) and what the
 * `decision` event shows of it (its forks, each option's probability, the answer, confidence).
 * @param {{ fork: (n: number) => any[] }} stateLine
 * @param {any[]} items
 * @param {number} parallel
 * @returns {Promise<{ probabilities: number[][], shown: any[] }>}
 */
async function ask(stateLine, items, parallel) {
  const budget = lineBudget(parallel);
  const forks = items.map(() => []);
  const scored = await Promise.all(items.map((item, q) => scoreItem(stateLine, item, budget, forks[q])));
  const probabilities = scored.map((runs, q) => {
    const ps = runs.map(softmax);
    return items[q].question.options.map((_, i) => ps.reduce((s, r) => s + r[i], 0) / ps.length);
  });
  const shown = items.map(({ question, reading }, q) => {
    const p = probabilities[q];
    const best = p.reduce((b, x, i) => (x > p[b] ? i : b), 0);
    const answer =
      question.type === 'noul'
        ? p[0]
        : question.type === 'choice'
          ? question.options[best].name
          : p.reduce((s, x, i) => s + i * x, 0);
    return {
      name: question.name === null ? question.param : question.name, // an unnamed OpenAI question: its place
      type: question.type,
      read: reading.mode,
      branches: forks[q],
      options: question.options.map((o, i) => ({ name: o.name, p: Math.round(p[i] * 10000) / 10000 })),
      answer, // noul: P(true); choice: the winner's name; score: the level index
      confidence: confidenceOf(p),
    };
  });
  return { probabilities, shown };
}

module.exports = { ask, confidenceOf };
