'use strict';

/**
 * A radix tree over token sequences: the Scheduler's index of cached prompt prefixes. Each node
 * is reached by a run of tokens (its edge) from its parent and may hold one value (a cache
 * entry whose tokens are exactly the path from the root). Runs are split only where stored
 * sequences diverge, so a lookup costs O(prompt length) whatever the number of entries.
 */

class RadixNode {
  constructor(parent, edge) {
    this.parent = parent;
    /** Tokens on the edge from the parent to this node. */
    this.edge = edge;
    /** Children by the first token of their edge. */
    this.children = new Map();
    this.value = null;
    this.depth = parent ? parent.depth + edge.length : 0;
  }
}

/** Length of the common prefix of `edge` and `tokens[from...]`. */
function commonRun(edge, tokens, from) {
  let i = 0;
  while (i < edge.length && from + i < tokens.length && edge[i] === tokens[from + i]) i++;
  return i;
}

class RadixTree {
  constructor() {
    this.root = new RadixNode(null, []);
    this.size = 0;
  }

  /** Stores `value` under exactly `tokens` (replacing a value stored there). */
  insert(tokens, value) {
    let node = this.root;
    let at = 0;
    while (at < tokens.length) {
      const child = node.children.get(tokens[at]);
      if (!child) {
        const leaf = new RadixNode(node, tokens.slice(at));
        node.children.set(tokens[at], leaf);
        node = leaf;
        at = tokens.length;
        break;
      }
      const run = commonRun(child.edge, tokens, at);
      if (run < child.edge.length) this._split(child, run);
      node = node.children.get(tokens[at]);
      at += run;
    }
    if (node.value === null) this.size++;
    node.value = value;
    return node;
  }

  /** Splits `node`'s edge after `run` tokens: a new middle node takes the first part. */
  _split(node, run) {
    const parent = node.parent;
    const middle = new RadixNode(parent, node.edge.slice(0, run));
    parent.children.set(middle.edge[0], middle);
    node.edge = node.edge.slice(run);
    node.parent = middle;
    middle.children.set(node.edge[0], node);
  }

  /** The value stored under exactly `tokens`, or null. */
  get(tokens) {
    const { node, matched } = this._walk(tokens);
    return matched === tokens.length && node.depth === tokens.length ? node.value : null;
  }

  /** Removes the value stored under exactly `tokens`; returns whether there was one. */
  delete(tokens) {
    const { node, matched } = this._walk(tokens);
    if (matched !== tokens.length || node.depth !== tokens.length || node.value === null) return false;
    node.value = null;
    this.size--;
    this._compact(node);
    return true;
  }

  /** Drops empty leaves and merges a valueless node into its only child, up the path. */
  _compact(node) {
    while (node !== this.root && node.value === null) {
      const parent = node.parent;
      if (node.children.size === 0) {
        parent.children.delete(node.edge[0]);
      } else if (node.children.size === 1) {
        const [only] = node.children.values();
        only.edge = node.edge.concat(only.edge);
        only.parent = parent;
        parent.children.set(only.edge[0], only);
      } else {
        return;
      }
      node = parent;
    }
  }

  /**
   * Follows `tokens` down the tree. Returns `node` (the deepest node whose whole path matched),
   * `matched` (how many leading tokens of `tokens` are on some stored path: may end inside
   * an edge below `node`) and `below` (the child whose edge the match ended in, or null).
   */
  _walk(tokens) {
    let node = this.root;
    let at = 0;
    while (at < tokens.length) {
      const child = node.children.get(tokens[at]);
      if (!child) return { node, matched: at, below: null };
      const run = commonRun(child.edge, tokens, at);
      if (run < child.edge.length) return { node, matched: at + run, below: run > 0 ? child : null };
      node = child;
      at += run;
    }
    return { node, matched: at, below: null };
  }

  /**
   * The lookup the Scheduler needs for a new prompt:
   * - `prefix`: the value stored under the longest sequence that is a prefix of `tokens`
   *   (`tokens` itself included), with its `length`; null when none;
   * - `shared`: how many leading tokens of `tokens` some stored sequence has, and one value
   *   (under the deepest matched path) holding at least that many of them: the candidate for a
   *   partial fork (`forkAt`). It is at least as long as `prefix`.
   * Only values `accept` takes count (the prefix cache's: entries of one tier).
   * @param {number[]} tokens
   * @param {(value: any) => boolean} [accept]
   */
  match(tokens, accept = () => true) {
    const { node, matched, below } = this._walk(tokens);
    const prefix = this.longestPrefix(tokens, accept, node);
    const holder = matched > 0 ? firstValueIn(below || node, accept) : null;
    const shared = holder ? { value: holder, length: matched } : prefix;
    return { prefix, shared };
  }

  /**
   * The value `accept` takes under the longest sequence that is a prefix of `tokens` (`tokens`
   * itself included), with its `length`; null when none. `from`: where `tokens` leads (a walk done).
   * @param {number[]} tokens
   * @param {(value: any) => boolean} [accept]
   */
  longestPrefix(tokens, accept = () => true, from = this._walk(tokens).node) {
    for (let n = from; n; n = n.parent)
      if (n.value !== null && accept(n.value)) return { value: n.value, length: n.depth };
    return null;
  }

  /** Every stored value. */
  *values() {
    const stack = [this.root];
    while (stack.length) {
      const n = stack.pop();
      if (n.value !== null) yield n.value;
      for (const c of n.children.values()) stack.push(c);
    }
  }
}

/** A value `accept` takes stored at `node` or anywhere below it (the shallowest one found first). */
function firstValueIn(node, accept) {
  const queue = [node];
  for (let i = 0; i < queue.length; i++) {
    if (queue[i].value !== null && accept(queue[i].value)) return queue[i].value;
    for (const c of queue[i].children.values()) queue.push(c);
  }
  return null;
}

module.exports = { RadixTree, commonRun };
