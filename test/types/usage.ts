// Compile-only usage of the public typings (checked by `tsc -p test/types/tsconfig.json`, part of
// `npm test`). Nothing here runs. Lines marked `@ts-expect-error` must fail to type-check.

import {
  createContext,
  Branch,
  BranchStore,
  withLogits,
  jsonSchemaToGrammar,
  setLogLevel,
  systemInfo,
  listDevices,
  serveRpc,
  loadBinary,
  PoolingType,
  SessionContext,
  ReasoningFormat,
  GrammarTriggerType,
  Scheduler,
  ProgramLine,
  createServer,
  MediaPrompt,
} from '../../index';
import type {
  ContextOptions,
  SamplingParams,
  Produced,
  KvPressure,
  LlamaBranchError,
  OperationOptions,
  ErrorCode,
  BranchToken,
  ChatMessage,
  FormattedChatResult,
  ParseChatOutputResult,
  KvFileContents,
  GpuVariant,
  LoadOptions,
  NativeBinding,
  SchedulerOptions,
  SchedulerStepInfo,
  GenerateRequest,
  Generation,
  GenerationEvent,
  GenerationResult,
  GenerationChoice,
  GeneratedToolCall,
  ChatDelta,
  ChatReply,
  GenerationUsage,
  FinishReason,
  SchedulerStats,
  RunOptions,
  ProgramGenOptions,
  ProgramGenResult,
  ServerOptions,
  LlamaBranchServer,
  PromptPart,
  PromptPiece,
  ImageStats,
} from '../../index';
import llama = require('../../index');

const params: SamplingParams = {
  temperature: 0.7,
  topK: 50,
  topP: 0.9,
  minP: 0.05,
  seed: 42,
  penalties: { repeat: 1.1, frequency: 0.1, presence: 0.1, lastN: -1 },
  advanced: {
    typicalP: 0.95,
    mirostat: { mode: 2, tau: 5, eta: 0.1 },
    dry: { multiplier: 0.8, base: 1.75, allowedLength: 2, penaltyLastN: -1, sequenceBreakers: ['\n'] },
    xtc: { probability: 0.5, threshold: 0.1 },
    topNSigma: 1.5,
  },
  logitBias: [{ token: 1, bias: -Infinity }],
};

