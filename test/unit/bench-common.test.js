'use strict';

// The pure helpers of bench/common.js that write bench/RESULTS.md (`npm run bench:peers` replaces
// its "Peers" section in place): a table's shape and a section replaced without touching the rest.

const assert = require('node:assert/strict');
const { markdownTable, replaceSection } = require('../../bench/common');

describe('bench/common.js', () => {
  it('markdownTable: titles, alignment from a trailing colon, one line per row', () => {
    const t = markdownTable(
      ['case', 'ours s:'],
      [
        ['fresh', '2.38'],
        ['again', 0.44],
      ],
    );
    assert.equal(t, ['| case | ours s |', '| --- | ---: |', '| fresh | 2.38 |', '| again | 0.44 |'].join('\n'));
  });

  it('replaceSection: replaces only what lies between the markers', () => {
    const text = '# R\n\nbefore\n\n<!-- peers:start -->\nold table\n<!-- peers:end -->\n\nafter\n';
    const out = replaceSection(text, 'peers', 'new table\n', '## Peers');
    assert.equal(out, '# R\n\nbefore\n\n<!-- peers:start -->\nnew table\n<!-- peers:end -->\n\nafter\n');
    assert.equal(replaceSection(out, 'peers', 'new table', '## Peers'), out, 'running it twice changes nothing');
  });

  it('replaceSection: appends the section under its heading when the markers are missing', () => {
    const out = replaceSection('# R\n\ntext\n\n', 'peers', 'table', '## Peers');
    assert.equal(out, '# R\n\ntext\n\n## Peers\n\n<!-- peers:start -->\ntable\n<!-- peers:end -->\n');
    assert.equal(replaceSection(out, 'peers', 'other', '## Peers').split('## Peers').length, 2, 'no second heading');
  });
});
