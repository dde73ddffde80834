'use strict';

/**
 * POST /v1/embeddings over a context created with `embeddings: true` (the server's `--embeddings`
 * makes one beside the chat context: a chat context keeps logits, not pooled vectors). A
 * request's inputs are embedded together (`ctx.embedBatch`: as many per decode as the context
 * has sequences); without pooling, one after another, an encode and the read of its vector one
 * critical section. Requests take turns, so none reads another's vectors.
 */

const { HttpError, badRequest } = require('./http');
const { checkModel } = require('./openai');
const defaults = require('../defaults');

/** The request's inputs as token arrays (strings tokenized with BOS). */
function inputsOf(body, ctx) {
  let { input } = body;
  const isTokens = (v) => Array.isArray(v) && v.length > 0 && v.every((t) => Number.isInteger(t));
  if (typeof input === 'string' || isTokens(input)) input = [input];
  if (!Array.isArray(input) || input.length === 0)
    throw badRequest('input must be a string, an array of strings, or token arrays', 'input');
  if (input.length > defaults.server.maxEmbeddingInputs)
    throw badRequest(
      `input has ${input.length} items; at most ${defaults.server.maxEmbeddingInputs} per request`,
      'input',
    );
  return input.map((item, i) => {
    let tokens;
    if (typeof item === 'string' && item !== '') tokens = ctx.tokenizeSync(item, true);
    else if (isTokens(item) && item.every((t) => t >= 0 && t < ctx.vocabSize)) tokens = item;
    else
      throw badRequest(
        `input[${i}] must be a non-empty string or an array of token ids in [0, ${ctx.vocabSize})`,
        'input',
      );
    if (tokens.length > ctx.nBatch)
      throw badRequest(`input[${i}] is ${tokens.length} tokens; this server embeds at most ${ctx.nBatch}`, 'input');
    return tokens;
  });
}

/** Float32 vector → base64 of its little-endian bytes (OpenAI's `encoding_format: 'base64'`). */
function base64Of(vector) {
  const bytes = Buffer.alloc(vector.length * 4);
  vector.forEach((v, i) => bytes.writeFloatLE(v, i * 4));
  return bytes.toString('base64');
}

class Embedder {
  /** @param {import('../Context').SessionContext | null} ctx a context with `embeddings: true` */
  constructor(ctx) {
    this.ctx = ctx;
    /** @type {Promise<unknown>} the last embedding's turn: the next one waits for it */
    this.queue = Promise.resolve();
  }

  /** The vectors of `inputs` (token arrays), in one turn: batched when the context pools. */
  embedAll(inputs) {
    const ctx = this.ctx;
    const run = this.queue.then(async () => {
      if (ctx.hasPooling()) return ctx.embedBatch(inputs, true);
      const vectors = [];
      for (const tokens of inputs) {
        await ctx.encode(tokens);
        vectors.push(ctx.getEmbeddings(true));
      }
      return vectors;
    });
    this.queue = run.catch(() => {});
    return run;
  }

  /** The response body of a POST /v1/embeddings `body`. */
  async respond(body, modelName) {
    if (!this.ctx)
      throw new HttpError(404, 'this server has no embeddings context; start it with --embeddings', {
        code: 'embeddings_disabled',
      });
    checkModel(body, modelName);
    const format = body.encoding_format === undefined || body.encoding_format === null ? 'float' : body.encoding_format;
    if (format !== 'float' && format !== 'base64')
      throw badRequest("encoding_format must be 'float' or 'base64'", 'encoding_format');
    if (
      body.dimensions !== undefined &&
      body.dimensions !== null &&
      body.dimensions !== this.ctx.getEmbeddingDimension()
    )
      throw badRequest(
        `dimensions must be ${this.ctx.getEmbeddingDimension()} (the model's width) or absent`,
        'dimensions',
      );
    const inputs = inputsOf(body, this.ctx);
    const vectors = await this.embedAll(inputs);
    const tokens = inputs.reduce((sum, input) => sum + input.length, 0);
    const data = vectors.map((vector, index) => ({
      object: 'embedding',
      index,
      embedding: format === 'base64' ? base64Of(vector) : Array.from(vector),
    }));
    return { object: 'list', data, model: modelName, usage: { prompt_tokens: tokens, total_tokens: tokens } };
  }
}

module.exports = { Embedder };
