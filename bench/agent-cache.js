'use strict';

/**
 * The prefix cache's RAM and disk tiers on an agent workload (docs/serving.md, "Prefix cache
 * tiers"). Two measurements, each against the KV cells alone:
 *
 * 1. Replay: `--sessions` conversations × `--turns` turns, each turn's prompt the session's
 *    whole history after a shared ~1,500-token system prompt with tool schemas. Sessions take
 *    turns round-robin (all sessions' turn t, then turn t + 1), `--parallel` at a time, so the
 *    sessions' histories together outgrow the KV cells (`--n-ctx`). Reports prompt tokens
 *    prefilled and wall time with tiers (RAM + disk) and without.
 * 2. Restart: a child process caches a ~2,000-token prompt in a fresh folder and exits (close()
 *    writes it); a second child, on the folder, measures the first-token latency of that prompt
 *    against a cold prefill of a prompt of the same length (interleaved, `--repeats` times).
 *
 *   node bench/agent-cache.js [--sessions 20] [--turns 10] [--n-ctx 4096] [--parallel 4] [--threads N]
 *
 * Prints a Markdown table and writes bench/results/agent-cache.json.
 */

const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { execFileSync } = require('node:child_process');
const { parseArgs } = require('node:util');
const { createContext, Scheduler } = require('..');
const { systemPrompt, userMessage } = require('./agent-sessions');

const MODEL = process.env.LLAMA_TEST_MODEL || path.join(__dirname, '..', 'models', 'gemma-3-270m-q4_k_m.gguf');

const { values: args } = parseArgs({
  options: {
    sessions: { type: 'string', default: '20' },
    turns: { type: 'string', default: '10' },
    'n-ctx': { type: 'string', default: '4096' },
    parallel: { type: 'string', default: '4' },
    threads: { type: 'string' },
    repeats: { type: 'string', default: '3' },
    child: { type: 'string' },
    dir: { type: 'string' },
    only: { type: 'string' },
    reply: { type: 'string', default: '12' },
  },
});
const threads = args.threads ? Number(args.threads) : undefined;

/** Replays the workload on a scheduler with `options`; resolves its counts and wall time. */
async function replay(ctx, options, sessions, turns, parallel) {
  const scheduler = new Scheduler(ctx, { maxRunning: parallel, maxQueue: 1024, ...options });
  const system = { role: 'system', content: systemPrompt() };
  const histories = Array.from({ length: sessions }, () => [system]);
  /** @type {string[]} */
  const failures = [];
  const started = performance.now();
  for (let turn = 0; turn < turns; turn++) {
    await Promise.all(
      histories.map(async (history, session) => {
        history.push({ role: 'user', content: userMessage(session, turn) });
        try {
          const r = await scheduler.generate({
            messages: history,
            maxTokens: Number(args.reply),
            params: { temperature: 0 },
          });
          history.push({ role: 'assistant', content: r.choices[0].text });
        } catch (e) {
          // Counted and reported: a failed request must show in the results, not end the run.
          const err = /** @type {any} */ (e);
          failures.push(String(err.code || e));
          process.stderr.write(`turn ${turn + 1}, session ${session}: ${err.code}: ${err.message}\n`);
          history.push({ role: 'assistant', content: '(no reply)' });
        }
      }),
    );
    const st = scheduler.stats();
    process.stderr.write(
      `turn ${turn + 1}/${turns}: prefilled ${st.prefilledTokens}, ${Math.round(performance.now() - started)} ms\n`,
    );
  }
  const ms = performance.now() - started;
  const stats = scheduler.stats();
  await scheduler.close();
  return {
    ms: Math.round(ms),
    promptTokens: stats.promptTokens,
    prefilledTokens: stats.prefilledTokens,
    cachedPromptTokens: stats.cachedPromptTokens,
    evictions: stats.evictions,
    failures,
    tiers: stats.cacheTiers || null,
  };
}

/** A prompt of about `n` tokens, different for each `salt`. */
function longPrompt(salt, n) {
  const words = [];
  for (let i = 0; words.length < n * 0.28; i++) words.push(`word${(i * 7919 + salt * 104729) % 5003}`);
  return `Document ${salt}: ${words.join(' ')}\nSummary:`;
}

/** Child: cache the 2,000-token prompt in `dir` and exit (close() writes it). */
async function childWrite(dir) {
  const ctx = await createContext({ modelPath: MODEL, nCtx: 4096, nSeqMax: 8, nThreads: threads });
  const s = new Scheduler(ctx, { cacheDir: dir });
  const r = await s.generate({ prompt: longPrompt(1, 2000), maxTokens: 1 });
  await s.close();
  ctx.dispose();
  process.stdout.write(JSON.stringify({ promptTokens: r.usage.promptTokens }));
}

/** Time to the first event of a request. */
async function firstToken(scheduler, prompt) {
  const t0 = performance.now();
  const gen = scheduler.generate({ prompt, maxTokens: 4, params: { temperature: 0 } });
  let first = 0;
  for await (const _ of gen) if (!first) first = performance.now() - t0;
  const r = await gen;
  return { ms: first, cached: r.usage.cachedPromptTokens, prompt: r.usage.promptTokens };
}

