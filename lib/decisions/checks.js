'use strict';

/**
 * The protocols' checks of a decision (docs/decisions.md): what `scheduler.decide`, `line.decide`,
 * `POST /v1/systemone` and `POST /v1/decisions` are given, checked into ONE shape that the plan
 * (./plan.js) lays out and ./ask.js asks. Two request formats arrive here:
 *
 * - System One (Krite Protocol v1): `{ state, questions: { name: { type: noul|choice|score,
 *   instructions, criteria } } }`;
 * - OpenAI's Decisions API: `{ input: string | items[], questions: [{ type: predicate|choice|score,
 *   name?, instructions, choices | levels }] }`.
 *
 * Both become `{ source, questions: Question[], settings }`: `source` the state (its text, or chat
 * messages), every question `{ name, param, type: 'noul'|'choice'|'score', instructions, images,
 * options: [{ name, description, value }], refusal }` in the order given (`images`: the bytes of an
 * OpenAI question's `input_image` parts, marked in its instructions). Nothing here reads the model.
 */

const { invalidArg: refused } = require('../errors');
const { MEDIA_MARKER, dataUrlBytes } = require('../chat-images');

const TYPES = ['noul', 'choice', 'score'];
const NAME = /^[A-Za-z0-9_.-]{1,64}$/;
const MAX_OPTIONS = 255;
/** Levels of a System One score (its digits are one token each); OpenAI's may have as many as choices. */
const MAX_LEVELS = 10;
/** Orders of the options one question may be scored under (`permute`). */
const MAX_PERMUTE = 10;
/** Questions one System One decision may ask (a caller may lower it: the server's limit). */
const MAX_QUESTIONS = 64;
/** Questions one OpenAI decision may ask (the API's own limit). */
const MAX_OPENAI_QUESTIONS = 400;
const LIBRARY_FIELDS = ['template', 'permute', 'read', 'maxQuestions', 'maxBranches', 'signal'];
const SYSTEMONE_FIELDS = ['state', 'questions', 'images', ...LIBRARY_FIELDS];
const OPENAI_FIELDS = ['input', 'questions', 'promptCacheKey', 'safetyIdentifier', ...LIBRARY_FIELDS];
const LINE_FIELDS = ['permute', 'read', 'maxQuestions', 'parallel'];

/**
 * Where image `k` of a decision's input (or of a question's instructions) goes in its text, until
 * the plan cuts the text there into text and images (./plan.js). Control characters: client text
 * holding NUL is refused.
 */
const imageMark = (/** @type {number} */ k) => `\u0000\u0001image${k}\u0001\u0000`;
// eslint-disable-next-line no-control-regex -- the marks are control characters on purpose (see above)
const IMAGE_MARK = /\u0000\u0001image(\d+)\u0001\u0000/;

/**
 * System One's `images` (the library: bytes or data URLs; the wire: data URLs or bare base64) in
 * the state's text: each `<__media__>` in it takes the next image, the rest follow the text.
 */
function stateWithImages(text, given, images) {
  if (given === undefined || given === null) return text;
  if (!Array.isArray(given) || given.length === 0 || given.length > 64)
    throw refused('images must be an array of 1 to 64 images (base64 data URLs, or bytes in the library)', 'images');
  given.forEach((image, i) => {
    const at = `images[${i}]`;
    if (image instanceof Uint8Array) images.push(Buffer.from(image));
    else if (typeof image === 'string' && /^data:/i.test(image)) images.push(dataUrlBytes(image, at, '', at));
    else if (typeof image === 'string' && /^[A-Za-z0-9+/]+={0,2}$/.test(image))
      images.push(dataUrlBytes(`data:;base64,${image}`, at, '', at));
    else
      throw refused(
        `${at} must be a base64 data URL (data:image/png;base64,...) or base64 text; URLs are never fetched`,
        at,
      );
  });
  let k = 0;
  const placed = text
    .split(MEDIA_MARKER)
    .reduce((out, piece, i) => (i === 0 ? piece : out + imageMark(k++) + piece), '');
  if (k > images.length)
    throw refused(`state has ${k} ${MEDIA_MARKER} markers and images holds ${images.length} images`, 'images');
  let rest = '';
  while (k < images.length) rest += `\n${imageMark(k++)}`;
  return placed + rest;
}

