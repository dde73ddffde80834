'use strict';

// The shape of lib/ (issue "one kind of work item"): no import cycle, layers that only look down,
// no function-level require in lib/'s core, and no `_underscore` member used outside the file that
// defines it. Read from the
// sources as text, so it runs without the addon.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');

const LIB = path.join(__dirname, '..', '..', 'lib');

/** Every .js file under lib/, as paths relative to lib/. */
function libFiles() {
  return fs
    .readdirSync(LIB, { recursive: true })
    .filter((f) => f.endsWith('.js'))
    .map((f) => f.split(path.sep).join('/'))
    .sort();
}

const read = (file) => fs.readFileSync(path.join(LIB, file), 'utf8');

/** The lib/ files `file` requires (relative requires only). */
function requiresOf(file) {
  const out = [];
  for (const m of read(file).matchAll(/require\('(\.{1,2}\/[^']*)'\)/g)) {
    let target = path.posix.normalize(path.posix.join(path.posix.dirname(file), m[1]));
    if (!target.endsWith('.js'))
      target = fs.existsSync(path.join(LIB, `${target}.js`)) ? `${target}.js` : `${target}/index.js`;
    out.push(target);
  }
  return out;
}

/** The cycles of the require graph (`edges(file)`: what it requires), each as a path `a -> b -> a`. */
function cycles(files, edges = requiresOf) {
  const state = new Map();
  const found = [];
  const visit = (file, stack) => {
    state.set(file, 'open');
    stack.push(file);
    for (const next of edges(file)) {
      if (state.get(next) === 'open') found.push([...stack.slice(stack.indexOf(next)), next].join(' -> '));
      else if (!state.has(next)) visit(next, stack);
    }
    stack.pop();
    state.set(file, 'done');
  };
  for (const f of files) if (!state.has(f)) visit(f, []);
  return found;
}

/** Every lib/ file `file` reaches through its requires (itself excluded). */
function reachable(file, edges = requiresOf) {
  const seen = new Set();
  const stack = [...edges(file)];
  while (stack.length) {
    const next = stack.pop();
    if (next === file || seen.has(next)) continue;
    seen.add(next);
    stack.push(...edges(next));
  }
  return seen;
}

/**
 * The layers of lib/, bottom up: each file named here may reach only files of its own layer or
 * below (through any chain of requires), never the layers above it.
 */
const LAYERS = [
  // a branch's decode step, shared by Branch.generate and the Scheduler; draft sources; traces
  (f) => f.startsWith('decode/') || ['speculative.js', 'trace.js', 'Context.js'].includes(f),
  (f) => f === 'Branch.js',
  (f) => f === 'BranchStore.js',
  (f) => f === 'ProgramLine.js' || f === 'Scheduler.js' || f.startsWith('scheduler/'),
];

/** `[file, what it reaches above its layer]` for every file that breaks the layer order. */
function layerBreaks(files, edges = requiresOf) {
  const layerOf = (f) => LAYERS.findIndex((inLayer) => inLayer(f));
  const out = [];
  for (const file of files) {
    const own = layerOf(file);
    if (own < 0) continue;
    const above = [...reachable(file, edges)].filter((f) => layerOf(f) > own);
    if (above.length) out.push(`${file} reaches ${above.sort().join(', ')}`);
  }
  return out;
}

/** Names of `_underscore` members a file defines: assigned on `this`, methods, getters, object keys. */
function definedUnderscores(src) {
  const names = new Set();
  for (const m of src.matchAll(/this\.(_[A-Za-z]\w*)\s*=[^=]/g)) names.add(m[1]);
  for (const m of src.matchAll(/^\s*(?:static\s+|async\s+|get\s+|set\s+|\*\s*)*(_[A-Za-z]\w*)\s*\(/gm)) names.add(m[1]);
  for (const m of src.matchAll(/^\s*(_[A-Za-z]\w*)\s*:/gm)) names.add(m[1]);
  return names;
}

/** The native addon's own `_` methods (lib/native.d.ts, generated from the Rust): the binding's surface. */
function nativeUnderscores() {
  return new Set(fs.readFileSync(path.join(LIB, 'native.d.ts'), 'utf8').match(/\b_[A-Za-z]\w*/g) || []);
}

describe('lib/ structure', function () {
  const files = libFiles();

  it('has no import cycle', function () {
    assert.deepEqual(cycles(files), []);
  });

  it('stacks its layers: decode/ below Branch.js below BranchStore.js below the Scheduler', function () {
    // Branch.generate and the Scheduler's decode phase share ./decode/ (rows, speculation), so a
    // reader of Branch never meets the Scheduler; a draft model's lines are native handles, so
    // draft sources need no Branch.
    assert.deepEqual(layerBreaks(files), []);
  });

  it('has no function-level require in its core', function () {
    // lib/cli/ holds the command modules bin/llama-branch.js loads one per command: they may load
    // the addon only when a command runs, so that `--help` works without a build. lib/loader.js
    // requires the addon's .node file it found: loading it is its job, not an import.
    const exempt = (file, line) => file.startsWith('cli/') || (file === 'loader.js' && /require\(real\)/.test(line));
    const offending = [];
    for (const file of files) {
      read(file)
        .split('\n')
        .forEach((line, i) => {
          if (/^\s+.*\brequire\(/.test(line) && !/^\s*\*/.test(line) && !exempt(file, line))
            offending.push(`${file}:${i + 1}: ${line.trim()}`);
        });
    }
    assert.deepEqual(offending, []);
  });

  it('uses no `_underscore` member outside the file that defines it', function () {
    const native = nativeUnderscores();
    const offending = [];
    for (const file of files) {
      const src = read(file);
      const own = definedUnderscores(src);
      for (const m of src.matchAll(/\.(_[A-Za-z]\w*)/g)) {
        if (!own.has(m[1]) && !native.has(m[1])) offending.push(`${file}: .${m[1]}`);
      }
    }
    assert.deepEqual([...new Set(offending)], []);
  });

  it('the checks find what they look for (a cycle, a lazy require, a foreign underscore)', function () {
    // The rules above pass on lib/; these inputs show they would fail on a violation.
    assert.ok(definedUnderscores('class A {\n  _x() {}\n}').has('_x'));
    assert.ok(!definedUnderscores('other._x();').has('_x'));
    assert.ok(/^\s+.*\brequire\(/.test("  const { a } = require('./a');"));
    assert.deepEqual(
      cycles(['a', 'b'], (f) => (f === 'a' ? ['b'] : ['a'])),
      ['a -> b -> a'],
    );
    assert.ok(requiresOf('index.js').includes('Branch.js'));
    const up = {
      'decode/rows.js': ['decode/x.js'],
      'decode/x.js': ['scheduler/programs.js'],
      'scheduler/programs.js': [],
    };
    assert.deepEqual(
      layerBreaks(Object.keys(up), (f) => up[f]),
      ['decode/rows.js reaches scheduler/programs.js', 'decode/x.js reaches scheduler/programs.js'],
    );
  });
});
