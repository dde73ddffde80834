'use strict';

/**
 * Scoring texts as a line's continuation, as `select` and a multi-token `logprob` do: the texts
 * form a trie, each path of it is scored by one line (a fork) as a scored prefill entry, and a
 * token several texts share is scored once.
 */

/**
 * How `select` scores `options` (token arrays) so that a token several options share is scored
 * once: a trie of the options, cut into paths. A path starts at a token where options diverge
 * (at `depth` option tokens), follows the first option down to a leaf, and is scored by one
 * line, forked from its `parent` path's line at that depth (null: from the line selecting). Its
 * `ends` are the options ending on it, `[option, depth after the option's last token]`. One
 * path per leaf, so at most one line per option.
 * @param {number[][]} options
 * @returns {Array<{ parent: number | null, depth: number, tokens: number[], ends: Array<[number, number]> }>}
 */
function scoringPaths(options) {
  const node = () => ({ next: new Map(), ends: [] });
  const root = node();
  options.forEach((tokens, option) => {
    let at = root;
    for (const t of tokens) {
      if (!at.next.has(t)) at.next.set(t, node());
      at = at.next.get(t);
    }
    at.ends.push(option);
  });
  const paths = [];
  const walk = (token, from, parent, depth) => {
    const path = { parent, depth, tokens: [token], ends: [] };
    const index = paths.push(path) - 1;
    const forks = [];
    for (let at = from; ;) {
      const reached = depth + path.tokens.length;
      for (const option of at.ends) path.ends.push([option, reached]);
      const [first, ...rest] = at.next;
      if (!first) break;
      for (const [t, n] of rest) forks.push([t, n, reached]);
      path.tokens.push(first[0]);
      at = first[1];
    }
    for (const [t, n, at] of forks) walk(t, n, index, at);
  };
  for (const [t, n] of root.next) walk(t, n, null, 0);
  return paths;
}

/**
 * Starts scoring `paths` (see scoringPaths) of `tokens` after `line`: a line per path, forked
 * from `line` (or, with `bos`, from a fresh line holding only it) or from its parent path's line
 * where the texts part. Returns the lines, the texts' sums (a promise) and `leafOf(text)`: the
 * line whose KV ends exactly after that text, if one does.
 * @param {import('./program').Program} program the line's program, which makes the scoring lines
 * @param {import('./line').Line} line
 * @param {ReturnType<typeof scoringPaths>} paths
 * @param {number[][]} tokens
 * @param {number[] | null} bos
 */
function scorePaths(program, line, paths, tokens, bos) {
  const base = bos || line.tokens; // what every scoring line holds before its texts' tokens
  const lines = [];
  for (const path of paths) {
    if (path.parent === null) {
      lines.push(bos ? program.freshLine(bos) : program.spawn(line, 1)[0]);
      continue;
    }
    // Forked ahead: the parent path's line reaches this fork point once it has scored that far.
    const [option] = path.ends[0];
    lines.push(program.spawn(lines[path.parent], 1, [...base, ...tokens[option].slice(0, path.depth)])[0]);
  }
  // Each line's path is prefilled as a scored entry (a logits row per token), in the same decode as
  // every other line's and request's prefill of the step.
  const scored = Promise.all(lines.map((l, i) => l.score(paths[i].tokens)));
  const sums = scored.then((perPath) => {
    const logprobAt = (p, depth) =>
      depth >= paths[p].depth ? perPath[p][depth - paths[p].depth] : logprobAt(paths[p].parent, depth);
    const out = tokens.map(() => 0);
    for (const [p, path] of paths.entries()) {
      for (const [option, end] of path.ends) for (let d = 0; d < end; d++) out[option] += logprobAt(p, d);
    }
    return out;
  });
  const leafOf = (option) => {
    const p = paths.findIndex((path) =>
      path.ends.some(([o, end]) => o === option && end === path.depth + path.tokens.length),
    );
    return p < 0 ? null : lines[p];
  };
  return { lines, sums, leafOf };
}

/**
 * Scores `texts` (token arrays) as `line`'s continuation, each path of their trie in a fork (see
 * scorePaths); with `bos`, each also after only the BOS (`base`). The forks count against the
 * program's maxBranches (the line's ProgramLine takes no other work while they score). `use(sums, base,
 * leafOf)` runs before the forks are released (a select's winner takes its fork's branch then).
 * @template T
 * @param {import('./program').Program} program
 * @param {import('./line').Line} line
 * @param {number[][]} texts
 * @param {number[] | null} bos
 * @param {(sums: number[], base: number[] | null, leafOf: (text: number) => any) => T} use
 * @returns {Promise<T>}
 */
async function scoreTexts(program, line, texts, bos, use) {
  const paths = scoringPaths(texts);
  program.reserveLines(paths.length * (bos ? 2 : 1));
  const scorers = scorePaths(program, line, paths, texts, null);
  const unconditional = bos ? scorePaths(program, line, paths, texts, bos) : null;
  program.wake(); // the Scheduler serves the scoring lines from its next step
  try {
    const [sums, base] = await Promise.all([scorers.sums, unconditional && unconditional.sums]);
    return use(sums, base, scorers.leafOf);
  } finally {
    for (const scorer of [...scorers.lines, ...(unconditional ? unconditional.lines : [])]) scorer.release();
    program.wake(); // the next step frees them
  }
}

module.exports = { scoringPaths, scoreTexts };