/** The bytes of an `input_image` part: a base64 data URL only (nothing is fetched). */
function imageBytes(part, at) {
  const url = part.image_url;
  if (typeof url !== 'string')
    throw refused(
      `${at}.image_url must be a data: URL of the image (data:image/png;base64,...); file ids are not taken`,
      at,
    );
  return dataUrlBytes(url, at, '.image_url', at);
}

const isPlainObject = (v) => v !== null && typeof v === 'object' && !Array.isArray(v);
const hasOwn = (o, k) => Object.prototype.hasOwnProperty.call(o, k);

/**
 * Client text as the plan may use it: NUL is refused because the plan marks where the question
 * and the cache breakpoints go with it.
 */
function checkText(value, param) {
  if (value.includes('\u0000')) throw refused(`${param} must not contain NUL characters`, param);
  return value;
}

function checkDescription(value, param) {
  if (value !== null && value !== undefined && typeof value !== 'string')
    throw refused(`${param} must be a string or null`, param);
  return typeof value === 'string' && value.trim() !== '' ? checkText(value.trim(), param) : null;
}

/** A question's count of options (or levels) within 2..`max`, else the protocol's refusal. */
function checkCount(count, max, param, what, items) {
  if (count < 2) throw refused(`${param}: ${what} needs at least 2 ${items}, got ${count}`, param);
  if (count > max)
    throw refused(`${param}: ${what} has at most ${max} ${items}, got ${count}`, param, 'too_many_options');
}

/**
 * The instructions of a question: non-empty text (System One), or text and parts (OpenAI), whose
 * `input_image` parts add their bytes to `images` and their marks to the text.
 */
function checkInstructions(value, param, images) {
  if (typeof value === 'string') {
    if (value.trim() === '') throw refused(`${param} must be a non-empty string: the question to answer`, param);
    return checkText(value.trim(), param);
  }
  if (!Array.isArray(value) || value.length === 0)
    throw refused(`${param} must be a non-empty string or a non-empty array of input parts`, param);
  const texts = value.map((part, i) => {
    const at = `${param}[${i}]`;
    if (part && part.type === 'input_image') {
      images.push(imageBytes(part, at));
      return imageMark(images.length - 1);
    }
    return partText(part, at, ['input_text', 'input_json']);
  });
  const text = texts.join('\n').trim();
  if (text === '') throw refused(`${param} holds no text`, param);
  return text;
}

/** The text of one content part (`input_text`, `input_json`, `output_text`, `refusal`). */
function partText(part, at, allowed) {
  if (!isPlainObject(part) || !allowed.includes(part.type))
    throw refused(`${at} must be a part of type ${allowed.join(', ')}`, at);
  if (part.type === 'input_json') {
    if (!isPlainObject(part.data) && !Array.isArray(part.data))
      throw refused(`${at}.data must be a JSON object or an array of objects`, at);
    return checkText(JSON.stringify(part.data, null, 2), at);
  }
  const field = part.type === 'refusal' ? 'refusal' : 'text';
  if (typeof part[field] !== 'string') throw refused(`${at}.${field} must be a string`, at);
  return checkText(part[field], at);
}

