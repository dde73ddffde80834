'use strict';

/**
 * `scheduler.generate()`'s front door: the request checked, then a Program (./program.js) built
 * from what it needs — ONE prompt line (cut into cache entries at its system prompt's end and at
 * its own end) forked `n` times, each fork running a gen whose sink is a `Choice`. Its own part is
 * the preparation (chat template, tokenization) and the `Generation` it settles: n choices (those
 * still running when it is aborted or the scheduler closes end 'abort'), or a rejection.
 */

const { SEED_SPACE, invalid, positiveInt, checkInput, checkStops, checkLogprobs, checkSampling } = require('./checks');
const { checkChat, formatTurn, ChatStream } = require('./chat');
const { spellsSpecial, markMessages } = require('./plain-text');
const { signalOf } = require('../cancel');
const { GenJob } = require('./jobs');
const { Choice } = require('./choice');
const { Program } = require('./program');
const { Generation } = require('./generation');
const { imagesOfPrompt } = require('./events');
const { hasImages, markImages, mediaPromptOf, imagesWithSpecialText } = require('./media');

/**
 * Checks `request` (throws ERR_INVALID_ARG) and builds its program, which starts queued (its
 * preparation runs between the Scheduler's steps, in order).
 * @param {any} request what `generate` was given
 * @param {any} env what every program is given (./program.js), with `vocabSize` and `spec`
 * @returns {{ program: Program, generation: Generation }}
 */
function requestProgram(request, env) {
  checkInput(request, env.vocabSize);
  const { params, seed, grammar } = checkSampling(request);
  const signal = signalOf({ signal: request.signal }, 'generate');
  const maxTokens = positiveInt(request.maxTokens, 'request.maxTokens', env.defaultMaxTokens);
  const req = {
    request,
    n: positiveInt(request.n, 'request.n', 1),
    /** What every choice's gen gets (a chat's stops and grammar are added when it is prepared). */
    gen: {
      maxTokens,
      stops: checkStops(request.stop),
      grammar,
      lazy: null,
      logprobs: checkLogprobs(request.logprobs, 'request.logprobs'),
    },
    params,
    seedBase: seed === undefined || seed === -1 ? Math.floor(Math.random() * SEED_SPACE) : seed,
    chatOptions: checkChat(request),
    /** Whether client text that spells special tokens is parsed as them (the Scheduler's option). */
    parseSpecial: env.parseSpecial,
    /** The ChatTurn, once prepared. */
    chat: null,
    /** Converted off the main thread from now on; awaited when the request is prepared. */
    grammarPending: request.jsonSchema !== undefined ? env.jsonSchemaToGrammar(request.jsonSchema) : null,
    generation: new Generation(),
    /** @type {Choice[]} */
    choices: [],
  };
  if (req.grammarPending) req.grammarPending.catch(() => {}); // reported when prepared
  // Draft counts show only when the request speculated (log-probabilities never do).
  const shown = (/** @type {any} */ usage) => {
    const { draftTokens, acceptedDraftTokens, ...rest } = usage;
    return env.spec && req.gen.logprobs === undefined ? { ...rest, draftTokens, acceptedDraftTokens } : rest;
  };
  const { choices, n } = req;
  const { push, finish, fail } = req.generation.sink;
  // A prompt with images is never drafted from (its image positions have no token ids).
  const program = new Program(hasImages(request) ? { ...env, spec: null } : env, {
    id: env.events.nextId('request'),
    signal,
    prepare: (ctx, systemPrompts) => prepare(req, ctx, systemPrompts),
    hinted: Boolean(request.cacheKey),
    countsAsRunning: true,
    failsWhole: true,
    endsOpen: 'abort',
    begin: (p, prompt) => begin(req, p, prompt),
    sink: {
      // A request aborted before it started resolves with n choices ended 'abort'.
      finish: (_outcome, usage) => {
        if (choices.length === 0) for (let i = 0; i < n; i++) choices.push(Choice.unstarted(i, push));
        finish({ choices: choices.map((c) => c.result), usage: shown(usage) });
      },
      fail,
    },
    doneUsage: (usage) => (usage.completionTokens > 0 ? shown(usage) : null),
  });
  return { program, generation: req.generation };
}

/**
 * Tokenizes the prompt (messages: the chat template, on the context's worker), finds where it is
 * cut into cache entries, resolves the grammar and checks that the request fits the context.
 * Resolves with its budget (./program.js).
 * @returns {Promise<import('./program').Budget>}
 */
