'use strict';

/**
 * `scheduler.generate()`'s front door: the request checked, then a Program (./program.js) built
 * from what it needs — ONE prompt line (cut into cache entries at its system prompt's end and at
 * its own end) forked `n` times, each fork running a gen whose sink is a `Choice` — and settling
 * the request's `Generation` (./generation.js). Its prompt is prepared (chat template,
 * tokenization, images) by ./prompt.js.
 */

const { SEED_SPACE, seedBase, positiveInt, checkInput, checkStops, checkLogprobs, checkSampling } = require('./checks');
const { checkChat, ChatStream } = require('./chat');
const { signalOf } = require('../cancel');
const { GenJob } = require('./jobs');
const { Program } = require('./program');
const { Generation } = require('./generation');
const { hasImages } = require('./media');
const { preparePrompt } = require('./prompt');

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
  const n = positiveInt(request.n, 'request.n', 1);
  const stops = checkStops(request.stop);
  const logprobs = checkLogprobs(request.logprobs, 'request.logprobs');
  /** What every choice's gen gets (a chat's stops and grammar are added when it is prepared). */
  const gen = { maxTokens, stops, grammar, lazy: null, logprobs };
  const firstSeed = seedBase(seed);
  const chatOptions = checkChat(request);
  // Converted off the main thread from now on; awaited (and any failure reported) when prepared.
  const grammarPending = request.jsonSchema !== undefined ? env.jsonSchemaToGrammar(request.jsonSchema) : null;
  if (grammarPending) grammarPending.catch(() => {});
  const req = { request, n, gen, grammarPending, chatOptions, parseSpecial: env.parseSpecial };
  // Draft counts show only when the request speculated (log-probabilities never do).
  const generation = new Generation(n, Boolean(env.spec) && logprobs === undefined);
  let chat = null; // the ChatTurn, once prepared
  // A prompt with images is never drafted from (its image positions have no token ids).
  const program = new Program(hasImages(request) ? { ...env, spec: null } : env, {
    id: env.events.nextId('request'),
    signal,
    prepare: async (ctx, systemPrompts) => {
      let budget;
      ({ budget, chat } = await preparePrompt(req, ctx, systemPrompts));
      return budget;
    },
    door: 'request',
    hinted: Boolean(request.cacheKey),
    // Admitted: its n choices forked from the prompt line, each with its gen.
    begin: (p, promptLine) =>
      // The second and later choices are extra lines, admitted within a step budget if any.
      [...p.spawn(promptLine, 1), ...p.spawn(promptLine, n - 1, promptLine.tokens, true)].forEach((line, index) => {
        const choice = generation.choice(index, chat && chat.parse ? new ChatStream(chat) : null);
        const job = new GenJob({ ...gen, params: { ...params, seed: (firstSeed + index) % SEED_SPACE }, sink: choice });
        job.done.promise.catch(() => {}); // a failure is the request's, reported as it settles
        line.start(job);
      }),
    sink: generation,
  });
  return { program, generation };
}

module.exports = { requestProgram };