/** System One: a question's options from its `criteria`. */
function systemOneOptions(type, criteria, param, maxOptions) {
  if (type === 'noul') {
    if (criteria !== undefined && criteria !== null && !isPlainObject(criteria))
      throw refused(`${param} of a noul must be an object { true?, false? } of descriptions`, param);
    const c = criteria || {};
    for (const key of Object.keys(c)) {
      if (key !== 'true' && key !== 'false')
        throw refused(`${param} of a noul has only 'true' and 'false', got ${JSON.stringify(key)}`, param);
    }
    return [
      { name: 'true', value: true, description: checkDescription(c.true, `${param}.true`) },
      { name: 'false', value: false, description: checkDescription(c.false, `${param}.false`) },
    ];
  } else if (type === 'choice') {
    if (!isPlainObject(criteria))
      throw refused(`${param} of a choice must map each option's name to a description (or null)`, param);
    const names = Object.keys(criteria);
    checkCount(names.length, maxOptions, param, 'a choice', 'options');
    return names.map((n) => {
      if (n.trim() === '') throw refused(`${param}: option names must not be empty or blank`, param);
      return { name: checkText(n, param), value: n, description: checkDescription(criteria[n], `${param}.${n}`) };
    });
  }
  if (!Array.isArray(criteria))
    throw refused(`${param} of a score must be an array of its level names, lowest first`, param);
  checkCount(criteria.length, MAX_LEVELS, param, 'a score', 'levels');
  if (!criteria.every((l) => typeof l === 'string' && l.trim() !== ''))
    throw refused(`${param}: every level must be a non-empty string`, param);
  if (new Set(criteria).size !== criteria.length) throw refused(`${param}: the levels must be distinct`, param);
  return criteria.map((l, i) => ({ name: checkText(l, param), value: i, description: null }));
}

/** System One: one question, `name` its key in `questions`. */
function systemOneQuestion(name, q, maxOptions) {
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
  if (typeof q.instructions !== 'string')
    throw refused(`${at}.instructions must be a non-empty string: the question to answer`, `${at}.instructions`);
  const text = checkInstructions(q.instructions, `${at}.instructions`, []);
  const options = systemOneOptions(q.type, q.criteria, `${at}.criteria`, maxOptions);
  return { name, param: at, type: q.type, instructions: text, images: [], options, refusal: null };
}

/** System One's `questions` (name → question), checked, in their order. */
function systemOneQuestions(questions, maxQuestions, maxOptions = MAX_OPTIONS) {
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
  return names.map((n) => systemOneQuestion(n, questions[n], maxOptions));
}

/** OpenAI: a choice's `choices` as options; values typed (the string "true" is not the boolean true). */
function openAIChoices(choices, at) {
  if (!Array.isArray(choices))
    throw refused(`${at}.choices must be an array of { value, description? }`, `${at}.choices`);
  checkCount(choices.length, MAX_OPTIONS, `${at}.choices`, 'a choice', 'choices');
  const seen = new Set();
  return choices.map((c, j) => {
    const param = `${at}.choices[${j}]`;
    if (!isPlainObject(c)) throw refused(`${param} must be an object { value, description? }`, param);
    for (const key of Object.keys(c))
      if (key !== 'value' && key !== 'description') throw refused(`${param} has an unknown field ${key}`, param);
    if (typeof c.value !== 'boolean' && (typeof c.value !== 'string' || c.value.trim() === ''))
      throw refused(`${param}.value must be a non-empty string or a boolean`, `${param}.value`);
    const key = `${typeof c.value}:${c.value}`;
    if (seen.has(key))
      throw refused(`${at}.choices: every choice must be unique (${JSON.stringify(c.value)} twice)`, param);
    seen.add(key);
    const name = typeof c.value === 'string' ? checkText(c.value, `${param}.value`) : String(c.value);
    return { name, value: c.value, description: checkDescription(c.description, `${param}.description`) };
  });
}

