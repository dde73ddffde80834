'use strict';

// The docs must stay true: every ```js block of README.md and docs/*.md runs (on the test model),
// every output a block states (`console.log(x); // → 7`) is what it prints, every relative link
// points at a file that exists, and docs/reference/ is the reference TypeDoc generates from the
// typings (where each member is documented once).
// A block without its own `require(...)` is a fragment: it runs after a prelude that imports
// every export of the package and, unless the block declares its own, opens `ctx` (nSeqMax 8).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const ts = require('typescript');
const { MODEL } = require('./helpers');

const ROOT = path.join(__dirname, '..');
const DOCS = [
  'README.md',
  ...fs
    .readdirSync(path.join(ROOT, 'docs'))
    .filter((f) => f.endsWith('.md'))
    .map((f) => `docs/${f}`),
  'bench/RESULTS.md',
  'ARCHITECTURE.md',
];
const DEFAULT_MODEL_IN_DOCS = 'models/gemma-3-270m-q4_k_m.gguf';
/** `console.log(...); // → expected  (optional remark)` states what the line prints. */
const STATED = /console\.log\((.*)\);\s*\/\/ → (.+?)(?:\s{2,}\(.*\))?\s*$/;

function jsBlocks(markdown) {
  return [...markdown.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
}

/**
 * The block with each stated console.log checked: `__stated(i, ...)` prints like console.log and
 * throws when the text differs from the i-th stated output; the end checks each one ran.
 */
function withStatedOutputs(code) {
  const expected = [];
  const body = code
    .split('\n')
    .map((line) => {
      const m = STATED.exec(line);
      if (!m) return line;
      expected.push(m[2].trim());
      return line.replace('console.log(', `__stated(${expected.length - 1}, `);
    })
    .join('\n');
  const prelude = `const __expected = ${JSON.stringify(expected)}; const __seen = new Set();
const __stated = (i, ...args) => {
  const got = require('node:util').format(...args);
  console.log(got);
  if (got !== __expected[i]) throw new Error('stated output #' + (i + 1) + ' is ' + JSON.stringify(__expected[i]) + ' but the line printed ' + JSON.stringify(got));
  __seen.add(i);
};\n`;
  const check = `\nif (__seen.size !== __expected.length) throw new Error('only ' + __seen.size + ' of ' + __expected.length + ' stated outputs were printed');\n`;
  return { body: prelude + body + check, stated: expected.length };
}

/** Names of exports of index.d.ts and public members of the classes it re-exports from types/. */
function declaredNames() {
  const names = [];
  const exported = (n) => (ts.getModifiers(n) || []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
  const read = (file) => ts.createSourceFile(file, fs.readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  for (const stmt of read(path.join(ROOT, 'index.d.ts')).statements) {
    if (ts.isExportDeclaration(stmt) && !stmt.isTypeOnly && stmt.exportClause)
      names.push(...stmt.exportClause.elements.map((e) => e.name.text));
    if (!exported(stmt)) continue;
    if (ts.isFunctionDeclaration(stmt)) names.push(stmt.name.text);
    if (ts.isVariableStatement(stmt)) for (const d of stmt.declarationList.declarations) names.push(d.name.text);
  }
  for (const name of ['Context', 'Branch', 'BranchStore', 'Scheduler']) {
    for (const stmt of read(path.join(ROOT, 'types', `${name}.d.ts`)).statements) {
      if (!ts.isClassDeclaration(stmt)) continue;
      for (const m of stmt.members) {
        if (ts.isConstructorDeclaration(m) || !m.name || ts.isPrivateIdentifier(m.name)) continue;
        if ((ts.getModifiers(m) || []).some((x) => x.kind === ts.SyntaxKind.PrivateKeyword)) continue;
        names.push(ts.isComputedPropertyName(m.name) ? m.name.expression.getText() : m.name.text);
      }
    }
  }
  return [...new Set(names)];
}

function runBlock(code, label) {
  const { body: checked } = withStatedOutputs(code.split(DEFAULT_MODEL_IN_DOCS).join(MODEL));
  let prelude = '';
  if (!/\brequire\(/.test(code)) {
    prelude = `const { ${Object.keys(require('..')).join(', ')} } = require('llama-branch');\n`;
    if (!/\b(const|let|var)\s+ctx\b/.test(code)) {
      prelude += `const ctx = await createContext({ modelPath: ${JSON.stringify(MODEL)}, nCtx: 4096, nSeqMax: 8 });\n`;
    }
  }
  // Run from the repository root (so `require('llama-branch')` resolves to this package), with
  // top-level await wrapped for CommonJS.
  const program = `(async () => {\n${prelude}${checked}\n})().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });`;
  const res = spawnSync(process.execPath, ['-e', program], { cwd: ROOT, encoding: 'utf8', timeout: 290000 });
  assert.equal(res.status, 0, `${label} failed:\n${res.stderr}\n${res.stdout}`);
}

describe('docs', function () {
  for (const doc of DOCS) {
    const text = fs.readFileSync(path.join(ROOT, doc), 'utf8');
    jsBlocks(text).forEach((code, i) => {
      const first = code.split('\n').find((l) => l.trim() && !l.startsWith('const {')) || '';
      it(`${doc} js block #${i + 1} runs (${first.trim().slice(0, 60)})`, function () {
        this.timeout(300000);
        runBlock(code, `${doc} block #${i + 1}`);
      });
    });
  }

  it('stated outputs are checked: a wrong one fails its block', function () {
    this.timeout(60000);
    const { stated } = withStatedOutputs('console.log(1 + 1); // → 2\n');
    assert.equal(stated, 1);
    assert.throws(
      () => runBlock('const x = 1 + 1;\nconsole.log(x); // → 3  (wrong on purpose)\n', 'wrong'),
      /stated output #1 is "3" but the line printed "2"/,
    );
    assert.throws(() => runBlock('if (false) console.log(2); // → 2\n', 'skipped'), /only 0 of 1 stated outputs/);
    runBlock('console.log(1 + 1, true); // → 2 true\n', 'right');
  });

  it('the README and docs/ state outputs somewhere (the check above has something to check)', function () {
    const all = DOCS.map((d) => fs.readFileSync(path.join(ROOT, d), 'utf8')).join('\n');
    assert.ok(jsBlocks(all).reduce((n, code) => n + withStatedOutputs(code).stated, 0) >= 3);
  });

  it('relative links point at files that exist', function () {
    const broken = [];
    for (const doc of DOCS) {
      const text = fs.readFileSync(path.join(ROOT, doc), 'utf8').replace(/```[\s\S]*?```/g, '');
      for (const [, target] of text.matchAll(/\]\(([^)#\s]+)(#[^)]*)?\)/g)) {
        if (/^[a-z]+:/.test(target)) continue;
        if (!fs.existsSync(path.join(ROOT, path.dirname(doc), target))) broken.push(`${doc}: ${target}`);
      }
    }
    assert.deepEqual(broken, []);
  });

  it('the README stays short and names the two quick-start commands', function () {
    const readme = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
    assert.ok(
      Buffer.byteLength(readme) <= 15 * 1024,
      `README.md is ${Buffer.byteLength(readme)} bytes; move reference material to docs/`,
    );
    const quick = readme.slice(readme.indexOf('## Quick start'));
    assert.match(quick, /```sh\nnpm run setup\nnpm test\n```/);
  });

  it('docs/reference/ is what `npm run docs` generates from the typings, and covers every declared name', function () {
    this.timeout(120000);
    const out = fs.mkdtempSync(path.join(require('node:os').tmpdir(), 'llama-branch-reference-'));
    try {
      const typedoc = path.join(ROOT, 'node_modules', 'typedoc', 'bin', 'typedoc');
      const res = spawnSync(process.execPath, [typedoc, '--out', out, '--logLevel', 'Error'], {
        cwd: ROOT,
        encoding: 'utf8',
      });
      assert.equal(res.status, 0, res.stdout + res.stderr);
      const files = (dir) =>
        fs
          .readdirSync(dir, { recursive: true })
          .filter((f) => f.endsWith('.md'))
          .sort();
      const committed = path.join(ROOT, 'docs', 'reference');
      assert.deepEqual(files(committed), files(out), 'run `npm run docs` and commit docs/reference/');
      const stale = files(out).filter(
        (f) => fs.readFileSync(path.join(out, f), 'utf8') !== fs.readFileSync(path.join(committed, f), 'utf8'),
      );
      assert.deepEqual(stale, [], 'run `npm run docs` and commit docs/reference/');
      // Every declared export and class member has its own heading (`### fork()`, `# Class: Branch`).
      const headings = files(out)
        .flatMap((f) => fs.readFileSync(path.join(out, f), 'utf8').match(/^#{1,3} .*$/gm) || [])
        .map((h) =>
          h
            .replace(/^#+ (\w+: )?/, '')
            .replace(/\\/g, '')
            .replace(/\(\)$/, ''),
        );
      const named = new Set(headings);
      const missing = declaredNames().filter((name) => !named.has(name.replace(/^Symbol\.(\w+)$/, '[$1]')));
      assert.deepEqual(missing, [], `not in the generated reference: ${missing.join(', ')}`);
    } finally {
      fs.rmSync(out, { recursive: true, force: true });
    }
  });
});
