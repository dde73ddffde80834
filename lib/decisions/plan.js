'use strict';

/**
 * The plan of a decision, from its checked questions (./checks.js) and the model: where the
 * state ends and each question starts (the layout), how each question is read (labels from one
 * logits row, or option texts scored), the text of every fork (one per question and `permute`
 * order) with the tokens it decodes and the lines it holds, and the batches of forks that fit the
 * context's cells. ./ask.js asks what this lays out; nothing here runs anything.
 *
 * How an answer is read: when every option's label (`A`, `B`, … for a choice, `Yes`/`No`, the
 * level digits of a score) is one token where the answer starts, the fork reads all of them from
 * its one logits row. Otherwise the options are listed by name and the names themselves are
 * scored as continuations (a trie, shared tokens scored once).
 */

const { makeError, invalidArg: refused } = require('../errors');
const { clientText, clientContent, tokenizeMarked, spellsSpecial } = require('../scheduler/plain-text');
const { IMAGE_MARK } = require('./checks');
const { imagesWithSpecialText } = require('../scheduler/media');

const LETTERS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ'.split('');
/** Cells added per line beyond its own tokens: a fork that re-decodes the token before it. */
const SLACK_PER_LINE = 2;
/**
 * What marks, in the chat template's rendering, where the question goes (SENTINEL: the state is
 * before it, what closes the question after it) and where a cache breakpoint is (BREAK). Control
 * characters: the checks refuse client text holding NUL.
 */
const SENTINEL = '\u0000\u0001question\u0001\u0000';
const BREAK = '\u0000\u0001break\u0001\u0000';

/** `content` with BREAK inserted at each offset of `breaks`, each piece between them `mark`ed. */
function withBreaks(content, breaks, mark) {
  let out = '';
  let from = 0;
  for (const at of breaks) {
    out += mark(content.slice(from, at)) + BREAK;
    from = at;
  }
  return out + mark(content.slice(from));
}

/**
 * How client text enters a decision's text: marked to stay plain text when it spells the model's
 * control tokens (../scheduler/plain-text.js), or as it is when the Scheduler parses them.
 * `content`: a state message's content (for the chat template); `text`: a question's whole text
 * or an option's, which hold no control token of ours (so the span is the whole, and the
 * tokenizer merges across the client's part as it would without marks).
 * @param {import('../Context').SessionContext} ctx
 * @param {boolean} parseSpecial
 * @returns {{ content: (text: string) => string, text: (text: string) => string }}
 */
function markerOf(ctx, parseSpecial) {
  const same = (/** @type {string} */ text) => text;
  if (parseSpecial) return { content: same, text: same };
  return { content: (text) => clientContent(ctx, text), text: (text) => clientText(ctx, text) };
}

/**
 * Where the answer starts and how labels are written there: in a chat, the model's turn is open
 * and the label is its first text; raw, the question ends `Answer:` and the label follows a space.
 * `pieces`: the state's text (with the template's opening) cut at its cache breakpoints, `tail`:
 * what closes each question. Client text goes through `mark`.
 */
function layout(ctx, messages, template, marks) {
  const mark = marks.content;
  if (template === 'raw') {
    const text =
      messages.length === 1 && messages[0].role === 'user'
        ? withBreaks(messages[0].content, messages[0].breaks, mark)
        : messages.map((m) => `${m.role}: ${withBreaks(m.content, m.breaks, mark)}`).join('\n\n');
    return { pieces: `${text}\n\n`.split(BREAK), tail: '\nAnswer:', labelPrefix: ' ' };
  }
  // Templates that require alternating roles refuse two turns of one role in a row (a tool's
  // call after the assistant's text, a fresh observation after the task): such turns are joined
  // into one. The question is the user's last turn, joined to the last message when it is the
  // user's.
  const chat = [];
  for (const m of messages) {
    const content = withBreaks(m.content, m.breaks, mark);
    const prev = chat[chat.length - 1];
    if (prev && prev.role === m.role) prev.content = `${prev.content}\n\n${content}`;
    else chat.push({ role: m.role, content });
  }
  const last = chat[chat.length - 1];
  if (last.role === 'user') last.content = `${last.content}\n\n${SENTINEL}`;
  else chat.push({ role: 'user', content: SENTINEL });
  let prompt;
  try {
    prompt = ctx.formatChatSync(chat).prompt;
  } catch (e) {
    throw makeError(
      'ERR_CHAT_TEMPLATE',
      `decide: the chat template could not render the state (${e.message}); pass template: 'raw'`,
    );
  }
  const at = prompt.indexOf(SENTINEL);
  if (at < 0 || prompt.indexOf(SENTINEL, at + 1) >= 0)
    throw makeError(
      'ERR_UNSUPPORTED',
      "decide: the model's chat template does not render a user turn as given; pass template: 'raw'",
    );
  return { pieces: prompt.slice(0, at).split(BREAK), tail: prompt.slice(at + SENTINEL.length), labelPrefix: '' };
}