/** OpenAI: a score's `levels` (lowest first) as options; each answer's `value` is the level's index. */
function openAILevels(levels, at) {
  if (!Array.isArray(levels)) throw refused(`${at}.levels must be an array of { label, description? }`, `${at}.levels`);
  checkCount(levels.length, MAX_OPTIONS, `${at}.levels`, 'a score', 'levels');
  const seen = new Set();
  return levels.map((l, j) => {
    const param = `${at}.levels[${j}]`;
    if (!isPlainObject(l) || typeof l.label !== 'string' || l.label.trim() === '')
      throw refused(`${param} must be an object { label, description? } with a non-empty label`, param);
    for (const key of Object.keys(l))
      if (key !== 'label' && key !== 'description') throw refused(`${param} has an unknown field ${key}`, param);
    if (seen.has(l.label)) throw refused(`${at}.levels: the labels must be distinct`, param);
    seen.add(l.label);
    return {
      name: checkText(l.label, param),
      value: j,
      description: checkDescription(l.description, `${param}.description`),
    };
  });
}

/** OpenAI: one question of the `questions` list, at index `i`. */
function openAIQuestion(q, i) {
  const at = `questions[${i}]`;
  if (!isPlainObject(q)) throw refused(`${at} must be a question object`, at);
  const byType = { predicate: [], choice: ['choices'], score: ['levels'] };
  const fields = typeof q.type === 'string' && hasOwn(byType, q.type) ? byType[q.type] : null;
  if (!fields) throw refused(`${at}.type must be 'predicate', 'choice' or 'score'`, `${at}.type`);
  for (const key of Object.keys(q)) {
    if (!['type', 'name', 'instructions', ...fields].includes(key))
      throw refused(`${at} has an unknown field ${JSON.stringify(key)}`, `${at}.${key}`);
  }
  if (q.name !== undefined && q.name !== null && (typeof q.name !== 'string' || q.name === '' || q.name.length > 256))
    throw refused(`${at}.name must be a non-empty string of at most 256 characters`, `${at}.name`);
  /** @type {Buffer[]} */
  const images = [];
  const instructions = checkInstructions(q.instructions, `${at}.instructions`, images);
  const options =
    q.type === 'predicate'
      ? [
          { name: 'true', value: true, description: null },
          { name: 'false', value: false, description: null },
        ]
      : q.type === 'choice'
        ? openAIChoices(q.choices, at)
        : openAILevels(q.levels, at);
  return {
    name: typeof q.name === 'string' ? q.name : null,
    param: at,
    type: q.type === 'predicate' ? 'noul' : q.type,
    instructions,
    images,
    options,
    refusal: null,
  };
}

/** OpenAI's `questions` (a list of 1..max), checked, in their order. */
function openAIQuestions(questions, maxQuestions) {
  if (!Array.isArray(questions) || questions.length === 0)
    throw refused(`questions must be an array of 1-${maxQuestions} questions`, 'questions');
  if (questions.length > maxQuestions)
    throw refused(
      `at most ${maxQuestions} questions per decision, got ${questions.length}`,
      'questions',
      'too_many_questions',
    );
  return questions.map(openAIQuestion);
}

/**
 * The content of one input message as text, and where its parts end (breakpoints: offsets). An
 * `input_image` part (a user's) adds its bytes to `images` and its mark to the text.
 */
function contentOf(content, at, allowed, images) {
  if (typeof content === 'string') return { text: checkText(content, at), breaks: [] };
  if (!Array.isArray(content)) throw refused(`${at} must be a string or an array of parts`, at);
  const texts = [];
  const breaks = [];
  let length = 0;
  content.forEach((part, j) => {
    const param = `${at}[${j}]`;
    let text;
    if (part && part.type === 'input_image' && allowed.includes('input_image')) {
      images.push(imageBytes(part, param));
      text = imageMark(images.length - 1);
    } else text = partText(part, param, allowed);
    if (texts.length > 0) length += 2; // the parts are joined by a blank line
    texts.push(text);
    length += text.length;
    const bp = part.prompt_cache_breakpoint;
    if (bp !== undefined && bp !== null) {
      if (!isPlainObject(bp) || bp.mode !== 'explicit')
        throw refused(
          `${param}.prompt_cache_breakpoint must be { mode: 'explicit' }`,
          `${param}.prompt_cache_breakpoint`,
        );
      breaks.push(length);
    }
  });
  return { text: texts.join('\n\n'), breaks };
}