async function prepare(req, ctx, systemPrompts) {
  const { request, gen, n } = req;
  const { prompt, tokens: given, messages } = request;
  let tokens;
  let media = null; // a prompt with images (./media.js): its images keyed in `tokens`
  const cachePoints = [];
  const images = hasImages(request) && messages !== undefined ? markImages(messages) : null;
  if (messages !== undefined) {
    // Client text that spells control tokens is marked to stay plain text (./plain-text.js).
    const rendered = req.parseSpecial ? messages : markMessages(ctx, messages);
    const chat = (req.chat = await formatTurn(ctx, images ? images.messages : rendered, req.chatOptions));
    if (images) ({ media, tokens } = await mediaPromptOf(ctx, images.parts(chat.formatted.prompt)));
    else tokens = chat.tokens;
    if (images && rendered !== messages) throw imagesWithSpecialText('create the Scheduler with parseSpecial: true');
    gen.stops.push(...chat.formatted.stopTokens.filter((s) => s !== ''));
    if (chat.grammar) {
      if (gen.grammar || req.grammarPending) throw invalid('give tools or a grammar / jsonSchema, not both');
      gen.grammar = chat.grammar;
      gen.lazy = chat.lazy;
    }
    const lead = images ? null : await systemPrompts.prefixOf(rendered);
    if (lead && lead.length < tokens.length && lead.every((t, i) => t === tokens[i])) cachePoints.push(lead.length);
  } else if (hasImages(request)) {
    ({ media, tokens } = await mediaPromptOf(ctx, prompt));
    const texts = Array.isArray(prompt) ? prompt.map((p) => (typeof p === 'string' ? p : p && p.text)) : [];
    if (!req.parseSpecial && texts.some((t) => typeof t === 'string' && spellsSpecial(ctx, t)))
      throw imagesWithSpecialText('create the Scheduler with parseSpecial: true');
  } else {
    // A raw prompt is all client text: special tokens parsed only when the Scheduler says so.
    tokens = given !== undefined ? given.slice() : ctx.tokenizeSync(prompt, true, req.parseSpecial === true);
  }
  if (tokens.length === 0) throw invalid('the prompt tokenized to nothing; give a non-empty prompt');
  cachePoints.push(tokens.length);
  if (req.grammarPending) gen.grammar = await req.grammarPending;
  const cells = tokens.length + n * gen.maxTokens;
  if (cells > ctx.nCtx) {
    throw invalid(
      `the request needs up to ${cells} KV cells (prompt ${tokens.length} + n ${n} × maxTokens ${gen.maxTokens}) but the context has nCtx ${ctx.nCtx}; lower maxTokens or n, or create the context with a larger nCtx`,
    );
  }
  const leases = n + cachePoints.length;
  if (leases > ctx.nSeqMax) {
    throw invalid(
      `the request needs ${leases} sequence leases (n ${n} + ${cachePoints.length} prompt branches) but the context has nSeqMax ${ctx.nSeqMax}; lower n or create the context with a larger nSeqMax`,
    );
  }
  return {
    prompt: { tokens, cachePoints, text: promptText(req, images, tokens.length), ...(media ? { media } : {}) },
    cells: n * gen.maxTokens,
    leases: n,
    planned: true,
    admit: {
      kind: req.chat ? 'chat' : 'completion',
      n,
      maxTokens: gen.maxTokens,
      promptTokens: tokens.length,
      ...(media ? { images: imagesOfPrompt(media.prompt, images ? images.images : prompt) } : {}),
    },
  };
}

/**
 * The prompt's text as events show it: the rendered chat (with images, each as `<__media__>`, not
 * the request's random marker), a prompt string, or its token count.
 */
function promptText(req, images, nTokens) {
  const { prompt } = req.request;
  if (req.chat) return images ? images.shown(req.chat.formatted.prompt) : req.chat.formatted.prompt;
  return typeof prompt === 'string' ? prompt : `(${nTokens} prompt tokens)`;
}

/** Admitted: its n choices forked from the prompt line, each with its gen. */
function begin(req, program, promptLine) {
  const { chat } = req;
  program.spawn(promptLine, req.n).forEach((line, index) => {
    const params = { ...req.params, seed: (req.seedBase + index) % SEED_SPACE };
    const choice = new Choice(index, req.generation.sink.push, chat && chat.parse ? new ChatStream(chat) : null);
    const job = new GenJob({ ...req.gen, params, choice });
    job.done.promise.catch(() => {}); // a failure is the request's, reported by settle
    req.choices.push(choice);
    line.start(job);
  });
}

module.exports = { requestProgram };
