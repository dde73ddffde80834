'use strict';

/**
 * Typed decisions (`scheduler.decide()`, `line.decide()`; docs/decisions.md): closed questions
 * about a state — `noul` (yes/no), `choice` (one of 2–255 named options), `score` (an ordered scale
 * of 2–10 levels) — answered with probabilities, nothing generated. The shapes are the System One
 * wire format's (Krite Protocol v1), in camelCase where they are JavaScript.
 *
 * Built on the public API of branch programs only (`scheduler.run`, and a line's `append`, `fork`,
 * `select`, `logprobs`, `release`): the state is one line, prefilled once; each question, and each
 * order of its options under `permute`, is a fork of it with the question's text appended; every
 * fork's read is issued at once, so the scheduler prefills the forks' texts and reads their
 * answers in the same steps (and beside everything else it runs).
 *
 * How an answer is read: when every option's label (`A`, `B`, … for a choice, `Yes`/`No`, the
 * level digits of a score) is one token where the answer starts, the question's fork reads all of
 * them from its one logits row (`logprobs`). Otherwise the options are listed by name and the names
 * themselves are scored as continuations (`select`: a trie, shared tokens scored once). Either way
 * the probabilities are a softmax over the options alone.
 */

const { makeError } = require('../errors');

const TYPES = ['noul', 'choice', 'score'];
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const LETTERS = 'ABCDEFGHIJKLMNOPQRSTUVWXYZ'.split('');
const MAX_OPTIONS = 255;
const MAX_LEVELS = 10;
/** Orders of the options one question may be scored under (`permute`). */
const MAX_PERMUTE = 10;
/** Questions one decision may ask (a caller may lower it: the server's limit). */
const MAX_QUESTIONS = 64;
const REQUEST_FIELDS = ['state', 'questions', 'template', 'permute', 'read', 'maxQuestions', 'maxBranches', 'signal'];
const LINE_FIELDS = ['permute', 'read', 'maxQuestions', 'parallel'];
/**
 * `scheduler.decide` hands its checked plan and layout to the root line's `decide` under this key
 * (not a public option: a symbol, so no JSON or user object can carry it).
 */
const LAID_OUT = Symbol('decide: the plan and layout scheduler.decide made');
/** Cells added per line beyond its own tokens: a fork that re-decodes the token before it. */
const SLACK_PER_LINE = 2;
/**
 * What splits the chat template's rendering of the user turn into the state (before) and what
 * follows the question (after). Control characters: no state or question is expected to hold it.
 */
const SENTINEL = '\u0000\u0001question\u0001\u0000';

/** An ERR_INVALID_ARG whose `param` names the field and `reason` the protocol's error type. */
function refused(message, param = null, reason = 'invalid_request') {
  const err = makeError('ERR_INVALID_ARG', message);
  Object.assign(err, { param, reason });
  return err;
}

const isPlainObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

function checkDescription(value, param) {
  if (value !== null && value !== undefined && typeof value !== 'string')
    throw refused(`${param} must be a string or null`, param);
  return typeof value === 'string' && value.trim() !== '' ? value.trim() : null;
}

/** A question's count of options (or levels) within 2..`max`, else the protocol's refusal. */
function checkCount(count, max, param, what, items) {
  if (count < 2) throw refused(`${param}: ${what} needs at least 2 ${items}, got ${count}`, param);
  if (count > max)
    throw refused(`${param}: ${what} has at most ${max} ${items}, got ${count}`, param, 'too_many_options');
}

