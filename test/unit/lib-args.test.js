'use strict';

// First tier: lib/'s argument handling and the error contract, with the addon loaded but no
// model. Runs in a second or two (npm run test:unit), before anything that loads weights.

const assert = require('node:assert/strict');
const llama = require('../..');
const { finishError } = require('../../lib/errors');
const native = require('../../lib/native');

async function rejectsWith(promise, code, pattern) {
  const err = await promise.then(
    () => null,
    (e) => e,
  );
  assert.ok(err, `expected a rejection with ${code}`);
  assert.equal(err.code, code, err.message);
  if (pattern) assert.match(err.message, pattern);
  return err;
}

function throwsWith(fn, code, pattern) {
  let caught;
  try {
    fn();
  } catch (e) {
    caught = e;
  }
  assert.ok(caught, `expected a throw with ${code}`);
  assert.equal(caught.code, code, caught.message);
  if (pattern) assert.match(caught.message, pattern);
}

describe('lib argument handling (no model)', function () {
  it('createContext rejects bad options before loading anything', async function () {
    await rejectsWith(llama.createContext(null), 'ERR_INVALID_ARG', /options/);
    await rejectsWith(llama.createContext({}), 'ERR_INVALID_ARG', /modelPath/);
    await rejectsWith(llama.createContext({ modelPath: 42 }), 'ERR_INVALID_ARG', /modelPath/);
    await rejectsWith(llama.createContext({ modelPath: '/nonexistent/m.gguf' }), 'ERR_MODEL_NOT_FOUND', /nonexistent/);
    await rejectsWith(llama.createContext({ modelPath: __filename }), 'ERR_MODEL_LOAD', /GGUF/);
    await rejectsWith(llama.createContext({ modelPath: __filename, nSeqMax: 0 }), 'ERR_INVALID_ARG', /nSeqMax/);
    await rejectsWith(llama.createContext({ modelPath: __filename, logLevel: 'loud' }), 'ERR_INVALID_ARG', /logLevel/);
  });

  it('native createContext rejects (never throws) a value of the wrong type', async function () {
    let promise;
    assert.doesNotThrow(() => {
      promise = native.createContext(7);
    });
    await rejectsWith(promise, 'ERR_INVALID_ARG', /createContext/);
  });

  it('Branch and BranchStore refuse things that are not contexts or branches', function () {
    throwsWith(() => llama.Branch.create({}, 0), 'ERR_INVALID_ARG', /SessionContext/);
    throwsWith(() => llama.Branch.create(null, 0), 'ERR_INVALID_ARG', /SessionContext/);
    throwsWith(() => new llama.BranchStore({}), 'ERR_INVALID_ARG', /SessionContext/);
  });

  it('jsonSchemaToGrammar: bad JSON and wrong types are coded errors', async function () {
    await rejectsWith(llama.jsonSchemaToGrammar('{not json'), 'ERR_GRAMMAR', /not valid JSON/);
    await rejectsWith(llama.jsonSchemaToGrammar(5), 'ERR_INVALID_ARG', /schema/);
    await rejectsWith(native.jsonSchemaToGrammar(5), 'ERR_INVALID_ARG', /jsonSchemaToGrammar/);
    const gbnf = await llama.jsonSchemaToGrammar({ type: 'object', properties: { a: { type: 'integer' } } });
    assert.match(gbnf, /root/);
  });

  it('setLogLevel and systemInfo: coded errors from the addon and from napi-rs conversion', function () {
    throwsWith(() => llama.setLogLevel('loud'), 'ERR_INVALID_ARG', /logLevel/);
    throwsWith(() => llama.setLogLevel(5), 'ERR_INVALID_ARG', /setLogLevel/);
    llama.setLogLevel('none');
    assert.match(llama.systemInfo(), /CPU/);
  });

  it('the shim renames napi-rs conversion statuses only, keeping the original as cause', function () {
    const napi = Object.assign(new Error('Failed to convert'), { code: 'NumberExpected' });
    const finished = finishError(napi, '_branchSample');
    assert.equal(finished.code, 'ERR_INVALID_ARG');
    assert.match(finished.message, /branchSample\(\)/);
    assert.equal(finished.cause, napi);
    const ours = Object.assign(new Error('x'), { code: 'ERR_KV_FULL' });
    assert.equal(finishError(ours), ours);
  });

  it('every error code the addon can produce is a stable ERR_ code', function () {
    const codes = native.errorCodes();
    assert.ok(codes.length >= 20);
    for (const c of codes) assert.match(c, /^ERR_[A-Z_]+$/);
    assert.equal(new Set(codes).size, codes.length);
  });
});