const ROLE_PARTS = {
  user: ['input_text', 'input_json', 'input_image'],
  developer: ['input_text'],
  system: ['input_text'],
  assistant: ['output_text', 'refusal'],
};

/**
 * OpenAI's `input` as chat messages `{ role, content, breaks }` (`breaks`: offsets in `content`
 * where a `prompt_cache_breakpoint` part ends). Function and custom tool calls and their outputs
 * are written as text turns (the assistant's call, the tool's output as the user's), so every
 * chat template renders them; an output must name a call made before it.
 */
function openAIInput(input, images) {
  if (typeof input === 'string') {
    if (input.trim() === '') throw refused('input must be a non-empty string or a non-empty array of items', 'input');
    return [{ role: 'user', content: checkText(input, 'input'), breaks: [] }];
  }
  if (!Array.isArray(input) || input.length === 0)
    throw refused('input must be a non-empty string or a non-empty array of items', 'input');
  const calls = new Map();
  return input.map((item, i) => {
    const at = `input[${i}]`;
    if (!isPlainObject(item)) throw refused(`${at} must be an object`, at);
    const type = item.type === undefined ? 'message' : item.type;
    if (type === 'message') {
      const allowed = typeof item.role === 'string' && hasOwn(ROLE_PARTS, item.role) ? ROLE_PARTS[item.role] : null;
      if (!allowed) throw refused(`${at}.role must be user, developer, system or assistant`, `${at}.role`);
      const { text, breaks } = contentOf(item.content, `${at}.content`, allowed, images);
      return { role: item.role === 'developer' ? 'system' : item.role, content: text, breaks };
    }
    if (type === 'function_call' || type === 'custom_tool_call') {
      const args = type === 'function_call' ? 'arguments' : 'input';
      for (const field of ['call_id', 'name', args])
        if (typeof item[field] !== 'string') throw refused(`${at}.${field} must be a string`, `${at}.${field}`);
      if (item.call_id === '') throw refused(`${at}.call_id must not be empty`, `${at}.call_id`);
      calls.set(item.call_id, type);
      const text = `[call ${item.call_id}] ${item.name}(${item[args]})`;
      return { role: 'assistant', content: checkText(text, at), breaks: [] };
    }
    if (type === 'function_call_output' || type === 'custom_tool_call_output') {
      if (typeof item.call_id !== 'string') throw refused(`${at}.call_id must be a string`, `${at}.call_id`);
      const made = calls.get(item.call_id);
      if (made === undefined || `${made}_output` !== type)
        throw refused(
          `${at}.call_id ${JSON.stringify(item.call_id)} names no ${type.replace(/_output$/, '')} before it in input`,
          `${at}.call_id`,
        );
      const { text, breaks } = contentOf(item.output, `${at}.output`, ['input_text'], images);
      const head = `[output of call ${item.call_id}]\n`;
      return { role: 'user', content: head + text, breaks: breaks.map((b) => b + head.length) };
    }
    throw refused(`${at}.type ${JSON.stringify(type)} is not an input item type`, `${at}.type`);
  });
}

/** The options of a library decision besides its input and questions, checked. */
function checkSettings(settings, where, maxQuestions) {
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
  const most = settings.maxQuestions === undefined ? maxQuestions : settings.maxQuestions;
  if (!Number.isInteger(most) || most < 1)
    throw refused(`${where}: maxQuestions must be a positive integer`, 'maxQuestions');
  return { template, permute, read, maxQuestions: most };
}