/** Per context: whether `label` is one token right after `tail` (memoized: tokenizing is cheap, not free). */
const singleTokens = new WeakMap();
function labelToken(ctx, tail, label) {
  let memo = singleTokens.get(ctx);
  if (!memo) singleTokens.set(ctx, (memo = new Map()));
  const key = `${tail}\u0000${label}`;
  if (!memo.has(key)) {
    const before = tokenizeMarked(ctx, tail, false);
    const after = tokenizeMarked(ctx, tail + label, false);
    const same = before.every((t, i) => after[i] === t);
    memo.set(key, same && after.length === before.length + 1 ? after[after.length - 1] : null);
  }
  return memo.get(key);
}

/** Labels of a question's options (by option index) in label mode, or null when it has none. */
function labelsOf(question) {
  const n = question.options.length;
  if (question.type === 'noul') return ['Yes', 'No'];
  if (question.type === 'score') return n <= 10 ? question.options.map((_, i) => String(i)) : null;
  return n <= LETTERS.length ? LETTERS.slice(0, n) : null;
}

/**
 * How a question is read: `{ mode: 'label', labels, ids }` (the label tokens of each option, in
 * option order, for the unshifted labels) or `{ mode: 'text' }`.
 */
function readingOf(ctx, question, look, read) {
  const labels = labelsOf(question);
  if (read !== 'text' && labels) {
    const ids = labels.map((l) => labelToken(ctx, look.tail, look.labelPrefix + l));
    if (ids.every((t) => t !== null) && new Set(ids).size === ids.length) return { mode: 'label', labels, ids };
  }
  if (read === 'label')
    throw refused(
      `${question.param}: its option labels are not distinct single tokens for this model; use read: 'auto' or 'text'`,
      question.param,
    );
  return { mode: 'text' };
}

/**
 * The text of `question` under cyclic shift `shift` of its options: the question, the options in
 * the shifted order, and how to answer. Returns the text and, per display position, the option.
 * It holds no control token of ours.
 */
function questionText(question, reading, shift) {
  const n = question.options.length;
  const order = Array.from({ length: n }, (_, p) => (p + shift) % n); // display position → option
  const optionLine = (head, o) => (o.description ? `${head}: ${o.description}` : head);
  const lines = [`Question: ${question.instructions}`];
  if (question.type === 'noul') {
    const yesNo = order.map((i) => (i === 0 ? 'Yes' : 'No'));
    for (const i of order) {
      const o = question.options[i];
      if (o.description) lines.push(`${i === 0 ? 'Yes' : 'No'}: ${o.description}`);
    }
    lines.push(`Answer ${yesNo.join(' or ')}.`);
  } else if (reading.mode === 'label') {
    // A choice's letters go with the display position (the labels shift); a score's digits and
    // a noul's Yes/No name the option itself, so only the listing order moves.
    lines.push(question.type === 'score' ? 'Levels:' : 'Options:');
    order.forEach((i, p) => {
      const label = question.type === 'score' ? String(i) : reading.labels[p];
      lines.push(optionLine(`${label}. ${question.options[i].name}`, question.options[i]));
    });
    lines.push(
      question.type === 'score' ? 'Answer with the number of the level.' : 'Answer with the letter of the best option.',
    );
  } else {
    lines.push(question.type === 'score' ? 'Levels:' : 'Options:');
    for (const i of order) lines.push(optionLine(`- ${question.options[i].name}`, question.options[i]));
    lines.push(`Answer with the ${question.type === 'score' ? 'level' : 'option'} exactly as written.`);
  }
  return { text: lines.join('\n'), order };
}

/**
 * The fork of `question` under `shift`: `{ text, tokens, lines, order, ids?, texts? }` — the text
 * it appends (question and tail), the tokens it decodes (its text, and in text mode its options'),
 * the lines it holds at once, and what it reads: the label token of each option (option order;
 * a choice's letters move with the display order) or each option's text (display order).
 */
function taskOf(ctx, question, reading, look, shift, marks) {
  const { text, order } = questionText(question, reading, shift);
  // A question with images: its head (questionHeads) is on the line the task forks.
  const full = `${marks.text(question.head ? text.slice(headText(question).length) : text)}${look.tail}`;
  const n = question.options.length;
  const task = { text: full, tokens: tokenizeMarked(ctx, full, false).length, order, lines: 1 };
  if (reading.mode === 'label') {
    task.ids = question.options.map((_, i) =>
      question.type === 'choice' ? reading.ids[(i - shift + n) % n] : reading.ids[i],
    );
  } else {
    const names = question.type === 'noul' ? ['Yes', 'No'] : question.options.map((o) => o.name);
    task.texts = order.map((i) => marks.text(look.labelPrefix + names[i]));
    task.tokens += task.texts.reduce((s, t) => s + tokenizeMarked(ctx, t, false).length, 0);
    task.lines = 1 + n + 1;
  }
  return task;
}