async function main(): Promise<void> {
  setLogLevel('warn');
  const info: string = systemInfo();
  const variant: GpuVariant = 'vulkan';
  const binding: NativeBinding = loadBinary(variant);
  const sameInfo: string = binding.systemInfo();
  const cpu: NativeBinding = loadBinary();
  const viaBinding: SessionContext = await cpu.createContext({ modelPath: 'm.gguf', nCtx: 2048 });
  const loadOptions: LoadOptions = { gpuVariant: 'cuda' };
  const onGpu: SessionContext = await createContext({ modelPath: 'm.gguf' }, loadOptions);
  const onCpu: SessionContext = await createContext({ modelPath: 'm.gguf' }, { gpuVariant: 'default' });
  // @ts-expect-error: not a variant
  loadBinary('rocm');
  // @ts-expect-error: not a variant
  await createContext({ modelPath: 'm.gguf' }, { gpuVariant: 'metal' });
  void [sameInfo, cpu, viaBinding, onGpu, onCpu];
  const options: ContextOptions = {
    modelPath: new URL('file:///models/model.gguf'),
    nCtx: 2048,
    nBatch: 512,
    nThreads: 4,
    nSeqMax: 8,
    embeddings: false,
    poolingType: PoolingType.NONE,
    useMmap: true,
    logLevel: 'error',
    nGpuLayers: 10,
    mainGpu: 0,
    splitMode: 'layer',
    tensorSplit: [1, 3],
    devices: ['Vulkan0'],
    rpcServers: ['127.0.0.1:50052'],
    typeK: 'q8_0',
    typeV: 'q4_0',
    flashAttention: 'auto',
    gpu: 'cpu',
  };
  // @ts-expect-error splitMode is one of three names
  const badSplit: ContextOptions = { modelPath: 'm.gguf', splitMode: 'diagonal' };
  // @ts-expect-error typeK is one of three KV types
  const badKv: ContextOptions = { modelPath: 'm.gguf', typeK: 'q5_1' };
  // @ts-expect-error flashAttention takes names, not booleans
  const badFlash: ContextOptions = { modelPath: 'm.gguf', flashAttention: true };
  void [badSplit, badKv, badFlash];
  for (const d of listDevices({ rpcServers: ['127.0.0.1:50052'] })) {
    const kind: 'cpu' | 'gpu' | 'rpc' = d.type;
    const bytes: number = d.memoryFree + d.memoryTotal;
    void [kind, bytes, d.name, d.description];
  }
  const served: { endpoint: string; devices: string[] } = serveRpc({ port: 50052, host: '127.0.0.1', threads: 2, cacheDir: '/tmp/c', allowRemote: false });
  void served;
  const ctx: SessionContext = await createContext(options);
  const offloaded: number = ctx.offload.layers + ctx.offload.totalLayers;
  const lost: boolean = ctx.lost;
  void [offloaded, lost, ctx.offload.devices];
  const kvTypes: ['f16' | 'q8_0' | 'q4_0', 'f16' | 'q8_0' | 'q4_0', 'auto' | 'on' | 'off'] = [ctx.typeK, ctx.typeV, ctx.flashAttention];
  void kvTypes;
  const lostCode: ErrorCode = 'ERR_CONTEXT_LOST';
  void lostCode;
  const same: SessionContext = await llama.createContext({ modelPath: '/models/model.gguf' });
  same.dispose();

  // Context properties and tokenizer.
  const sizes: number[] = [ctx.vocabSize, ctx.memorySize, ctx.nCtx, ctx.nBatch, ctx.nSeqMax];
  const described: string = ctx.modelDescription;
  const isDisposed: boolean = ctx.disposed;
  const prompt: number[] = await ctx.tokenize('The capital of France is');
  const noBos: number[] = ctx.tokenizeSync('Paris', false);
  const text: string = await ctx.detokenize(prompt);
  const piece: string = ctx.tokenToText(prompt[0]);
  const stop: boolean = ctx.isStopToken(ctx.getEogToken());
  const bos: number | null = ctx.getBosToken();

  // Raw decode on sequence 0, then adopt it as a root branch (first overload).
  await ctx.decode(prompt, 0, 0);
  const logits: Float32Array = ctx.getLogits();
  const argmax: number = ctx.greedySample();
  const h: number = ctx.modelEntropy('bits') + ctx.modelEntropy(undefined, logits);
  const s: number = ctx.modelSurprisal(argmax, 'nats', logits);
  const top = withLogits(ctx, (l) => l.indexOf(Math.max(...l)));
  const topNumber: number = top;
  const posMax: number = ctx.kvSeqPosMax(0) + ctx.kvCacheSize() + ctx.kvCacheSize(1);
  const root = Branch.create(ctx, 0, prompt.length, params);
  root.captureLogits();

  // Second overload: the store picks the sequence; prefill the prompt.
  const other = Branch.create(ctx, 0, { temperature: 0 }, 64, 'root ::= "a"');
  await other.prefill(prompt);
  const plain = Branch.create(ctx, 0);
  await plain.pruneSubtree();

  // Branch API.
  const child: Branch = root.fork();
  const pinned: Branch = root.fork(3);
  const snapshot: Float32Array = child.getLogits();
  const e: number = child.entropy('bits') + child.entropy();
  const t: number = child.sample();
  child.accept(t);
  const p: Produced = child.produce();
  if (!p.isStop) await child.commit(p.token);
  await child.decodeAndCaptureOne(p.token);
  child.steer([{ token: t, bias: -Infinity }]);
  child.clearSteer();
  child.reseedSampler(7);
  child.setSamplerParams({ temperature: 0 });
  child.setGrammar('root ::= [0-9]+', { triggerWords: ['answer:'], triggerPatterns: ['x(.*)'], triggerTokens: [5] });
  child.setGrammar(null);
  const meta: [number, boolean, number, number, number, number, number, number | null, number[], boolean, boolean] = [
    child.handle,
    child.disposed,
    child.seqId,
    child.position,
    child.forkHead,
    child.perplexity,
    child.samplingPerplexity,
    child.parent,
    child.children,
    child.isLeaf,
    child.isActive,
  ];
  for await (const { token, text: piece2 } of child) {
    const tok: number = token;
    const str: string = piece2;
    if (tok === 0 || str === '') break;
  }
  const step: BranchToken | undefined = (await child[Symbol.asyncIterator]().next()).value || undefined;
  // A Branch is an AsyncIterable<BranchToken>: it works with any generic async-iteration helper.
  const iterable: AsyncIterable<BranchToken> = child;
  const collect = async <T>(source: AsyncIterable<T>, max: number): Promise<T[]> => {
    const items: T[] = [];
    for await (const item of source) if (items.push(item) >= max) break;
    return items;
  };
  const collected: BranchToken[] = await collect(iterable, 4);
  const iterator: AsyncIterableIterator<BranchToken> = child[Symbol.asyncIterator]();
  const next: IteratorResult<BranchToken> = await iterator.next();
  if (!next.done) {
    const tokenId: number = next.value.token;
    // @ts-expect-error: yielded items carry token and text only
    void next.value.logits;
    void tokenId;
  }

  // Batched store API.
  const store = new BranchStore(ctx);
  const forks = [root.fork(), root.fork()];
  await store.prefill([[forks[0], [1, 2, 3]], [forks[1], [4]]]);
  const produced: Produced[] = store.produce(forks);
  await store.commit(forks.map((b, i) => [b, produced[i].token]));
  await store.commit([[forks[0], 1]] as const);
  // Cancellation: every long operation takes { signal }.
  const controller = new AbortController();
  const opOptions: OperationOptions = { signal: controller.signal };
  await store.prefill([[forks[0], [5]]], opOptions);
  await store.commit([[forks[0], 1]], { signal: controller.signal });
  await forks[0].prefill([6], opOptions);
  await forks[0].commit(1, {});
  await forks[0].decodeAndCaptureOne(1, opOptions);
  await ctx.decode([1], 0, 1, opOptions);
  await ctx.decode([1], 0, { signal: AbortSignal.timeout(1000) });
  controller.abort(new Error('done'));
  try {
    await forks[0].prefill([7], opOptions);
  } catch (e) {
    if ((e as LlamaBranchError).code === 'ERR_ABORTED') console.log((e as Error).name, (e as Error).cause);
  }
  const free: number = store.available;
  const kv: KvPressure = store.kvPressure();
  const used: number = kv.cellsUsed + kv.remaining - kv.nCtx;
  await store.retainOnly(forks[0]);

  // Freeing.
  const seq: number | undefined = pinned.destroy();
  if (seq !== undefined) await ctx.kvCacheRemove(seq, -1, -1);
  ctx.kvSeqCopy(0, 1);
  await other.prune();
  await ctx.kvCacheClear();

  // Grammars from JSON schemas.
  const g1: string = await jsonSchemaToGrammar({ type: 'object' });
  const g2: string = await jsonSchemaToGrammar('{"type":"string"}');

  // Context-level sampling, grammar handles and perplexity trackers.
  const sampled: number = ctx.sample() + ctx.sample({ temperature: 0 }) + ctx.sample(null);
  const gh: number = ctx.createSampler(g1);
  const masked: Float32Array = ctx.getLogits();
  ctx.applySampler(gh, masked);
  ctx.acceptSamplerToken(gh, sampled);
  ctx.freeSamplerHandle(ctx.cloneSampler(gh));
  ctx.freeSamplerHandle(gh);
  const tracker: number = ctx.createPerplexityTracker();
  ctx.addSurprisal(tracker, ctx.modelSurprisal(sampled));
  const ppl: number = ctx.getPerplexity(tracker) + ctx.getPerplexityCount(tracker);
  ctx.resetPerplexityTracker(tracker);
  ctx.freePerplexityTracker(ctx.clonePerplexityTracker(tracker));
  ctx.freePerplexityTracker(tracker);

  // Embeddings.
  const embedder = await createContext({ modelPath: '/models/model.gguf', embeddings: true, poolingType: PoolingType.MEAN });
  await embedder.encode(await embedder.tokenize('The cat sat on the mat'));
  const vector: Float32Array = embedder.getEmbeddings();
  const rawVector: Float32Array = embedder.getEmbeddings(false);
  const dims: number = embedder.getEmbeddingDimension();
  const pooled: boolean = embedder.hasPooling();
  embedder.dispose();

  // Errors: narrow on the stable code.
  try {
    await forks[0].commit(1);
  } catch (err) {
    const code: ErrorCode = (err as LlamaBranchError).code;
    if ((err as LlamaBranchError).code === 'ERR_KV_FULL') {
      await forks[0].prune();
    } else if (code === 'ERR_CONTEXT_BUSY' || code === 'ERR_NATIVE_LOAD') {
      throw err;
    }
    // @ts-expect-error: not an error code this package produces
    if ((err as LlamaBranchError).code === 'ERR_KV_FUL') throw err;
  }
  // A type guard a caller would write; LlamaBranchError is an Error with a narrowed `code`.
  const isLlamaBranchError = (x: unknown): x is LlamaBranchError =>
    x instanceof Error && typeof (x as { code?: unknown }).code === 'string';
  try {
    Branch.create(ctx, 0);
  } catch (err) {
    if (isLlamaBranchError(err)) {
      const asError: Error = err;
      const codes: ErrorCode[] = ['ERR_NO_FREE_SEQUENCE', 'ERR_CONTEXT_BUSY', 'ERR_CONTEXT_DISPOSED'];
      if (codes.includes(err.code)) void asError.message;
      // @ts-expect-error: code is an ErrorCode, not any string
      const wrong: 'ERR_NOPE' = err.code;
      void wrong;
    }
  }

  // Wrong usage must not compile.
  // @ts-expect-error: a token is a number, not a string
  await forks[0].commit('hello');
  // @ts-expect-error: store entries are [Branch, number] pairs
  await store.commit([[forks[0], 'hello']]);
  // @ts-expect-error: unknown context option
  await createContext({ modelPath: 'm.gguf', contextSize: 4096 });
  // @ts-expect-error: modelPath is required
  await createContext({ nCtx: 512 });
  // @ts-expect-error: not a log level
  setLogLevel('verbose');
  // @ts-expect-error: unknown sampling option
  Branch.create(ctx, 0, { temprature: 0.5 });
  // @ts-expect-error: mirostat mode is 0, 1 or 2
  Branch.create(ctx, 0, { advanced: { mirostat: { mode: 3 } } });
  // @ts-expect-error: entropy base is 'nats' or 'bits'
  root.entropy('decibans');
  // @ts-expect-error: SessionContext has no public constructor
  new SessionContext();
  // @ts-expect-error: Branch has no public constructor
  new Branch();
  // @ts-expect-error: private plumbing is not part of the typings
  ctx._branchCreate(0);
  // @ts-expect-error: getters are read-only
  root.position = 3;
  // @ts-expect-error: prefill takes token ids
  await root.prefill('some text');
  // @ts-expect-error: sample takes a params object, not a temperature
  ctx.sample(0.5);
  // @ts-expect-error: applySampler needs a Float32Array
  ctx.applySampler(1, [0.5, 0.5]);
  // @ts-expect-error: encode takes token ids
  await ctx.encode('text');

  await chatUsage(ctx);

  void [info, sizes, described, isDisposed, noBos, text, piece, stop, bos, h, s, topNumber, posMax];
  void [snapshot, e, meta, step, free, used, seq, g1, g2, collected];
  void [ppl, vector, rawVector, dims, pooled];
}

