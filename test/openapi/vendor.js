'use strict';

// Regenerates openai-schemas.json, the subset of OpenAI's published API description
// (github.com/openai/openai-openapi, MIT, see LICENSE here) that the conformance check in
// test/openapi/conformance.js validates our server's responses against: the response schemas of
// the operations we serve and everything they reference, without prose (descriptions, examples).
//
//   node test/openapi/vendor.js path/to/openai-openapi/openapi.json [commit]

const fs = require('node:fs');
const path = require('node:path');

const OPERATIONS = [
  ['post', '/chat/completions'],
  ['post', '/completions'],
  ['post', '/embeddings'],
  ['get', '/models'],
];
const ALSO = ['ErrorResponse']; // what every 4xx of ours is
const PROSE = new Set(['description', 'example', 'examples', 'title', 'x-oaiMeta', 'x-oaiTypeLabel', 'deprecated']);

function main([file, commit = null]) {
  if (!file) throw new Error('usage: node test/openapi/vendor.js path/to/openapi.json [commit]');
  const spec = JSON.parse(fs.readFileSync(file, 'utf8'));
  const all = spec.components.schemas;
  const schemas = {};
  const refName = (ref) => ref.replace('#/components/schemas/', '');
  const take = (name) => {
    if (name in schemas) return;
    if (!all[name]) throw new Error(`the spec has no schema ${name}`);
    schemas[name] = null; // reserve: a schema may reference itself
    schemas[name] = strip(all[name], take);
  };
  const operations = {};
  for (const [method, route] of OPERATIONS) {
    const content = spec.paths[route][method].responses['200'].content;
    operations[`${method.toUpperCase()} ${route}`] = Object.fromEntries(
      Object.entries(content).map(([type, { schema }]) => {
        take(refName(schema.$ref));
        return [type, refName(schema.$ref)];
      }),
    );
  }
  ALSO.forEach(take);
  const out = {
    source: 'https://github.com/openai/openai-openapi (openapi.json), MIT License, see LICENSE',
    commit,
    openapi: spec.openapi,
    operations,
    schemas,
  };
  fs.writeFileSync(path.join(__dirname, 'openai-schemas.json'), `${JSON.stringify(out, null, 2)}\n`);
  console.log(`${Object.keys(schemas).length} schemas for ${Object.keys(operations).length} operations`);
}

/** A copy of `node` without prose; calls `take` on every schema it references. */
function strip(node, take) {
  if (Array.isArray(node)) return node.map((n) => strip(n, take));
  if (!node || typeof node !== 'object') return node;
  if (node.nullable === true) {
    // OpenAPI 3.0's `nullable`, which JSON Schema lacks (the document mixes both dialects).
    const rest = { ...node };
    delete rest.nullable;
    return { anyOf: [strip(rest, take), { type: 'null' }] };
  }
  const out = {};
  for (const [k, v] of Object.entries(node)) {
    if (PROSE.has(k)) continue;
    if (k === '$ref') take(v.replace('#/components/schemas/', ''));
    // `properties` maps names to schemas: strip each schema, keep every name (even `description`).
    out[k] =
      k === 'properties' ? Object.fromEntries(Object.entries(v).map(([p, s]) => [p, strip(s, take)])) : strip(v, take);
  }
  return out;
}

main(process.argv.slice(2));