/** Per question of `questions`, `{ question, reading, tasks }` (one task per `permute` order). */
function itemsOf(ctx, questions, look, settings, marks) {
  return questions.map((question) => {
    if (question.refusal) return { question, reading: null, tasks: [], head: null };
    const reading = readingOf(ctx, question, look, settings.read);
    const shifts = Math.min(settings.permute, question.options.length);
    const tasks = Array.from({ length: shifts }, (_, shift) => taskOf(ctx, question, reading, look, shift, marks));
    return { question, reading, tasks, head: question.head || null };
  });
}

/** Lines the widest item needs at once (its head's line, a task's), checked against what the decision may hold. */
function checkWidth(items, total, param) {
  const widthOf = (it) => (it.head ? 1 : 0) + (it.reading && it.reading.mode === 'text' ? 2 : 1);
  const needs = Math.max(1, ...items.map(widthOf));
  if (total < needs)
    throw refused(
      `decide: ${total} line(s) at once is too few; ${needs} are needed at once (scoring option texts takes 2, a question with images 1 more; raise ${param})`,
      param,
    );
}

/** `text` cut at its image marks into prompt parts: text, the image a mark names, text, …. */
const markedParts = (/** @type {string} */ text, /** @type {Buffer[]} */ images) =>
  text.split(new RegExp(IMAGE_MARK.source, 'g')).map((p, k) => (k % 2 === 0 ? p : images[Number(p)]));

/**
 * The state of a decision whose input holds images, laid out and tokenized (async: the images are
 * decoded on the worker): `{ look, head }`, `head` holding a MediaPrompt for each piece with an
 * image (the prefix cache keys it by the image's bytes). Null without images. The state's text is
 * tokenized by the projector, which reads control tokens in it: client text that spells them is
 * refused unless the Scheduler parses them (as for requests with images).
 * @param {import('../Context').SessionContext} ctx
 */
async function mediaStateOf(ctx, checked, parseSpecial) {
  if (checked.images.length === 0) return null;
  if (!ctx.hasProjector)
    throw makeError(
      'ERR_NO_PROJECTOR',
      'decide: the input has an image, and this context has no image projector; create it with mmprojPath (serve --mmproj)',
    );
  if (!parseSpecial && checked.messages.some((m) => spellsSpecial(ctx, m.content)))
    throw imagesWithSpecialText('input');
  const marks = { ...markerOf(ctx, parseSpecial), content: (/** @type {string} */ text) => text };
  const look = layout(ctx, checked.messages, checked.settings.template, marks);
  const head = await Promise.all(
    look.pieces.map((piece, i) => {
      const parts = markedParts(piece, checked.images);
      return parts.length === 1 ? tokenizeMarked(ctx, piece, i === 0) : ctx.tokenizeParts(parts, i === 0);
    }),
  );
  return { look, head };
}

/** The text of a question up to the end of the line its instructions end: the head of its tasks. */
const headText = (question) => `Question: ${question.instructions}\n`;

/**
 * The heads of the questions whose instructions hold images (async: the images are decoded on the
 * worker): each such question's text up to its instructions' end, a MediaPrompt (the prefix cache
 * keys its images by their bytes), put on the question as `head`. Its tasks (one per `permute`
 * order) fork one line holding it, so each image is encoded once for all of them. A context without
 * a projector refuses those questions alone; their text beside images is tokenized by the
 * projector, which reads control tokens: client text that spells them is refused unless parsed.
 * @param {import('../Context').SessionContext} ctx
 */
async function questionHeads(ctx, checked, parseSpecial) {
  const withImages = checked.questions.filter((q) => q.images.length > 0 && !q.refusal);
  for (const q of withImages) {
    if (!ctx.hasProjector) {
      q.refusal = 'the question has an image and this model takes none (no image projector: serve --mmproj)';
      continue;
    }
    if (!parseSpecial && spellsSpecial(ctx, q.instructions)) throw imagesWithSpecialText(q.param);
    q.head = await ctx.tokenizeParts(markedParts(headText(q), q.images), false);
  }
}

/** Positions a state piece takes: its tokens, or a MediaPrompt's positions. */
const positionsOf = (piece) => (Array.isArray(piece) ? piece.length : piece.nPos);

