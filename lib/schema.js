'use strict';

/**
 * JSON schema → GBNF as module functions (SessionContext has them as members too, as the
 * reference had `ctx.jsonSchemaToGrammar`), each with a synchronous twin. The schema may be an object or its
 * JSON text; the conversion is llama.cpp's (native).
 */

const native = require('./native');
const { makeError } = require('./errors');

/** The schema as JSON text, or a coded error for something that is not a schema. */
function schemaText(schema, where) {
  if (typeof schema === 'string') {
    try {
      JSON.parse(schema);
    } catch (e) {
      throw makeError('ERR_GRAMMAR', `${where}: the schema is not valid JSON (${e.message})`);
    }
    return schema;
  }
  if (schema !== null && typeof schema === 'object') return JSON.stringify(schema);
  throw makeError(
    'ERR_INVALID_ARG',
    `${where}(schema): expected a schema object or JSON text, got ${schema === null ? 'null' : typeof schema}`,
  );
}

/** GBNF for `schema`, converted off the main thread. Rejects with ERR_GRAMMAR or ERR_INVALID_ARG. */
async function jsonSchemaToGrammar(schema) {
  return native.jsonSchemaToGrammar(schemaText(schema, 'jsonSchemaToGrammar'));
}

/** GBNF for `schema`, converted on the calling thread. Throws ERR_GRAMMAR or ERR_INVALID_ARG. */
function jsonSchemaToGrammarSync(schema) {
  return native.jsonSchemaToGrammarSync(schemaText(schema, 'jsonSchemaToGrammarSync'));
}

module.exports = { jsonSchemaToGrammar, jsonSchemaToGrammarSync };