/** Cold first turn, warm later turns, tool-call parsing. */
async function chatUsage(ctx: SessionContext): Promise<void> {
  const history: ChatMessage[] = [{ role: 'user', content: 'Hi, my name is Lloyal.' }];
  const cold: FormattedChatResult = await ctx.formatChat(history);
  const root = Branch.create(ctx, 0, { temperature: 0 });
  await root.prefill(await ctx.tokenize(cold.prompt));
  const turn = await ctx.formatChat([{ role: 'system', content: '' }, { role: 'user', content: 'And yours?' }]);
  await root.prefill([...ctx.getTurnSeparator(), ...(await ctx.tokenize(turn.prompt, false))]);
  const parsed: ParseChatOutputResult = ctx.parseChatOutput('Hello', cold.format, cold);
  const firstCall: string | undefined = parsed.toolCalls[0]?.arguments;
  const withTools = await ctx.formatChat(JSON.stringify(history), {
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }],
    toolChoice: 'auto',
    reasoningFormat: 'deepseek_legacy',
  });
  if (withTools.grammarLazy) {
    root.setGrammar(withTools.grammar, {
      triggerWords: withTools.grammarTriggers.filter((t) => t.type === GrammarTriggerType.WORD).map((t) => t.value),
    });
  }
  ctx.parseChatOutput('x', withTools.format, { reasoningFormat: ReasoningFormat.DEEPSEEK, isPartial: true });
  const legacy = await ctx.formatChat('[]', '{{ messages }}');
  const valid: boolean = await ctx.validateChatTemplate('{{ messages }}');
  // @ts-expect-error: toolChoice is 'auto', 'none' or 'required'
  await ctx.formatChat(history, { toolChoice: 'sometimes' });
  // @ts-expect-error: the chat format is a number from formatChat
  ctx.parseChatOutput('x', 'gemma');
  void [firstCall, legacy, valid];
}

