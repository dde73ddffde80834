'use strict';

// The shape of lib/ (issues "one kind of work item", "one of each"): no import cycle, layers that
// only look down, no function-level require in lib/'s core, no `_underscore` member used outside
// the file that defines it, and no write to a field of another file's class. Read from the sources
// (the last through TypeScript's checker, from lib's JSDoc types), so it runs without the addon.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const os = require('node:os');
const ts = require('typescript');

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

/** Where ARCHITECTURE.md's layer drawing puts the description: the names are the columns before. */
const NAMES_WIDTH = 28;

/**
 * The layers of lib/, bottom up, as ARCHITECTURE.md draws them ("lib's layers", top row highest;
 * a row whose names end with a comma goes on in the next; a row naming no lib/ path, the native
 * addon's, is not lib/'s): each a test of whether a file is in it (`dir/` names a folder).
 * @returns {((file: string) => boolean)[]}
 */
function drawnLayers(markdown = fs.readFileSync(path.join(LIB, '..', 'ARCHITECTURE.md'), 'utf8')) {
  const section = markdown.slice(markdown.indexOf("## lib's layers"));
  const drawing = section.slice(section.indexOf('```\n') + 4, section.indexOf('\n```', section.indexOf('```') + 3));
  const rows = [];
  let open = false;
  for (const line of drawing.split('\n')) {
    const names = line.slice(0, NAMES_WIDTH).trim();
    if (!open && names === '') continue;
    const list = names
      .split(',')
      .map((n) => n.trim())
      .filter(Boolean);
    if (!list.every((n) => /^[\w.-]+(\.js|\/)$/.test(n))) continue;
    if (open) rows[rows.length - 1].push(...list);
    else rows.push(list);
    open = names.endsWith(',');
  }
  const inRow = (/** @type {string[]} */ row) => (/** @type {string} */ f) =>
    row.some((n) => (n.endsWith('/') ? f.startsWith(n) : f === n));
  return rows.reverse().map(inRow);
}

const LAYERS = drawnLayers();

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

const MUTATORS = new Set(['push', 'pop', 'shift', 'unshift', 'splice', 'sort', 'reverse', 'fill', 'copyWithin']);

/**
 * Writes in `program`'s files under `root` to a field of a class another file defines: `x.f = `,
 * `x.f += `, `x.f++`, a destructuring target `x.f`, and `x.f.push(...)` (and the other mutating
 * array methods), where `x` is not `this`. The field is found through the checker, so only what
 * lib's JSDoc types reach is seen (an untyped `any` hides a write). Returns `file:line: x.f (Class,
 * its file)` per write.
 * @param {import('typescript').Program} program
 * @param {string} root
 */
function foreignWrites(program, root) {
  const checker = program.getTypeChecker();
  const isAssignment = (kind) => kind >= ts.SyntaxKind.FirstAssignment && kind <= ts.SyntaxKind.LastAssignment;
  const classOf = (node) => {
    for (let n = node; n; n = n.parent) if (ts.isClassLike(n)) return n;
    return null;
  };
  /** The class (and its file) that declares the field `access` names, if a class does. */
  const ownerOf = (access) => {
    const symbol = checker.getSymbolAtLocation(access.name);
    for (const decl of (symbol && symbol.declarations) || []) {
      const cls = classOf(decl);
      if (cls) return { file: decl.getSourceFile().fileName, name: cls.name ? cls.name.text : '(class)' };
    }
    return null;
  };
  /** The property accesses `node` writes. */
  const targets = (node) => {
    if (ts.isBinaryExpression(node) && isAssignment(node.operatorToken.kind)) {
      const left = node.left;
      if (ts.isObjectLiteralExpression(left))
        return left.properties.flatMap((p) => (ts.isPropertyAssignment(p) ? [p.initializer] : []));
      if (ts.isArrayLiteralExpression(left)) return [...left.elements];
      return [left];
    }
    const increments = [ts.SyntaxKind.PlusPlusToken, ts.SyntaxKind.MinusMinusToken];
    if ((ts.isPrefixUnaryExpression(node) || ts.isPostfixUnaryExpression(node)) && increments.includes(node.operator))
      return [node.operand];
    if (ts.isCallExpression(node) && ts.isPropertyAccessExpression(node.expression)) {
      if (MUTATORS.has(node.expression.name.text)) return [node.expression.expression];
    }
    return [];
  };
  const out = [];
  for (const file of program.getSourceFiles()) {
    if (!file.fileName.startsWith(root + '/') || !file.fileName.endsWith('.js')) continue;
    const visit = (node) => {
      for (const target of targets(node)) {
        if (!ts.isPropertyAccessExpression(target) || target.expression.kind === ts.SyntaxKind.ThisKeyword) continue;
        const owner = ownerOf(target);
        if (!owner || owner.file === file.fileName) continue;
        const { line } = file.getLineAndCharacterOfPosition(target.getStart());
        const where = `${path.relative(root, file.fileName)}:${line + 1}`;
        out.push(`${where}: ${target.getText()} (${owner.name}, ${path.relative(root, owner.file)})`);
      }
      ts.forEachChild(node, visit);
    };
    visit(file);
  }
  return out;
}

