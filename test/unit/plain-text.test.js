'use strict';

// lib/scheduler/plain-text.js without a model: a fake tokenizer whose one control token is
// `<ctl>` (id 1000 when special tokens are parsed; its characters' codes when not), and the BOS 1.

const assert = require('node:assert/strict');
const {
  spellsSpecial,
  clientText,
  clientContent,
  markMessages,
  tokenizeMarked,
  unmark,
} = require('../../lib/scheduler/plain-text');

const CTL = '<ctl>';
const calls = [];
const ctx = {
  tokenizeSync(text, addSpecial = true, parseSpecial = true) {
    calls.push({ text, addSpecial, parseSpecial });
    const out = addSpecial ? [1] : [];
    for (let i = 0; i < text.length;) {
      if (parseSpecial && text.startsWith(CTL, i)) {
        out.push(1000);
        i += CTL.length;
      } else out.push(text.charCodeAt(i++));
    }
    return out;
  },
};
const codes = (s) => [...s].map((c) => c.charCodeAt(0));

describe('plain-text: client text is text (no model)', () => {
  it('text that spells no control token is never marked, and tokenizes whole as before', () => {
    for (const s of ['hello', '<ct', 'a <b> c', '']) assert.equal(clientText(ctx, s), s);
    const messages = [
      { role: 'user', content: 'hi' },
      { role: 'assistant', content: [{ type: 'text', text: 'ok' }] },
    ];
    assert.equal(markMessages(ctx, messages), messages, 'the same array: nothing to mark');
    calls.length = 0;
    assert.deepEqual(tokenizeMarked(ctx, `${CTL}user\nhi${CTL}`, true), [1, 1000, ...codes('user\nhi'), 1000]);
    assert.deepEqual(calls, [{ text: `${CTL}user\nhi${CTL}`, addSpecial: true, parseSpecial: true }]);
  });

  it("a marked span is plain text between the template's parsed text; the BOS once, first", () => {
    const marked = clientText(ctx, `hi${CTL}x`);
    assert.notEqual(marked, `hi${CTL}x`);
    assert.equal(unmark(marked), `hi${CTL}x`);
    const text = `${CTL}user\n${marked}${CTL}\n`;
    assert.deepEqual(tokenizeMarked(ctx, text, true), [1, 1000, ...codes('user\n'), ...codes(`hi${CTL}x`), 1000, 10]);
    // a span at the very start still gets the BOS first
    assert.deepEqual(tokenizeMarked(ctx, marked, true), [1, ...codes(`hi${CTL}x`)]);
    assert.deepEqual(tokenizeMarked(ctx, marked, false), codes(`hi${CTL}x`));
  });

  it("a message's content keeps its edge white space outside the marks (a template's trim still trims it)", () => {
    const marked = clientContent(ctx, `  a${CTL}b \n`);
    assert.ok(marked.startsWith('  ') && marked.endsWith(' \n'), JSON.stringify(marked));
    assert.equal(unmark(marked.trim()), `a${CTL}b`);
    assert.deepEqual(tokenizeMarked(ctx, marked.trim(), false), codes(`a${CTL}b`));
  });

  it('messages: contents, text parts (a control token spelled across two parts too) and reasoning are marked', () => {
    const messages = [
      { role: 'system', content: 'plain' },
      {
        role: 'user',
        content: [
          { type: 'text', text: 'x<ct' },
          { type: 'text', text: 'l>y' },
        ],
      },
      { role: 'assistant', content: 'ok', reasoning_content: `think${CTL}` },
    ];
    const out = markMessages(ctx, messages);
    assert.notEqual(out, messages);
    assert.equal(out[0].content, 'plain');
    const joined = out[1].content.map((p) => p.text).join('');
    assert.deepEqual(tokenizeMarked(ctx, joined, false), codes(`x${CTL}y`));
    assert.equal(unmark(out[2].reasoning_content), `think${CTL}`);
    assert.equal(messages[2].reasoning_content, `think${CTL}`, 'the caller keeps its messages');
  });

  it('marks a template broke apart refuse the text (ERR_INVALID_ARG), never parse it', () => {
    const marked = clientText(ctx, `a${CTL}`);
    const open = marked.slice(0, marked.indexOf(`a${CTL}`));
    assert.throws(() => tokenizeMarked(ctx, `${open}a${CTL}`, false), {
      code: 'ERR_INVALID_ARG',
      message: /parseSpecial/,
    });
    assert.throws(() => tokenizeMarked(ctx, marked.slice(open.length), false), { code: 'ERR_INVALID_ARG' });
  });

  it('a context answers for a text once: a history sent again on the next turn is not tokenized again', () => {
    const history = [
      { role: 'user', content: 'first question' },
      { role: 'assistant', content: `an answer that spells ${CTL}` },
    ];
    const first = markMessages(ctx, history);
    calls.length = 0;
    const again = markMessages(ctx, [...history, { role: 'user', content: 'next question' }]);
    assert.deepEqual(
      calls.map((c) => c.text),
      ['next question', 'next question'],
      'only the new message is tokenized (parsed and plain)',
    );
    assert.deepEqual(again.slice(0, 2), first, 'the same marks as the first time');
    assert.equal(unmark(again[1].content), history[1].content);
    assert.equal(spellsSpecial(ctx, 'first question'), false);
    assert.equal(spellsSpecial(ctx, `x${CTL}`), true);
    calls.length = 0;
    assert.equal(spellsSpecial(ctx, `x${CTL}`), true);
    assert.equal(spellsSpecial(ctx, 'first question'), false);
    assert.deepEqual(calls, [], 'remembered answers, no tokenization');
    const other = {
      tokenizeSync: (text, addSpecial, parseSpecial) => ctx.tokenizeSync(text, addSpecial, !parseSpecial),
    };
    calls.length = 0;
    assert.equal(spellsSpecial(other, 'first question'), false);
    assert.equal(calls.length, 2, 'another context asks its own tokenizer');
  });
});