void main;

// Raw decoding, the logits view, KV sequence operations and per-sequence state.
async function rawKvUsage(ctx: SessionContext): Promise<void> {
  const prompt: number[] = await ctx.tokenize('Hello');
  await ctx.decode(prompt, 0, 0);
  const view: Float32Array = ctx.getLogits();
  view[0] = -Infinity;
  const best: number = ctx.greedySample();
  const dest = new Float32Array(ctx.vocabSize);
  await ctx.decodeAndCapture([best], prompt.length, 0, dest);
  await ctx.decodeAndCapture([best], prompt.length + 1, 0, new ArrayBuffer(ctx.vocabSize * 4));
  ctx.kvSeqCopy(0, 1);
  ctx.kvSeqCopy(0, 2, 0, 2);
  ctx.kvSeqKeep(0);
  const state: Buffer = await ctx.kvCacheSave(0);
  const fromDefault: Buffer = await ctx.kvCacheSave();
  await ctx.kvCacheLoad(1, state);
  await ctx.kvCacheLoad(1, new Uint8Array(fromDefault));
  const written: number = await ctx.kvCacheWriteFile(0, '/tmp/seq0.bin', prompt);
  const read: KvFileContents = await ctx.kvCacheReadFile(1, '/tmp/seq0.bin');
  const restored: number[] = read.tokens;
  const bytes: number = read.bytesRead;
  await ctx.clearAndReseed(prompt.slice(0, 1), prompt.slice(1));
  // @ts-expect-error: decodeAndCapture needs a destination buffer
  await ctx.decodeAndCapture(prompt, 0, 0);
  // @ts-expect-error: dest must be a Float32Array or ArrayBuffer
  await ctx.decodeAndCapture(prompt, 0, 0, [0]);
  // @ts-expect-error: kvCacheLoad takes the Buffer from kvCacheSave
  await ctx.kvCacheLoad(0, 'state');
  void [written, restored, bytes];
}