/** System One's state as text: a string as it is, an object as indented JSON. */
function stateText(state) {
  if (typeof state === 'string') return checkText(state, 'state');
  if (isPlainObject(state)) {
    let text;
    try {
      text = JSON.stringify(state, null, 2);
    } catch (e) {
      throw refused(`state could not be written as JSON: ${e.message}`, 'state');
    }
    return checkText(text, 'state');
  }
  throw refused('state must be a string or a JSON object', 'state');
}

/**
 * A `scheduler.decide` request in either format, checked: `{ format: 'systemone'|'openai',
 * messages, questions, settings, maxBranches, signal, promptCacheKey }`. `messages`: the state as
 * chat messages (System One's state is one user message).
 */
function checkRequest(request) {
  const where = 'decide(request)';
  if (!isPlainObject(request))
    throw refused(
      `${where}: request must be an object { state, questions } (System One) or { input, questions } (OpenAI)`,
    );
  const format = hasOwn(request, 'input') ? 'openai' : 'systemone';
  const fields = format === 'openai' ? OPENAI_FIELDS : SYSTEMONE_FIELDS;
  for (const key of Object.keys(request)) {
    if (!fields.includes(key))
      throw refused(`${where}: unknown field ${JSON.stringify(key)}; known: ${fields.join(', ')}`, key);
  }
  let messages, questions, settings;
  /** @type {Buffer[]} the input's images, in order (their marks are in `messages`) */
  const images = [];
  if (format === 'openai') {
    settings = checkSettings(request, where, MAX_OPENAI_QUESTIONS);
    messages = openAIInput(request.input, images);
    questions = openAIQuestions(request.questions, settings.maxQuestions);
    /** @type {[string, number][]} */
    const strings = [
      ['promptCacheKey', 1024],
      ['safetyIdentifier', 256],
    ];
    for (const [field, max] of strings) {
      const v = request[field];
      if (v !== undefined && v !== null && (typeof v !== 'string' || v.length > max))
        throw refused(`${where}: ${field} must be a string of at most ${max} characters`, field);
    }
  } else {
    if (!hasOwn(request, 'state')) throw refused(`${where}: state is required (a string or a JSON object)`, 'state');
    settings = checkSettings(request, where, MAX_QUESTIONS);
    messages = [
      { role: 'user', content: stateWithImages(stateText(request.state), request.images, images), breaks: [] },
    ];
    questions = systemOneQuestions(request.questions, settings.maxQuestions);
  }
  return {
    format,
    messages,
    images,
    questions,
    settings,
    maxBranches: request.maxBranches,
    signal: request.signal,
    promptCacheKey: typeof request.promptCacheKey === 'string' ? request.promptCacheKey : null,
  };
}

/** `line.decide(questions, options)`'s arguments, checked: `{ questions, settings, parallel }`. */
function checkLineDecision(questions, options) {
  const where = 'decide(questions, options?)';
  const opts = options === undefined ? {} : options;
  if (opts === null || typeof opts !== 'object') throw refused(`${where}: options must be an object`);
  for (const key of Object.keys(opts)) {
    if (!LINE_FIELDS.includes(key))
      throw refused(`${where}: unknown option ${JSON.stringify(key)}; known: ${LINE_FIELDS.join(', ')}`, key);
  }
  const settings = checkSettings({ ...opts, template: 'raw' }, where, MAX_QUESTIONS);
  const parallel = opts.parallel === undefined ? 3 : opts.parallel;
  if (!Number.isInteger(parallel) || parallel < 1)
    throw refused(`${where}: parallel must be a positive integer (lines at once beside the line)`, 'parallel');
  return { questions: systemOneQuestions(questions, settings.maxQuestions), settings, parallel };
}

module.exports = {
  IMAGE_MARK,
  checkRequest,
  checkLineDecision,
  systemOneQuestions,
  stateText,
  MAX_OPTIONS,
  MAX_LEVELS,
  MAX_QUESTIONS,
  MAX_OPENAI_QUESTIONS,
  MAX_PERMUTE,
};
