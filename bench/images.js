'use strict';

/**
 * Images (issue 49): 8 questions about one image as forks of one state against 8 independent
 * prompts that each carry the image, on the default model and the random-weight test projector
 * (test/helpers/make-mmproj.py; 16 positions an image). Prints encoder runs, positions decoded and
 * time of each way and their ratios, measured in one run; then the time of one encode with the
 * test projector and what a real projector's encode would take on this machine, extrapolated
 * from the text model's measured prefill rate (the assumptions are printed).
 *
 *   node bench/images.js [--questions=8] [--threads=2] [--rounds=2]
 */

const { Branch } = require('..');
const { args, modelPath, median } = require('./common');
const { open } = require('../test/helpers');
const { projectorPath, png } = require('../test/helpers/images');

const QUESTIONS = Number(args.questions || 8);
const THREADS = Number(args.threads || 2);
const ROUNDS = Number(args.rounds || 2);
const LEAD = 'A photograph from the archive, described for a catalogue, with its caption and date. '.repeat(4);
const questionText = (i) =>
  `\nQuestion ${i + 1}: what does the picture show in its ${['top', 'left', 'middle', 'corner'][i % 4]} part?\nAnswer:`;

/** Greedy first answer token of `branch` (what a decision or a short answer reads). */
const answer = (branch) => branch.produce().token;

async function forks(ctx, image) {
  const root = Branch.create(ctx, 0, { temperature: 0 });
  const prompt = await ctx.tokenizeParts([LEAD, image]);
  const started = performance.now();
  await root.prefill(prompt);
  let positions = prompt.nPos;
  const answers = [];
  for (let i = 0; i < QUESTIONS; i++) {
    const f = root.fork();
    const q = ctx.tokenizeSync(questionText(i), false, false);
    await f.prefill(q);
    positions += q.length;
    answers.push(answer(f));
    await f.prune();
  }
  const ms = performance.now() - started;
  await root.prune();
  return { ms, positions, answers };
}

async function independent(ctx, image) {
  const started = performance.now();
  let positions = 0;
  const answers = [];
  for (let i = 0; i < QUESTIONS; i++) {
    const b = Branch.create(ctx, 0, { temperature: 0 });
    const prompt = await ctx.tokenizeParts([LEAD, image, questionText(i)]);
    await b.prefill(prompt);
    positions += prompt.nPos;
    answers.push(answer(b));
    await b.prune();
  }
  return { ms: performance.now() - started, positions, answers };
}

async function main() {
  const ctx = await open({
    modelPath: modelPath(),
    mmprojPath: projectorPath(),
    nCtx: 2048,
    nSeqMax: 2,
    nThreads: THREADS,
  });
  const rows = { forks: [], independent: [] };
  const encodes = { forks: 0, independent: 0 };
  for (let r = 0; r < ROUNDS; r++) {
    const image = png(128, 128, { seed: 100 + r });
    for (const [name, run] of [
      ['forks', forks],
      ['independent', independent],
    ]) {
      const before = ctx.imageStats().encodes;
      rows[name].push(await run(ctx, image));
      encodes[name] = ctx.imageStats().encodes - before;
    }
  }
  const f = rows.forks.at(-1);
  const ind = rows.independent.at(-1);
  const [fMs, iMs] = [median(rows.forks.map((x) => x.ms)), median(rows.independent.map((x) => x.ms))];
  console.log(
    `${QUESTIONS} questions about one ${png(128, 128).length}-byte PNG, ${THREADS} threads, median of ${ROUNDS} rounds`,
  );
  console.log(
    `  forks of one state:   encoder runs ${encodes.forks}, positions decoded ${f.positions}, ${fMs.toFixed(0)} ms`,
  );
  console.log(
    `  independent prompts:  encoder runs ${encodes.independent}, positions decoded ${ind.positions}, ${iMs.toFixed(0)} ms`,
  );
  console.log(
    `  ratios (independent / forks): encoder runs ${(encodes.independent / encodes.forks).toFixed(1)}×, positions ${(ind.positions / f.positions).toFixed(2)}×, time ${(iMs / fMs).toFixed(2)}×`,
  );
  const agree = f.answers.filter((t, i) => t === ind.answers[i]).length;
  console.log(`  greedy first answer tokens equal in ${agree}/${QUESTIONS} (batch shapes differ: not required)`);

  // One encode with the test projector, and an estimate for a real one.
  const stats = ctx.imageStats();
  const encodeMs = stats.encodeMs / stats.encodes;
  const b = Branch.create(ctx, 0, { temperature: 0 });
  const text = ctx.tokenizeSync(LEAD.repeat(4), true, false);
  const t0 = performance.now();
  await b.prefill(text);
  const prefillS = (performance.now() - t0) / 1000;
  await b.prune();
  // Gemma 3 270M: ~100 M parameters in its blocks (its other ~170 M are the token embeddings,
  // not multiplied in a prefill); adjust for LLAMA_TEST_MODEL.
  const modelParams = 100e6;
  const flopsPerS = (2 * modelParams * text.length) / prefillS; // the text model's effective rate
  // Gemma 3's mmproj: a SigLIP-So400m encoder (about 400 M parameters) over 896×896 pixels in
  // 14×14 patches (4,096 patches), pooled to 256 image tokens.
  const [realParams, patches] = [400e6, 4096];
  const realS = (2 * realParams * patches) / flopsPerS;
  console.log(
    `one encode, test projector (2 layers, 16×16 patches, 16 tokens): ${encodeMs.toFixed(1)} ms (mean of ${stats.encodes})`,
  );
  console.log(
    `text model prefill here: ${(text.length / prefillS).toFixed(0)} tokens/s ≈ ${(flopsPerS / 1e9).toFixed(1)} GFLOP/s effective (2 × ${(modelParams / 1e6).toFixed(0)} M block parameters a token)`,
  );
  console.log(
    `a real projector (assumed: Gemma 3's SigLIP, ~400 M parameters, 4,096 patches → 256 tokens) at that rate: ~${realS.toFixed(0)} s an encode on this CPU, a lower bound (its F16 weights multiply slower than the Q4_K text model's); forks after it pay it once`,
  );
  ctx.dispose();
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