void rawKvUsage;

// Serving: the Scheduler (continuous batching, prefix cache) and the OpenAI-compatible server.
async function servingUsage(ctx: SessionContext): Promise<void> {
  const options: SchedulerOptions = {
    prefillChunk: 128,
    maxQueue: 8,
    maxRunning: 4,
    defaultMaxTokens: 64,
    onStep: (info: SchedulerStepInfo) => void [info.rows, info.prefillTokens, info.prefillMs, info.decodeMs, info.stepMs, info.cellsUsed, info.running, info.queued, info.deferred],
  };
  const scheduler = new Scheduler(ctx, options);
  const controller = new AbortController();
  const request: GenerateRequest = {
    messages: [{ role: 'system', content: 'Be brief.' }, { role: 'user', content: 'Hi' }],
    params: { temperature: 0.7, topP: 0.9 },
    n: 2,
    maxTokens: 32,
    stop: ['\n\n'],
    jsonSchema: { type: 'object' },
    seed: 1,
    signal: controller.signal,
  };
  // Decisions in both shapes: System One's record by name, OpenAI's list in question order.
  const systemOne = await scheduler.decide({ state: 'x', questions: { b: { type: 'noul', instructions: 'Yes?' } } });
  const noul: number = systemOne.answers.b.type === 'noul' ? systemOne.answers.b.noul : 0;
  const openAI = await scheduler.decide({
    input: [
      { role: 'user', content: 'x' },
      { type: 'function_call', call_id: 'c', name: 'f', arguments: '{}' },
      { type: 'function_call_output', call_id: 'c', output: 'y' },
    ],
    questions: [{ type: 'choice', name: 'n', instructions: 'Which?', choices: [{ value: 'a' }, { value: true }] }],
  });
  const first = openAI.answers[0];
  const chosen: string | boolean | null = first.type === 'choice' ? first.choice : null;
  void [noul, chosen, openAI.usage.cachedTokens];
  // @ts-expect-error a choice's values are strings or booleans
  void scheduler.decide({ input: 'x', questions: [{ type: 'choice', instructions: 'q', choices: [{ value: 1 }] }] });
  const generation: Generation = scheduler.generate(request);
  for await (const event of generation) {
    const e: GenerationEvent = event;
    const token: number | null = e.token;
    const reason: FinishReason | undefined = e.finishReason;
    void [e.choice, e.text, token, reason];
  }
  const result: GenerationResult = await generation;
  const choice: GenerationChoice = result.choices[0];
  const usage: GenerationUsage = result.usage;
  const numbers: number[] = [choice.perplexity, ...choice.tokens, usage.promptTokens, usage.cachedPromptTokens, usage.completionTokens];
  const finish: 'stop' | 'length' | 'abort' | 'tool_calls' = choice.finishReason;
  const tooled = await scheduler.generate({
    messages: [{ role: 'user', content: 'Weather?' }],
    tools: [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }],
    toolChoice: { type: 'function', function: { name: 'get_weather' } },
    parallelToolCalls: false,
    reasoningFormat: 'auto',
    enableThinking: false,
  });
  const calls: GeneratedToolCall[] = tooled.choices[0].toolCalls ?? [];
  const replyParts: [string | undefined, string | undefined, string, string, string] = [tooled.choices[0].content, tooled.choices[0].reasoningContent, calls[0].id, calls[0].name, calls[0].arguments];
  for await (const e of scheduler.generate({ messages: [{ role: 'user', content: 'x' }], toolChoice: 'auto' })) {
    const delta: ChatDelta | null | undefined = e.delta;
    const reply: ChatReply | undefined = e.message;
    void [delta?.toolCalls?.[0].index, reply?.toolCalls];
  }
  await scheduler.generate({ prompt: 'Once', grammar: 'root ::= "a"' });
  await scheduler.generate({ tokens: [1, 2, 3], stop: 'x' }).catch((e) => (e as LlamaBranchError).code === 'ERR_QUEUE_FULL');
  const stats: SchedulerStats = scheduler.stats();
  const gauges: number[] = [stats.running, stats.queued, stats.cachedPrefixes, stats.cellsUsed, stats.nCtx, stats.hitRate, stats.steps, stats.promptTokens, stats.cachedPromptTokens, stats.prefilledTokens, stats.generatedTokens, stats.evictions, stats.completed];
  const programs: number = stats.programs;

  // Branch programs: run() resolves with what the program returns.
  const runOptions: RunOptions = { maxBranches: 3, maxCells: 512, seed: 1, signal: new AbortController().signal };
  const best: string = await scheduler.run(async (s: ProgramLine) => {
    s.append('Q: 2 + 2?\nA:').append([1, 2]);
    const genOptions: ProgramGenOptions = { maxTokens: 8, stop: ['\n'], params: { temperature: 0.7 }, seed: 3 };
    const forks: ProgramLine[] = s.fork(2);
    const outs: ProgramGenResult[] = await Promise.all(forks.map((f) => f.gen(genOptions)));
    const reason: 'stop' | 'length' = outs[0].finishReason;
    forks[1].release();
    const facts: [string, number[], boolean] = [s.text, s.tokens, forks[1].released];
    await s.gen({ jsonSchema: { type: 'object' } });
    return outs[0].text + reason + facts.length;
  }, runOptions);
  const counted: number = await scheduler.run((s) => s.tokens.length);
  // @ts-expect-error: maxBranches is a number
  scheduler.run(async () => 1, { maxBranches: 'many' });
  const programCodes: ErrorCode[] = ['ERR_TOO_MANY_BRANCHES', 'ERR_PROGRAM_STATE'];
  await scheduler.close();
  const closedCode: ErrorCode = 'ERR_SCHEDULER_CLOSED';
  // @ts-expect-error: finishReason is one of three strings
  const wrong: FinishReason = 'eos';
  // @ts-expect-error: n is a number
  scheduler.generate({ prompt: 'x', n: '2' });

  const serverOptions: ServerOptions = { ctx, modelName: 'gemma', parallel: 2, maxBodyBytes: 1 << 16, scheduler: { prefillChunk: 64 } };
  const server: LlamaBranchServer = await createServer(serverOptions);
  const loaded = await llama.createServer({ modelPath: '/models/model.gguf', nCtx: 4096, nSeqMax: 32, nThreads: 2 });
  const address: { host: string; port: number; url: string } = await server.listen(0, '127.0.0.1');
  const parts: [SessionContext, Scheduler, string, number] = [server.ctx, server.scheduler, server.modelName, address.port];
  server.http.close();
  await server.close();
  await loaded.close();
  void [numbers, finish, gauges, closedCode, wrong, parts];
}

