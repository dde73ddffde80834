'use strict';

// The README must stay true: every ```js block in it runs (on the test model) and the API
// reference section names every export and class member that index.d.ts declares.
// A block without its own `require(...)` is a fragment: it runs after a prelude that imports
// every export of the package and, unless the block declares its own, opens `ctx` (nSeqMax 8).

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const ts = require('typescript');
const { MODEL } = require('./helpers');

const ROOT = path.join(__dirname, '..');
const README = fs.readFileSync(path.join(ROOT, 'README.md'), 'utf8');
const DEFAULT_MODEL_IN_DOCS = 'models/gemma-3-270m-q4_k_m.gguf';

function jsBlocks(markdown) {
  return [...markdown.matchAll(/```js\n([\s\S]*?)```/g)].map((m) => m[1]);
}

/** Names of exports and public class members (incl. statics) declared in index.d.ts. */
function declaredNames() {
  const file = path.join(ROOT, 'index.d.ts');
  const source = ts.createSourceFile(file, fs.readFileSync(file, 'utf8'), ts.ScriptTarget.Latest, true);
  const names = [];
  const exported = (n) => (ts.getModifiers(n) || []).some((m) => m.kind === ts.SyntaxKind.ExportKeyword);
  for (const stmt of source.statements) {
    if (!exported(stmt)) continue;
    if (ts.isFunctionDeclaration(stmt)) names.push(stmt.name.text);
    if (ts.isVariableStatement(stmt)) for (const d of stmt.declarationList.declarations) names.push(d.name.text);
    if (ts.isClassDeclaration(stmt)) {
      names.push(stmt.name.text);
      for (const m of stmt.members) {
        if (ts.isConstructorDeclaration(m) || !m.name) continue;
        if ((ts.getModifiers(m) || []).some((x) => x.kind === ts.SyntaxKind.PrivateKeyword)) continue;
        names.push(ts.isComputedPropertyName(m.name) ? m.name.expression.getText() : m.name.text);
      }
    }
  }
  return [...new Set(names)];
}

describe('README', function () {
  const blocks = jsBlocks(README);

  it('has runnable JavaScript examples', function () {
    assert.ok(blocks.length >= 1);
  });

  blocks.forEach((code, i) => {
    it(`js block #${i + 1} runs (${code.split('\n').find((l) => l.trim() && !l.startsWith('const {')) || ''})`, function () {
      this.timeout(300000);
      // Same code, run from the repository root (so `require('llama-branch')` resolves to this
      // package), on the test model, with top-level await wrapped for CommonJS.
      const body = code.split(DEFAULT_MODEL_IN_DOCS).join(MODEL);
      let prelude = '';
      if (!/\brequire\(/.test(code)) {
        prelude = `const { ${Object.keys(require('..')).join(', ')} } = require('llama-branch');\n`;
        if (!/\b(const|let|var)\s+ctx\b/.test(code)) {
          prelude += `const ctx = await createContext({ modelPath: ${JSON.stringify(MODEL)}, nCtx: 4096, nSeqMax: 8 });\n`;
        }
      }
      const program = `(async () => {\n${prelude}${body}\n})().then(() => process.exit(0), (e) => { console.error(e); process.exit(1); });`;
      const res = spawnSync(process.execPath, ['-e', program], { cwd: ROOT, encoding: 'utf8', timeout: 290000 });
      assert.equal(res.status, 0, `block #${i + 1} failed:\n${res.stderr}\n${res.stdout}`);
    });
  });

  it('the API reference names every declared export and member', function () {
    const start = README.indexOf('## API reference');
    assert.ok(start >= 0, 'README has an "## API reference" section');
    const end = README.indexOf('\n## ', start + 3);
    const section = README.slice(start, end === -1 ? undefined : end);
    const codeSpans = [...section.matchAll(/`([^`]+)`/g)].map((m) => m[1]).join('\n');
    const missing = declaredNames().filter((name) => {
      const word = name.startsWith('Symbol.') ? name.replace('.', '\\.') : `\\b${name}\\b`;
      return !new RegExp(word).test(codeSpans);
    });
    assert.deepEqual(missing, [], `undocumented in README "API reference": ${missing.join(', ')}`);
  });
});
