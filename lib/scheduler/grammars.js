'use strict';

/** Grammars a program's `gen` builds from its `regex` and `choices` options. */

const { makeError } = require('../errors');
const { invalid } = require('./checks');

/**
 * The grammar of a regular expression, through llama.cpp's JSON-schema `pattern` support: the
 * schema `{ type: 'string', pattern }` becomes a grammar of a quoted JSON string whose root is
 * `"\"" (BODY) "\""`; the quotes are dropped so that the text itself matches. Anchors are
 * implied (the whole text matches). Anything else llama.cpp makes of it is ERR_UNSUPPORTED.
 */
async function regexGrammar(regex, toGrammar) {
  const pattern = `${regex.startsWith('^') ? '' : '^'}${regex}${regex.endsWith('$') ? '' : '$'}`;
  const grammar = await toGrammar({ type: 'string', pattern });
  const quoted = /^root ::= "\\"" \((.*)\) "\\""$/m;
  const m = quoted.exec(grammar);
  if (!m)
    throw makeError(
      'ERR_UNSUPPORTED',
      `gen: regex ${JSON.stringify(regex)} could not be turned into a grammar of its text`,
    );
  return grammar.replace(quoted, () => `root ::= (${m[1]})`);
}

/** A GBNF string literal of `text`. */
function gbnfLiteral(text) {
  return `"${text
    .replace(/[\\"]/g, (c) => `\\${c}`)
    .replace(/\n/g, '\\n')
    .replace(/\r/g, '\\r')
    .replace(/\t/g, '\\t')}"`;
}

/** The grammar of `choices`: the text is exactly one of them. */
function choicesGrammar(choices) {
  if (!Array.isArray(choices) || choices.length === 0 || !choices.every((c) => typeof c === 'string' && c !== ''))
    throw invalid('gen: choices must be a non-empty array of non-empty strings');
  return `root ::= ${choices.map(gbnfLiteral).join(' | ')}`;
}

module.exports = { regexGrammar, choicesGrammar };