/** Child: the restarted process on `dir`, the seen prompt vs cold prompts, interleaved. */
async function childRead(dir, repeats) {
  const ctx = await createContext({ modelPath: MODEL, nCtx: 4096, nSeqMax: 8, nThreads: threads });
  const out = { restored: [], cold: [] };
  for (let i = 0; i < repeats; i++) {
    // A new scheduler each time: a restart's empty KV cells, the folder as the only cache.
    const warm = new Scheduler(ctx, { cacheDir: dir });
    out.restored.push(await firstToken(warm, longPrompt(1, 2000)));
    await warm.close();
    const cold = new Scheduler(ctx);
    out.cold.push(await firstToken(cold, longPrompt(100 + i, 2000)));
    await cold.close();
  }
  ctx.dispose();
  process.stdout.write(JSON.stringify(out));
}

function median(xs) {
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.floor(s.length / 2)];
}

async function main() {
  if (args.child === 'write') return childWrite(/** @type {string} */ (args.dir));
  if (args.child === 'read') return childRead(/** @type {string} */ (args.dir), Number(args.repeats));
  const sessions = Number(args.sessions);
  const turns = Number(args.turns);
  const nCtx = Number(args['n-ctx']);
  const parallel = Number(args.parallel);
  const result = {
    date: new Date().toISOString(),
    machine: `${os.cpus()[0].model} × ${os.cpus().length}, load ${os
      .loadavg()
      .map((l) => l.toFixed(1))
      .join(' ')}`,
    sessions,
    turns,
    reply: Number(args.reply),
    nCtx,
    parallel,
  };

  if (args.only !== 'restart') {
    const ctx = await createContext({ modelPath: MODEL, nCtx, nSeqMax: 64, nThreads: threads });
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-agent-cache-'));
    // Tiers first, then KV only, on the same context (each scheduler starts with empty cells).
    if (args.only !== 'kv')
      result.tiers = await replay(ctx, { cacheRam: '1GiB', cacheDir: dir }, sessions, turns, parallel);
    if (args.only !== 'tiers') result.kvOnly = await replay(ctx, {}, sessions, turns, parallel);
    ctx.dispose();
    fs.rmSync(dir, { recursive: true, force: true });
    if (result.kvOnly && result.tiers) {
      result.prefillRatio = result.kvOnly.prefilledTokens / result.tiers.prefilledTokens;
      result.timeRatio = result.kvOnly.ms / result.tiers.ms;
    }
  }
  if (!['replay', 'tiers', 'kv'].includes(String(args.only))) {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'lb-agent-restart-'));
    const node = (extra) =>
      JSON.parse(
        execFileSync(
          process.execPath,
          [__filename, ...extra, '--dir', dir, ...(threads ? ['--threads', String(threads)] : [])],
          {
            encoding: 'utf8',
            maxBuffer: 1 << 20,
          },
        ),
      );
    node(['--child', 'write']);
    const read = node(['--child', 'read', '--repeats', args.repeats]);
    fs.rmSync(dir, { recursive: true, force: true });
    const restored = median(read.restored.map((r) => r.ms));
    const cold = median(read.cold.map((r) => r.ms));
    result.restart = { ...read, restoredMs: Math.round(restored), coldMs: Math.round(cold), ratio: restored / cold };
  }
  fs.mkdirSync(path.join(__dirname, 'results'), { recursive: true });
  fs.writeFileSync(path.join(__dirname, 'results', 'agent-cache.json'), JSON.stringify(result, null, 2));
  console.log(`agent cache benchmark, ${result.date}, ${result.machine}`);
  if (result.tiers || result.kvOnly) {
    console.log(`\n${sessions} sessions × ${turns} turns, nCtx ${nCtx}, parallel ${parallel}\n`);
    console.log('| | prompt tokens | prefilled | cached | evictions | RAM / disk hits | failed requests | time |');
    console.log('|---|---:|---:|---:|---:|---:|---:|---:|');
    for (const [name, r] of [
      ['KV cells only', result.kvOnly],
      ['KV + RAM + disk', result.tiers],
    ]) {
      if (!r) continue;
      const hits = r.tiers ? `${r.tiers.ramHits} / ${r.tiers.diskHits}` : '–';
      console.log(
        `| ${name} | ${r.promptTokens} | ${r.prefilledTokens} | ${r.cachedPromptTokens} | ${r.evictions} | ${hits} | ${r.failures.length} | ${(r.ms / 1000).toFixed(1)} s |`,
      );
    }
    if (result.kvOnly && result.tiers)
      console.log(
        `\n${result.prefillRatio.toFixed(2)}× fewer tokens prefilled, ${result.timeRatio.toFixed(2)}× faster`,
      );
  }
  if (result.restart) {
    const r = result.restart;
    console.log(
      `\nrestart: first token of a seen ${r.restored[0].prompt}-token prompt ${r.restoredMs} ms (cached ${r.restored[0].cached}) vs cold prefill ${r.coldMs} ms: ${(r.ratio * 100).toFixed(1)} %`,
    );
  }
}

main().catch((e) => {
  console.error(e);
  process.exit(1);
});
