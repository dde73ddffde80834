'use strict';

/**
 * SMG (the Shepherd Model Gateway, PyPI `smg`, installed by `npm run setup`) as a child process on
 * 127.0.0.1, for bench/router.js and test/smg.test.js: its command, its launch flags, and a start
 * that resolves once every worker is healthy (and, over gRPC, once SMG holds the tokenizer it
 * fetched from a worker with GetTokenizer).
 */

const { spawn, spawnSync } = require('node:child_process');
const { freePort } = require('./common');
const { pythonTool } = require('../scripts/python');

/** The `smg` command when it runs here, else null. */
function smgCommand() {
  const command = pythonTool('smg');
  return spawnSync(command, ['--version'], { encoding: 'utf8' }).status === 0 ? command : null;
}

/**
 * `smg launch` flags: `workers` (http:// or grpc:// URLs) under `policy`, with health checked
 * every second (a killed worker leaves within seconds) and, unless `warmup`, the warm-up
 * diversions off (SMG's defaults route some cache misses and one hit in 8 to a worker whose
 * index is thin: tests then could not say where a request goes). `extra`: more flags.
 */
function smgLaunchArgs({ port, metricsPort, workers, policy, extra = [], warmup = false }) {
  const args = ['launch', '--host', '127.0.0.1', '--port', String(port), '--worker-urls', ...workers];
  args.push('--policy', policy, '--worker-startup-check-interval', '1');
  if (!warmup) args.push('--worker-warmup-secs', '0', '--worker-warmup-divert-every', '0');
  args.push('--health-check-interval-secs', '1', '--health-failure-threshold', '1', '--health-success-threshold', '1');
  args.push('--prometheus-host', '127.0.0.1', '--prometheus-port', String(metricsPort), '--log-level', 'warn');
  // Without it SMG waits out its default grace period (minutes) on SIGTERM.
  args.push('--shutdown-grace-period-secs', '1');
  return [...args, ...extra];
}

/** Polls `check` every 250 ms until it returns true; throws naming `what` after `ms`. */
async function pollUntil(check, what, ms) {
  for (const until = Date.now() + ms; Date.now() < until;) {
    if (await check()) return;
    await new Promise((r) => setTimeout(r, 250));
  }
  throw new Error(`timed out after ${ms} ms waiting for ${what}`);
}

/** SMG's /v1/tokenize of `prompt` for `model` (its body: `tokens` once the tokenizer is in). */
const smgTokenize = async (url, model, prompt) =>
  (
    await fetch(`${url}/v1/tokenize`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({ model, prompt }),
    })
  ).json();

/**
 * Starts `smg launch` in front of `workers` and resolves `{ child, url, metrics, log }` once all are
 * healthy; `tokenizerModel` (gRPC workers): also wait until SMG tokenizes for that model;
 * `warmup`: SMG's warm-up diversions at its defaults.
 */
async function startSmg(
  command,
  workers,
  { policy = 'cache_aware', extra = [], tokenizerModel = null, warmup = false } = {},
) {
  const [port, metricsPort] = [await freePort(), await freePort()];
  const child = spawn(command, smgLaunchArgs({ port, metricsPort, workers, policy, extra, warmup }), {
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  let log = '';
  child.stdout.on('data', (d) => (log = (log + d).slice(-20000)));
  child.stderr.on('data', (d) => (log = (log + d).slice(-20000)));
  const smg = {
    child,
    url: `http://127.0.0.1:${port}`,
    metrics: `http://127.0.0.1:${metricsPort}/metrics`,
    log: () => log,
  };
  const healthy = async () => {
    if (child.exitCode !== null) throw new Error(`smg exited with ${child.exitCode}: ${log}`);
    const body = await fetch(`${smg.url}/workers`).then(
      (r) => r.json(),
      () => ({ workers: [] }),
    );
    return body.workers.filter((w) => w.is_healthy).length === workers.length;
  };
  try {
    await pollUntil(healthy, `smg to register ${workers.length} healthy workers`, 90000);
    if (tokenizerModel) {
      const ready = async () => (await smgTokenize(smg.url, tokenizerModel, 'ready?')).tokens !== undefined;
      await pollUntil(ready, 'smg to load the tokenizer from a worker (GetTokenizer)', 90000);
    }
  } catch (e) {
    child.kill('SIGKILL');
    throw e;
  }
  return smg;
}

/** SMG's count of cache_aware decisions that `branch` took (`event_hit`: a worker's KV events held the prefix). */
async function smgBranchCount(smg, branch) {
  const text = await (await fetch(smg.metrics)).text();
  const m = new RegExp(`smg_cache_aware_policy_branch_total\\{branch="${branch}"\\} (\\d+)`).exec(text);
  return m ? Number(m[1]) : 0;
}

/** Every cache_aware branch SMG counted, as `{ branch: count }`. */
async function smgBranches(smg) {
  const text = await (await fetch(smg.metrics)).text();
  const re = /smg_cache_aware_policy_branch_total\{branch="([^"]+)"\} (\d+)/g;
  return Object.fromEntries([...text.matchAll(re)].map((m) => [m[1], Number(m[2])]));
}

module.exports = { smgCommand, smgLaunchArgs, startSmg, smgTokenize, smgBranchCount, smgBranches };