/** A TypeScript program over lib/ as `tsc -p lib` sees it. */
function libProgram() {
  const host = { ...ts.sys, onUnRecoverableConfigFileDiagnostic: () => {} };
  const config = ts.getParsedCommandLineOfConfigFile(path.join(LIB, 'tsconfig.json'), {}, host);
  return ts.createProgram({ rootNames: config.fileNames, options: config.options });
}

describe('lib/ structure', function () {
  const files = libFiles();

  it('has no import cycle', function () {
    assert.deepEqual(cycles(files), []);
  });

  it("stacks its layers as ARCHITECTURE.md draws them, every file in one: decode/ below Branch.js below the Scheduler's", function () {
    // Branch.generate and the Scheduler's decode phase share ./decode/ (rows, speculation), so a
    // reader of Branch never meets the Scheduler; a draft model's lines are native handles, so
    // draft sources need no Branch; decisions are a client of programs' lines.
    assert.ok(LAYERS.length >= 8, `${LAYERS.length} layers read from ARCHITECTURE.md`);
    const placed = files.map((f) => [f, LAYERS.filter((inLayer) => inLayer(f)).length]);
    assert.deepEqual(
      placed.filter(([, n]) => n !== 1),
      [],
      'each lib/ file in exactly one drawn layer',
    );
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

  it("writes no field of another file's class (a class's fields change through its own methods)", function () {
    this.timeout(120000); // the checker reads all of lib/
    const root = fs.realpathSync(LIB);
    assert.deepEqual(foreignWrites(libProgram(), root), []);
  });

  it("keeps a Line's state private: other files read it through getters and change it through its verbs", function () {
    // Issue 47: `Line` was a bag of public fields four other files wrote; only its id is public now.
    const src = read('scheduler/line.js');
    const publicFields = [...src.matchAll(/\bthis\.([A-Za-z]\w*)\s*=[^=]/g)].map((m) => m[1]);
    assert.deepEqual([...new Set(publicFields)], ['id']);
    assert.match(src, /^ {2}#state = 'waiting';$/m);
  });

  it('the checks find what they look for (a cycle, a lazy require, a foreign underscore, a foreign write)', function () {
    this.timeout(120000); // a TypeScript program over two files
    // The rules above pass on lib/; these inputs show they would fail on a violation.
    assert.ok(definedUnderscores('class A {\n  _x() {}\n}').has('_x'));
    assert.ok(!definedUnderscores('other._x();').has('_x'));
    assert.ok(/^\s+.*\brequire\(/.test("  const { a } = require('./a');"));
    assert.deepEqual(
      cycles(['a', 'b'], (f) => (f === 'a' ? ['b'] : ['a'])),
      ['a -> b -> a'],
    );
    assert.ok(requiresOf('index.js').includes('Branch.js'));
    const drawn = drawnLayers(
      [
        "## lib's layers",
        '```',
        'top.js                      high',
        'a/, b.js,                   low',
        '  c.js                      low too',
        'addon (src/)                not lib',
        '```',
      ].join('\n'),
    );
    assert.deepEqual(
      ['c.js', 'a/x.js', 'top.js', 'z.js'].map((f) => drawn.findIndex((inLayer) => inLayer(f))),
      [0, 0, 1, -1],
    );
    const up = {
      'decode/rows.js': ['decode/x.js'],
      'decode/x.js': ['scheduler/programs.js'],
      'scheduler/programs.js': [],
    };
    assert.deepEqual(
      layerBreaks(Object.keys(up), (f) => up[f]),
      ['decode/rows.js reaches scheduler/programs.js', 'decode/x.js reaches scheduler/programs.js'],
    );
    // Two files: b.js writes a field of a.js's class four ways, and its own class's (allowed).
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lib-structure-'));
    try {
      fs.writeFileSync(
        path.join(dir, 'a.js'),
        'class A {\n  constructor() {\n    this.n = 0;\n    this.list = [];\n  }\n}\nmodule.exports = { A };\n',
      );
      fs.writeFileSync(
        path.join(dir, 'b.js'),
        [
          "const { A } = require('./a');",
          'class B {\n  constructor() {\n    this.m = 0;\n  }\n}',
          'const a = new A();',
          'const b = new B();',
          'a.n = 1;\na.n++;\na.list.push(2);\n[a.n] = [3];\nb.m = 4;',
        ].join('\n'),
      );
      const options = { allowJs: true, checkJs: true, noEmit: true, module: ts.ModuleKind.CommonJS };
      const program = ts.createProgram({ rootNames: [path.join(dir, 'b.js')], options });
      const writes = foreignWrites(program, fs.realpathSync(dir));
      assert.deepEqual(
        writes.map((w) => w.replace(/^b\.js:\d+: /, '')),
        ['a.n (A, a.js)', 'a.n (A, a.js)', 'a.list (A, a.js)', 'a.n (A, a.js)'],
      );
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