/** A question's options from its `criteria` (see checkQuestion). */
function optionsOf(type, criteria, param, maxOptions) {
  if (type === 'noul') {
    if (criteria !== undefined && criteria !== null && !isPlainObject(criteria))
      throw refused(`${param} of a noul must be an object { true?, false? } of descriptions`, param);
    const c = criteria || {};
    for (const key of Object.keys(c)) {
      if (key !== 'true' && key !== 'false')
        throw refused(`${param} of a noul has only 'true' and 'false', got ${JSON.stringify(key)}`, param);
    }
    return [
      { name: 'true', description: checkDescription(c.true, `${param}.true`) },
      { name: 'false', description: checkDescription(c.false, `${param}.false`) },
    ];
  } else if (type === 'choice') {
    if (!isPlainObject(criteria))
      throw refused(`${param} of a choice must map each option's name to a description (or null)`, param);
    const names = Object.keys(criteria);
    checkCount(names.length, maxOptions, param, 'a choice', 'options');
    return names.map((n) => {
      if (n.trim() === '') throw refused(`${param}: option names must not be empty or blank`, param);
      return { name: n, description: checkDescription(criteria[n], `${param}.${n}`) };
    });
  } else {
    if (!Array.isArray(criteria))
      throw refused(`${param} of a score must be an array of its level names, lowest first`, param);
    checkCount(criteria.length, MAX_LEVELS, param, 'a score', 'levels');
    if (!criteria.every((l) => typeof l === 'string' && l.trim() !== ''))
      throw refused(`${param}: every level must be a non-empty string`, param);
    if (new Set(criteria).size !== criteria.length) throw refused(`${param}: the levels must be distinct`, param);
    return criteria.map((l) => ({ name: l, description: null }));
  }
}

/**
 * One question, checked: `{ name, type, instructions, options: [{ name, description }] }` where
 * a noul's options are `true` then `false`, a choice's are its criteria in order, a score's its
 * levels lowest first.
 */
function checkQuestion(name, q, maxOptions) {
  const at = `questions.${name}`;
  if (!NAME.test(name))
    throw refused(
      `question name ${JSON.stringify(name)} must be 1-64 characters of A-Z, a-z, 0-9, '_', '.' or '-'`,
      'questions',
    );
  if (!isPlainObject(q)) throw refused(`${at} must be an object with type, instructions and criteria`, at);
  if (!TYPES.includes(q.type))
    throw refused(`${at}.type must be 'noul', 'choice' or 'score', got ${JSON.stringify(q.type)}`, `${at}.type`);
  for (const key of Object.keys(q)) {
    if (!['type', 'instructions', 'criteria'].includes(key))
      throw refused(
        `${at} has an unknown field ${JSON.stringify(key)}; a question has type, instructions and criteria`,
        `${at}.${key}`,
      );
  }
  if (typeof q.instructions !== 'string' || q.instructions.trim() === '')
    throw refused(`${at}.instructions must be a non-empty string: the question to answer`, `${at}.instructions`);
  const instructions = q.instructions.trim();
  const options = optionsOf(q.type, q.criteria, `${at}.criteria`, maxOptions);
  return { name, type: q.type, instructions, options };
}

/** `questions`, checked, in their order. */
function checkQuestions(questions, maxQuestions, maxOptions = MAX_OPTIONS) {
  if (!isPlainObject(questions))
    throw refused('questions must be an object mapping each question name to a question', 'questions');
  const names = Object.keys(questions);
  if (names.length === 0) throw refused('questions must hold at least one question', 'questions');
  if (names.length > maxQuestions)
    throw refused(
      `at most ${maxQuestions} questions per decision, got ${names.length}; split them over several decisions`,
      'questions',
      'too_many_questions',
    );
  return names.map((n) => checkQuestion(n, questions[n], maxOptions));
}

/** The options of `decide()` besides state and questions, checked. */
function checkSettings(settings, where) {
  if (settings === null || typeof settings !== 'object') throw refused(`${where}: options must be an object`);
  const template = settings.template === undefined ? 'chat' : settings.template;
  if (template !== 'chat' && template !== 'raw')
    throw refused(`${where}: template must be 'chat' or 'raw', got ${JSON.stringify(template)}`, 'template');
  const permute = settings.permute === undefined ? 1 : settings.permute;
  if (!Number.isInteger(permute) || permute < 1 || permute > MAX_PERMUTE)
    throw refused(`${where}: permute must be an integer in 1..${MAX_PERMUTE}, got ${permute}`, 'permute');
  const read = settings.read === undefined ? 'auto' : settings.read;
  if (!['auto', 'label', 'text'].includes(read))
    throw refused(`${where}: read must be 'auto', 'label' or 'text', got ${JSON.stringify(read)}`, 'read');
  const maxQuestions = settings.maxQuestions === undefined ? MAX_QUESTIONS : settings.maxQuestions;
  if (!Number.isInteger(maxQuestions) || maxQuestions < 1)
    throw refused(`${where}: maxQuestions must be a positive integer`, 'maxQuestions');
  return { template, permute, read, maxQuestions };
}

