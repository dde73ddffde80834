'use strict';

// index.d.ts must declare exactly the runtime exports. Its classes come from lib/'s JSDoc
// (types/, kept current by `node scripts/lib-typings.js --check`), so they are not compared here;
// what is still written by hand (exports, constant objects, the ErrorCode union) is. The
// declarations are read with the TypeScript compiler API, so nothing is listed by hand here.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const path = require('node:path');
const ts = require('typescript');
const llama = require('..');

const DTS = path.join(__dirname, '..', 'index.d.ts');

const hasModifier = (node, kind) => (ts.getModifiers(node) || []).some((m) => m.kind === kind);

function memberName(member) {
  const name = member.name;
  if (!name) return null;
  if (ts.isIdentifier(name) || ts.isStringLiteral(name)) return name.text;
  // [Symbol.asyncIterator]
  if (ts.isComputedPropertyName(name)) return name.expression.getText();
  return null;
}

/** Runtime-visible declarations of index.d.ts: value exports and the keys of constant objects. */
function readDeclarations() {
  const source = ts.createSourceFile(DTS, fs.readFileSync(DTS, 'utf8'), ts.ScriptTarget.Latest, true);
  const exports = new Set();
  const consts = {};
  for (const stmt of source.statements) {
    if (ts.isExportDeclaration(stmt) && !stmt.isTypeOnly && stmt.exportClause && ts.isNamedExports(stmt.exportClause)) {
      for (const spec of stmt.exportClause.elements) exports.add(spec.name.text);
    }
    if (!hasModifier(stmt, ts.SyntaxKind.ExportKeyword)) continue;
    if (ts.isFunctionDeclaration(stmt) || ts.isClassDeclaration(stmt)) exports.add(stmt.name.text);
    if (ts.isVariableStatement(stmt)) {
      for (const decl of stmt.declarationList.declarations) {
        exports.add(decl.name.text);
        if (decl.type && ts.isTypeLiteralNode(decl.type)) consts[decl.name.text] = decl.type.members.map(memberName);
      }
    }
  }
  return { exports, consts };
}

describe('typings: index.d.ts declares the runtime exports', function () {
  const declared = readDeclarations();

  it('declares every runtime export and nothing else', function () {
    const runtime = Object.keys(llama)
      .filter((k) => !k.startsWith('_'))
      .sort();
    assert.deepEqual([...declared.exports].sort(), runtime);
  });

  it('constant objects (PoolingType, ...): declared keys equal the runtime keys', function () {
    assert.ok(Object.keys(declared.consts).includes('PoolingType'));
    for (const [name, keys] of Object.entries(declared.consts)) {
      assert.deepEqual([...keys].sort(), Object.keys(llama[name]).sort(), name);
    }
  });

  it('the ErrorCode union lists exactly the codes the addon defines (src/error.rs)', function () {
    const source = ts.createSourceFile(DTS, fs.readFileSync(DTS, 'utf8'), ts.ScriptTarget.Latest, true);
    const alias = source.statements.find((s) => ts.isTypeAliasDeclaration(s) && s.name.text === 'ErrorCode');
    assert.ok(alias && ts.isUnionTypeNode(alias.type), 'ErrorCode is a union of string literals');
    const declaredCodes = alias.type.types.map((t) => t.literal.text);
    // Codes made in JavaScript, outside the addon: loading the addon itself, and the
    // Scheduler's own (lib/scheduler/errors.js, their one definition).
    const jsOnly = [
      'ERR_NATIVE_LOAD',
      ...Object.values(require('../lib/scheduler/errors').SchedulerErrorCode),
      ...Object.values(require('../lib/speculative').SpeculativeErrorCode),
      ...Object.values(require('../lib/server/hf-tokenizer').TokenizerErrorCode),
    ];
    const native = require('../lib/native');
    assert.deepEqual([...declaredCodes].sort(), [...native.errorCodes(), ...jsOnly].sort());
  });

  it('promise-returning native methods reject bad arguments instead of throwing', async function () {
    // The native signatures are generated from the Rust (lib/native.d.ts); every method that
    // returns a Promise and takes arguments must turn a wrong argument into a rejection with a
    // code: given symbols (no parameter takes one), none may throw, and none may resolve.
    const { nativeOf } = require('../lib/Context');
    const text = fs.readFileSync(path.join(__dirname, '..', 'lib', 'native.d.ts'), 'utf8');
    const klass = text.slice(text.indexOf('export declare class SessionContext'));
    const asyncMethods = [...klass.matchAll(/^ {2}(\w+)\((.+)\): Promise</gm)].map((m) => m[1]);
    assert.ok(asyncMethods.length >= 15, `found ${asyncMethods.length} promise-returning methods with parameters`);
    // encode refuses a context without embeddings before it looks at its argument.
    const codeOf = { encode: 'ERR_UNSUPPORTED' };
    const ctx = await require('./helpers').open({ nSeqMax: 2, nCtx: 256 });
    try {
      for (const name of asyncMethods) {
        let result;
        assert.doesNotThrow(() => {
          result = nativeOf(ctx)[name](Symbol('x'), Symbol('x'), Symbol('x'), Symbol('x'), Symbol('x'));
        }, `${name} threw instead of rejecting`);
        assert.ok(result && typeof result.then === 'function', `${name} returns a Promise`);
        const outcome = await result.then(
          (value) => ({ resolved: value }),
          (e) => ({ err: e }),
        );
        assert.ok(outcome.err, `${name} resolved with bad arguments`);
        assert.equal(outcome.err.code, codeOf[name] || 'ERR_INVALID_ARG', `${name}: ${outcome.err.message}`);
      }
    } finally {
      ctx.dispose();
    }
  });
});
