'use strict';

/**
 * The agent sessions of bench/agent-cache.js and bench/router.js: a shared ~1,500-token system
 * prompt with tool schemas, and each session's user messages, distinct per session and turn.
 */

/** A ~1,500-token system prompt: instructions and the JSON schemas of a dozen tools. */
function systemPrompt() {
  const tools = [];
  const verbs = ['read', 'write', 'list', 'search', 'move', 'patch', 'grep'];
  for (const v of verbs) {
    tools.push({
      name: `${v}_file`,
      description: `The ${v} tool: ${v}s files in the workspace and returns what it found, with line numbers, paths relative to the root, and errors as text.`,
      parameters: {
        type: 'object',
        properties: {
          path: { type: 'string', description: `the path to ${v}, relative to the workspace root` },
          pattern: {
            type: 'string',
            description: `an optional glob or regular expression that narrows what ${v} touches`,
          },
          limit: { type: 'integer', description: 'the most results to return; the default is fifty' },
          dryRun: { type: 'boolean', description: `report what ${v} would do without doing it` },
        },
        required: ['path'],
      },
    });
  }
  const rules = [
    'You are a careful coding agent working in a repository on behalf of a developer.',
    'Think about what the developer asked before you call a tool, and call one tool at a time.',
    'Never change files outside the workspace; never run commands that need the network.',
    'When a tool fails, read its error, fix the call and try again at most twice.',
    'Answer in short sentences; quote file paths and line numbers exactly as the tools gave them.',
  ];
  return `${rules.join(' ')}\n\nTools:\n${JSON.stringify(tools, null, 1)}`;
}

const TASKS = ['the parser', 'the cache', 'the CLI', 'the tests', 'the docs', 'the server', 'the build'];

/** The user's message of `session` at `turn`: distinct per session, ~30 tokens. */
function userMessage(session, turn) {
  const task = TASKS[(session + turn) % TASKS.length];
  return `Session ${session}, step ${turn}: which file of ${task} next, for ticket #${1000 + session * 37 + turn}?`;
}

module.exports = { systemPrompt, userMessage };