/** The state as text: a string as it is, an object as indented JSON. */
function stateText(state) {
  if (typeof state === 'string') return state;
  if (isPlainObject(state)) {
    try {
      return JSON.stringify(state, null, 2);
    } catch (e) {
      throw refused(`state could not be written as JSON: ${e.message}`, 'state');
    }
  }
  throw refused('state must be a string or a JSON object', 'state');
}

/**
 * Where the answer starts and how labels are written there: in a chat, the model's turn is open
 * and the label is its first text; raw, the question ends `Answer:` and the label follows a space.
 * `head`: the state's text (with the template's opening), `tail`: what closes each question.
 */
function layout(ctx, text, template) {
  if (template === 'raw') return { head: `${text}\n\n`, tail: '\nAnswer:', labelPrefix: ' ' };
  let prompt;
  try {
    prompt = ctx.formatChatSync([{ role: 'user', content: `${text}\n\n${SENTINEL}` }]).prompt;
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
  return { head: prompt.slice(0, at), tail: prompt.slice(at + SENTINEL.length), labelPrefix: '' };
}

/** Per context: whether `label` is one token right after `tail` (memoized: tokenizing is cheap, not free). */
const singleTokens = new WeakMap();
function labelToken(ctx, tail, label) {
  let memo = singleTokens.get(ctx);
  if (!memo) singleTokens.set(ctx, (memo = new Map()));
  const key = `${tail}\u0000${label}`;
  if (!memo.has(key)) {
    const before = ctx.tokenizeSync(tail, false);
    const after = ctx.tokenizeSync(tail + label, false);
    const same = before.every((t, i) => after[i] === t);
    memo.set(key, same && after.length === before.length + 1 ? after[after.length - 1] : null);
  }
  return memo.get(key);
}

/** Labels of a question's options (by option index) in label mode. */
function labelsOf(question) {
  if (question.type === 'noul') return ['Yes', 'No'];
  if (question.type === 'score') return question.options.map((_, i) => String(i));
  return question.options.length <= LETTERS.length ? LETTERS.slice(0, question.options.length) : null;
}

/**
 * How each question is read: `{ mode: 'label', ids }` (the label tokens of each option, in
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
      `questions.${question.name}: its option labels are not distinct single tokens for this model; use read: 'auto' or 'text'`,
      `questions.${question.name}`,
    );
  return { mode: 'text' };
}

/** One option's line in the question's text. */
const optionLine = (head, o) => (o.description ? `${head}: ${o.description}` : head);

/**
 * The text of `question` under cyclic shift `shift` of its options: the question, the options in
 * the shifted order, and how to answer. Returns the text and, per display position, the option.
 */
function questionText(question, reading, shift) {
  const n = question.options.length;
  const order = Array.from({ length: n }, (_, p) => (p + shift) % n); // display position → option
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

/** The label token of option `i` under `shift` (a choice's letters move with the display order). */
function labelIdOf(question, reading, i, shift) {
  if (question.type !== 'choice') return reading.ids[i];
  const n = question.options.length;
  return reading.ids[(i - shift + n) % n];
}

/** Softmax of log-scores. */
function softmax(scores) {
  const max = Math.max(...scores);
  const e = scores.map((s) => Math.exp(s - max));
  const sum = e.reduce((a, b) => a + b, 0);
  return e.map((x) => x / sum);
}

/** The protocol's confidence: 0 when every option is as likely, 1 when one holds all. */
function confidenceOf(p) {
  const n = p.length;
  return Math.min(1, Math.max(0, (Math.max(...p) - 1 / n) / (1 - 1 / n)));
}

/** The answer to one question from its options' probabilities (option order). */
function answerOf(question, p) {
  if (question.type === 'noul') return { type: 'noul', noul: p[0] };
  const probabilities = {};
  question.options.forEach((o, i) => {
    probabilities[o.name] = p[i];
  });
  const confidence = confidenceOf(p);
  if (question.type === 'choice') {
    const best = p.reduce((b, x, i) => (x > p[b] ? i : b), 0);
    return { type: 'choice', choice: question.options[best].name, probabilities, confidence };
  }
  const legend = {};
  question.options.forEach((o, i) => {
    legend[String(i)] = o.name;
  });
  return { type: 'score', score: p.reduce((s, x, i) => s + i * x, 0), legend, probabilities, confidence };
}

/** A counting semaphore over the lines a decision may hold at once. */
function lineBudget(total) {
  let free = total;
  const waiting = [];
  return {
    async take(n) {
      const want = Math.min(n, total);
      if (free >= want && waiting.length === 0) {
        free -= want;
        return want;
      }
      await new Promise((resolve) => waiting.push({ want, resolve }));
      return want;
    },
    give(n) {
      free += n;
      while (waiting.length > 0 && free >= waiting[0].want) {
        const next = waiting.shift();
        free -= next.want;
        next.resolve();
      }
    },
  };
}

/**
 * One question under one shift, on a fork of `stateLine`: its log-scores per option (option
 * order). Label mode reads the label tokens from the fork's one logits row; text mode scores the
 * option names with `select`, in chunks of what the budget allows when there are many.
 */
async function scoreTask(stateLine, task, look, budget, forks) {
  const { question, reading, shift } = task;
  const { text, order } = questionText(question, reading, shift);
  const held = await budget.take(task.lines);
  const line = stateLine.fork(1)[0];
  forks.push(line.id);
  try {
    line.append(`${text}${look.tail}`);
    const n = question.options.length;
    if (reading.mode === 'label') {
      const ids = question.options.map((_, i) => labelIdOf(question, reading, i, shift));
      return await line.logprobs(ids);
    }
    const names = question.type === 'noul' ? ['Yes', 'No'] : question.options.map((o) => o.name);
    const texts = order.map((i) => look.labelPrefix + names[i]); // scored in display order
    const scores = new Array(n);
    const put = (from, list) =>
      list.forEach((s, j) => {
        scores[order[from + j]] = s;
      });
    if (n <= held - 1) {
      put(0, (await line.select(texts)).scores); // every option's fork at once: one trie
    } else if (held - 2 >= 2) {
      // More options than lines: a fork per chunk scores its options (the sums are absolute
      // log-probabilities, so chunks compare), one chunk after another.
      const chunk = held - 2;
      for (let from = 0; from < n; from += chunk) {
        const scorer = line.fork(1)[0];
        try {
          put(from, (await scorer.select(texts.slice(from, from + chunk))).scores);
        } finally {
          scorer.release();
        }
      }
    } else {
      for (let i = 0; i < n; i++) put(i, [(await line.logprob(texts[i])).logprob]);
    }
    return scores;
  } finally {
    line.release();
    budget.give(held);
  }
}

/**
 * The plan of a decision: per question its reading and its tasks (one per shift), and what each
 * task holds: lines at once and tokens it decodes.
 */
function planOf(ctx, questions, look, settings) {
  return questions.map((question) => {
    const reading = readingOf(ctx, question, look, settings.read);
    const n = question.options.length;
    const shifts = Math.min(settings.permute, n);
    const tasks = [];
    for (let shift = 0; shift < shifts; shift++) {
      const { text } = questionText(question, reading, shift);
      const tokens = ctx.tokenizeSync(`${text}${look.tail}`, false).length;
      const optionTokens =
        reading.mode === 'label'
          ? 0
          : question.options.reduce(
              (sum, o) =>
                sum + ctx.tokenizeSync(look.labelPrefix + (question.type === 'noul' ? 'Yes' : o.name), false).length,
              0,
            );
      tasks.push({
        question,
        reading,
        shift,
        tokens: tokens + optionTokens,
        lines: reading.mode === 'label' ? 1 : 1 + n + 1,
      });
    }
    return { question, reading, tasks };
  });
}

/**
 * Asks every question of `plan` on forks of `stateLine` at once; resolves with the answers and,
 * per question, what the `decision` event shows of it (its forks, each option's probability).
 * @returns {Promise<{ answers: Record<string, any>, shown: any[] }>}
 */
async function askAll(stateLine, plan, look, budget) {
  const forks = plan.map(() => []);
  const perQuestion = plan.map(({ tasks }, q) =>
    Promise.all(tasks.map((t) => scoreTask(stateLine, t, look, budget, forks[q]))),
  );
  const scored = await Promise.all(perQuestion);
  const answers = {};
  const shown = plan.map(({ question, reading }, q) => {
    const runs = scored[q].map(softmax);
    const p = question.options.map((_, i) => runs.reduce((s, r) => s + r[i], 0) / runs.length);
    const answer = answerOf(question, p);
    answers[question.name] = answer;
    return {
      name: question.name,
      type: question.type,
      read: reading.mode,
      branches: forks[q],
      options: question.options.map((o, i) => ({ name: o.name, p: Math.round(p[i] * 10000) / 10000 })),
      answer: answer[question.type], // noul: P(true); choice: the winner's name; score: the level index
      confidence: confidenceOf(p),
    };
  });
  return { answers, shown };
}

/** Lines the decision needs at once for its widest task, checked against what it may hold. */
function checkWidth(tasks, total, param) {
  const needs = tasks.some((t) => t.reading.mode === 'text') ? 2 : 1;
  if (total < needs)
    throw refused(
      `decide: ${total} line(s) at once is too few; scoring option texts needs ${needs} (raise ${param})`,
      param,
    );
}

/**
 * `scheduler.decide(request)`: the state rendered and prefilled once on a program's root line,
 * every question a fork of it, all read in shared steps.
 * @param {{ run: Function }} scheduler
 * @param {import('../Context').SessionContext} ctx
 * @param {any} request
 * @returns {Promise<import('../types').DecideResult>}
 */
async function decide(scheduler, ctx, request) {
  const started = performance.now();
  if (!isPlainObject(request))
    throw refused('decide(request): request must be an object { state, questions, template?, permute?, read? }');
  for (const key of Object.keys(request)) {
    if (!REQUEST_FIELDS.includes(key))
      throw refused(`decide(request): unknown field ${JSON.stringify(key)}; known: ${REQUEST_FIELDS.join(', ')}`, key);
  }
  if (!hasOwn(request, 'state'))
    throw refused('decide(request): state is required (a string or a JSON object)', 'state');
  const settings = checkSettings(request, 'decide(request)');
  const questions = checkQuestions(request.questions, settings.maxQuestions);
  const look = layout(ctx, stateText(request.state), settings.template);
  const stateTokens = ctx.tokenizeSync(look.head, true).length;
  const plan = planOf(ctx, questions, look, settings);
  const tasks = plan.flatMap((p) => p.tasks);
  const questionTokens = tasks.reduce((s, t) => s + t.tokens, 0);
  const cells = stateTokens + questionTokens + SLACK_PER_LINE * (1 + tasks.reduce((s, t) => s + t.lines, 0));
  if (cells > ctx.nCtx) {
    const alone = stateTokens + Math.max(...tasks.map((t) => t.tokens)) > ctx.nCtx;
    throw refused(
      `decide: the state is ${stateTokens} tokens and the questions ${questionTokens} more, past the context's ${ctx.nCtx} KV cells; shorten the state, ask fewer questions or lower permute`,
      alone ? 'state' : 'questions',
      alone ? 'state_too_long' : 'too_many_questions',
    );
  }
  // Half the sequences by default: the rest stay for other requests and for the prefix cache,
  // which keeps the state for the next decision on it.
  const cap = request.maxBranches === undefined ? Math.max(3, Math.floor(ctx.nSeqMax / 2)) : request.maxBranches;
  if (!Number.isInteger(cap) || cap < 2 || cap > ctx.nSeqMax)
    throw refused(`decide(request): maxBranches must be an integer in 2..${ctx.nSeqMax} (nSeqMax)`, 'maxBranches');
  const maxBranches = Math.min(1 + tasks.reduce((s, t) => s + t.lines, 0), cap);
  checkWidth(tasks, maxBranches - 1, 'maxBranches');
  const answers = await scheduler.run(
    async (s) => {
      s.append(look.head);
      return s.decide(request.questions, { parallel: maxBranches - 1, [LAID_OUT]: { look, plan } });
    },
    { maxBranches, maxCells: cells, ...(request.signal ? { signal: request.signal } : {}) },
  );
  return {
    answers,
    usage: { inputTokens: stateTokens + questionTokens, stateTokens, outputTokens: /** @type {0} */ (0) },
    latencyMs: performance.now() - started,
  };
}

/**
 * `line.decide(questions, options)`: inside a program, the line's text so far is the state; each
 * question goes on a fork of it after a blank line, raw (as `template: 'raw'`); the line itself
 * does not change. `options.parallel`: lines the decision may hold at once beside the line
 * (default 3: a program's default `maxBranches` of 4, less the line). `scheduler.decide` passes
 * its checked plan and layout under the `LAID_OUT` key instead. `emit(fields)` sends the
 * line's `decision` event.
 * @param {any} line a ProgramLine
 * @param {import('../Context').SessionContext} ctx
 * @param {any} questions
 * @param {any} options undefined: the defaults
 * @param {(fields: object) => void} emit sends the line's `decision` event
 * @returns {Promise<Record<string, import('../types').DecisionAnswer>>}
 */
async function decideOnLine(line, ctx, questions, options, emit) {
  const opts = options === undefined ? {} : options;
  const laidOut = opts !== null && typeof opts === 'object' ? opts[LAID_OUT] : undefined;
  let plan, look, parallel, state;
  if (laidOut) {
    // scheduler.decide: the line holds the state as its layout put it; checked there
    ({ plan, look } = laidOut);
    parallel = opts.parallel;
    state = line;
  } else {
    const where = 'decide(questions, options?)';
    if (opts === null || typeof opts !== 'object') throw refused(`${where}: options must be an object`);
    for (const key of Object.keys(opts)) {
      if (!LINE_FIELDS.includes(key))
        throw refused(`${where}: unknown option ${JSON.stringify(key)}; known: ${LINE_FIELDS.join(', ')}`, key);
    }
    const settings = checkSettings({ ...opts, template: 'raw' }, where);
    parallel = opts.parallel === undefined ? 3 : opts.parallel;
    if (!Number.isInteger(parallel) || parallel < 1)
      throw refused(`${where}: parallel must be a positive integer (lines at once beside the line)`, 'parallel');
    const list = checkQuestions(questions, settings.maxQuestions);
    if (line.tokens.length === 0) throw refused('decide(): the line is empty; append the state first');
    look = { head: '', tail: '\nAnswer:', labelPrefix: ' ' };
    plan = planOf(ctx, list, look, settings);
    checkWidth(
      plan.flatMap((p) => p.tasks),
      parallel,
      'parallel',
    );
    state = { fork: (n) => line.fork(n).map((f) => f.append('\n\n')) };
  }
  const { answers, shown } = await askAll(state, plan, look, lineBudget(parallel));
  emit({ questions: shown });
  return answers;
}

module.exports = {
  decide,
  decideOnLine,
  checkQuestions,
  stateText,
  confidenceOf,
  MAX_OPTIONS,
  MAX_LEVELS,
  MAX_QUESTIONS,
  MAX_PERMUTE,
};
