'use strict';

// `npm run lint`: prettier formats (120 columns, .prettierrc.json), eslint finds mistakes.
const js = require('@eslint/js');
const globals = require('globals');

module.exports = [
  { ignores: ['build/', 'dist/', 'models/', 'npm/', 'target/', 'types/', 'node_modules/', 'bench/results/'] },
  js.configs.recommended,
  {
    files: ['**/*.js'],
    languageOptions: {
      ecmaVersion: 2022,
      sourceType: 'commonjs',
      globals: { ...globals.node },
    },
    rules: {
      'no-unused-vars': ['error', { argsIgnorePattern: '^_', varsIgnorePattern: '^_', caughtErrors: 'none' }],
    },
  },
  {
    // lib/ stays readable a function at a time (issue #22): a function that grows past 60 lines
    // gets its cohesive pieces moved out, not squeezed.
    files: ['lib/**/*.js'],
    rules: { 'max-lines-per-function': ['error', { max: 60, skipBlankLines: true, skipComments: true }] },
  },
  {
    files: ['test/**/*.js', 'bench/**/*.js'],
    languageOptions: { globals: { ...globals.node, ...globals.mocha } },
  },
  {
    // Browser tests: the functions passed to page.evaluate run in the page.
    files: ['test/ui/**/*.js'],
    languageOptions: { globals: { ...globals.node, ...globals.mocha, ...globals.browser } },
  },
  {
    // Scripts that run in the page (the browser), if any, get browser globals.
    files: ['lib/server/ui/**/*.js'],
    languageOptions: { sourceType: 'script', globals: { ...globals.browser } },
  },
];