void servingUsage;

// Images: a projector beside the model, prompts of text and images, a branch prefilled with one.
async function imageUsage(): Promise<void> {
  const ctx = await createContext({ modelPath: '/models/gemma-3-4b.gguf', mmprojPath: '/models/mmproj.gguf', imageMaxPixels: 1 << 22 });
  const parts: PromptPart[] = ['Look: ', new Uint8Array(8), { imagePath: 'page.png' }, { text: 'What is it?' }];
  const prompt: MediaPrompt = await ctx.tokenizeParts(parts, true);
  const pieces: PromptPiece[] = prompt.pieces;
  const positions: number = prompt.nPos + prompt.nImages + (pieces[0].tokens?.length ?? 0);
  const branch = Branch.create(ctx, 0, { temperature: 0 });
  await branch.prefill(prompt);
  await branch.prefill([1, 2, 3]);
  const stats: ImageStats = ctx.imageStats();
  const has: boolean = ctx.hasProjector;
  const code: ErrorCode = 'ERR_IMAGE_POSITIONS';
  // @ts-expect-error: a URL is not a prompt part
  await ctx.tokenizeParts([new URL('https://example.com/a.png')]);
  // Scheduler requests with images: a MediaPrompt, parts, or messages with image parts.
  const scheduler = new Scheduler(ctx);
  const fromPrompt: GenerationResult = await scheduler.generate({ prompt, n: 3 });
  await scheduler.generate({ prompt: parts, maxTokens: 8 });
  await scheduler.generate({
    messages: [{ role: 'user', content: [{ type: 'text', text: 'What is it?' }, { type: 'image', image: new Uint8Array(8) }] }],
  });
  const served = await createServer({ modelPath: '/models/gemma-3-4b.gguf', mmprojPath: '/models/mmproj.gguf' });
  void [positions, stats.encodes + stats.encodeMs + stats.images, has, code, MediaPrompt, fromPrompt.usage.promptTokens, served];
}

void imageUsage;