/** Positions a planned question decodes beyond the state: its head's and its tasks'. */
const questionTokens = (it) => (it.head ? it.head.nPos : 0) + it.tasks.reduce((s, t) => s + t.tokens, 0);

/**
 * The plan of `scheduler.decide` (either format): `{ look, head, stateTokens, items, batches,
 * maxBranches }`. `head`: the state's tokens per piece (cut at cache breakpoints; without any,
 * the state tokenized whole, so both doors decode the same tokens). A question whose forks cannot
 * fit beside the state is refused (`refusal` of the OpenAI format) or, in System One's, fails the
 * decision. `batches`: the items asked by one program each, in order, each within the cells a
 * program may write, so that a long list of questions runs on the state the first one cached, with
 * the lines its program may hold (`maxBranches`) and those its asking may hold at once (`parallel`).
 */
function planDecision(ctx, checked, parseSpecial, media = null) {
  const { messages, settings, format } = checked;
  const marks = markerOf(ctx, parseSpecial);
  const look = media ? media.look : layout(ctx, messages, settings.template, marks);
  const head = media ? media.head : look.pieces.map((piece, i) => tokenizeMarked(ctx, piece, i === 0));
  const stateTokens = head.reduce((s, t) => s + positionsOf(t), 0);
  const items = itemsOf(ctx, checked.questions, look, settings, marks);
  const stateCells = stateTokens + SLACK_PER_LINE * head.length;
  const cellsOf = (it) =>
    (it.head ? it.head.nPos + SLACK_PER_LINE : 0) +
    it.tasks.reduce((s, t) => s + t.tokens + SLACK_PER_LINE * t.lines, 0);
  // A question's head: its line and a lease for the prefix cache's entry of it (its images are
  // worth keeping: the same question about the same image skips the encoder).
  const linesOf = (it) => (it.head ? 2 : 0) + it.tasks.reduce((s, t) => s + t.lines, 0);
  for (const it of items) {
    if (it.tasks.length === 0 || stateCells + cellsOf(it) <= ctx.nCtx) continue;
    const tokens = questionTokens(it);
    const message = `decide: the state is ${stateTokens} tokens and ${it.question.param} ${tokens} more, past the context's ${ctx.nCtx} KV cells; shorten the state or the question, or lower permute`;
    if (format !== 'openai' || stateCells + SLACK_PER_LINE * 2 >= ctx.nCtx)
      throw refused(message, format === 'openai' ? 'input' : 'state', 'state_too_long');
    it.question.refusal = 'the question and its options do not fit in the context beside the input';
    it.tasks = [];
  }
  // Half the sequences by default: the rest stay for other requests and for the prefix cache,
  // which keeps the state for the next decision on it.
  const cap = checked.maxBranches === undefined ? Math.max(3, Math.floor(ctx.nSeqMax / 2)) : checked.maxBranches;
  if (!Number.isInteger(cap) || cap < head.length + 1 || cap > ctx.nSeqMax)
    throw refused(
      `decide(request): maxBranches must be an integer in ${head.length + 1}..${ctx.nSeqMax} (nSeqMax)`,
      'maxBranches',
    );
  // A batch writes at most half the context when the state leaves room, so the state's cache
  // entry need not be evicted to admit the next batch.
  const budget = Math.max(
    Math.floor(ctx.nCtx / 2),
    Math.min(ctx.nCtx, stateCells + Math.max(0, ...items.map(cellsOf))),
  );
  const batches = [];
  let batch = null;
  for (const it of items) {
    if (it.tasks.length === 0) continue;
    if (!batch || batch.cells + cellsOf(it) > budget) {
      batch = { items: [], cells: stateCells, lines: head.length, maxBranches: 0, parallel: 0 };
      batches.push(batch);
    }
    batch.items.push(it);
    batch.cells += cellsOf(it);
    batch.lines += linesOf(it);
  }
  for (const b of batches) b.maxBranches = Math.min(b.lines, cap);
  for (const b of batches) {
    b.parallel = b.maxBranches - head.length - b.items.filter((it) => it.head).length;
    checkWidth(b.items, b.parallel, 'maxBranches');
  }
  return { look, head, stateTokens, items, batches };
}

/**
 * The plan of `line.decide`: the line's text so far is the state; each question goes on a fork
 * of it after a blank line, raw (as `template: 'raw'`).
 */
function planOnLine(ctx, checked, parseSpecial) {
  const look = { pieces: [''], tail: '\nAnswer:', labelPrefix: ' ' };
  const items = itemsOf(ctx, checked.questions, look, checked.settings, markerOf(ctx, parseSpecial));
  checkWidth(items, checked.parallel, 'parallel');
  return { look, items };
}

module.exports = { planDecision, planOnLine, mediaStateOf, questionHeads, questionTokens };
