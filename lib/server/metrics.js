'use strict';

/**
 * GET /metrics in Prometheus' text format (version 0.0.4): the server's request counters, the
 * Scheduler's token and step counters, its gauges, and a histogram of step times. Written by
 * hand: a few dozen lines, no dependency.
 */

/** Upper bounds (seconds) of the step-time histogram's buckets. */
const STEP_BUCKETS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5];

/**
 * The namespace of the gauges routers scrape. They follow the engines' convention (vLLM's
 * `vllm:num_requests_waiting`, SGLang's `sglang:num_queue_reqs`): a colon after the engine's
 * name, so that the endpoint picker's `*:cache_config_info` lookup and its metric flags read them
 * like any engine's (docs/serving.md names the flags).
 */
const ROUTER_PREFIX = 'llamabranch';

/** Tokens per block of the KV event stream and of `cache_config_info{block_size}`. */
const BLOCK_SIZE = 16;

class Metrics {
  constructor() {
    /** @type {Map<string, number>} `endpoint status` → requests answered */
    this.requests = new Map();
    this.decodeRows = 0;
    this.stepCounts = new Array(STEP_BUCKETS.length + 1).fill(0);
    this.stepSeconds = 0;
    this.steps = 0;
    this.embeddingInputs = 0;
    this.decisions = 0;
    this.decisionQuestions = 0;
    this.decisionInputTokens = 0;
  }

  /** Counts an answered /v1/systemone request: its questions and input tokens. */
  decision(questions, inputTokens) {
    this.decisions++;
    this.decisionQuestions += questions;
    this.decisionInputTokens += inputTokens;
  }

  /** Counts an answered request. */
  request(endpoint, status) {
    const key = `${endpoint} ${status}`;
    this.requests.set(key, (this.requests.get(key) || 0) + 1);
  }

  /** Takes one Scheduler step (its `onStep` info). */
  step(info) {
    const seconds = info.stepMs / 1000;
    this.steps++;
    this.stepSeconds += seconds;
    this.decodeRows += info.rows;
    const bucket = STEP_BUCKETS.findIndex((le) => seconds <= le);
    this.stepCounts[bucket === -1 ? STEP_BUCKETS.length : bucket]++;
  }

  /**
   * The exposition text.
   * @param {ReturnType<import('../Scheduler').Scheduler['stats']>} stats
   */
  render(stats) {
    const out = [];
    const metric = (name, type, help, samples) => {
      out.push(`# HELP llamabranch_${name} ${help}`, `# TYPE llamabranch_${name} ${type}`);
      for (const [labels, value] of samples) out.push(`llamabranch_${name}${labels} ${value}`);
    };
    const one = (value) => [['', value]];
    metric(
      'requests_total',
      'counter',
      'HTTP requests answered, by endpoint and status.',
      [...this.requests].map(([key, n]) => {
        const [endpoint, status] = key.split(' ');
        return [`{endpoint="${endpoint}",status="${status}"}`, n];
      }),
    );
    metric('prompt_tokens_total', 'counter', 'Prompt tokens of admitted requests.', one(stats.promptTokens));
    metric(
      'cached_prompt_tokens_total',
      'counter',
      'Prompt tokens served from the prefix cache.',
      one(stats.cachedPromptTokens),
    );
    metric('generated_tokens_total', 'counter', 'Tokens generated.', one(stats.generatedTokens));
    metric('draft_tokens_total', 'counter', 'Draft tokens verified (speculative decoding).', one(stats.draftTokens));
    metric(
      'draft_tokens_accepted_total',
      'counter',
      'Draft tokens accepted (speculative decoding).',
      one(stats.acceptedDraftTokens),
    );
    metric('embedding_inputs_total', 'counter', 'Inputs embedded by /v1/embeddings.', one(this.embeddingInputs));
    this._renderImages(metric, one, stats);
    this._renderDecisions(metric, one);
    metric('steps_total', 'counter', 'Scheduler steps (one batched decode each, at most).', one(stats.steps));
    metric(
      'decode_rows_total',
      'counter',
      'Decode rows over all steps (rows per decode = this / steps).',
      one(this.decodeRows),
    );
    metric('requests_running', 'gauge', 'Requests generating now.', one(stats.running));
    metric('requests_queued', 'gauge', 'Requests waiting for admission.', one(stats.queued));
    metric('kv_cells_used', 'gauge', 'KV cells in use (shared prefixes counted once).', one(stats.cellsUsed));
    metric('kv_cells_total', 'gauge', 'KV cells of the context (nCtx).', one(stats.nCtx));
    metric('prefix_cache_entries', 'gauge', 'Cached prompt prefixes.', one(stats.cachedPrefixes));
    metric('prefix_cache_hit_ratio', 'gauge', 'Cached prompt tokens / prompt tokens.', one(stats.hitRate));
    if (stats.cacheTiers) this._renderTiers(metric, one, stats.cacheTiers);
    this._renderRouterGauges(out, stats);
    let cumulative = 0;
    const buckets = STEP_BUCKETS.map((le, i) => {
      cumulative += this.stepCounts[i];
      return [`_bucket{le="${le}"}`, cumulative];
    });
    buckets.push(['_bucket{le="+Inf"}', this.steps], ['_sum', this.stepSeconds], ['_count', this.steps]);
    metric('step_seconds', 'histogram', 'Wall time of scheduler steps.', buckets);
    return `${out.join('\n')}\n`;
  }

  /** The image encoder's runs, for a context with a projector (`mmprojPath`). */
  _renderImages(metric, one, stats) {
    if (stats.imageEncodes === undefined) return;
    metric('image_encodes_total', 'counter', 'Image encoder runs (one per image prefilled).', one(stats.imageEncodes));
  }

  /** The prefix cache's tiers: hits and bytes per tier, tokens restored instead of prefilled. */
  _renderTiers(metric, one, t) {
    const tiers = (kv, ram, disk) => [
      ['{tier="kv"}', kv],
      ['{tier="ram"}', ram],
      ['{tier="disk"}', disk],
    ];
    metric(
      'prefix_cache_hits_total',
      'counter',
      'Prompts started from a cached prefix, by tier.',
      tiers(t.kvHits, t.ramHits, t.diskHits),
    );
    metric('prefix_cache_bytes', 'gauge', 'Bytes of stored prefix states, by tier.', [
      ['{tier="ram"}', t.ramBytes],
      ['{tier="disk"}', t.diskBytes],
    ]);
    metric('prefix_cache_stored_entries', 'gauge', 'Stored prefix states, by tier.', [
      ['{tier="ram"}', t.ramEntries],
      ['{tier="disk"}', t.diskEntries],
    ]);
    metric(
      'prefix_cache_restored_tokens_total',
      'counter',
      'Prompt tokens restored from RAM or disk, not prefilled.',
      one(t.restoredTokens),
    );
    metric(
      'prefix_cache_disk_on',
      'gauge',
      '1 while the disk tier works; 0 after a failed write (RAM only).',
      one(t.diskOn ? 1 : 0),
    );
    metric(
      'prefix_cache_skipped_files_total',
      'counter',
      'Stored states skipped (corrupt, truncated, other model or settings).',
      one(t.skipped),
    );
  }

  /**
   * The gauges a router balances on (the Gateway API Inference Extension's endpoint picker, llm-d):
   * work waiting for admission, work in the batch (requests and branch programs: both take a
   * step's rows and the KV cells), the KV cells' fill (0..1; cached prefixes count, as they hold
   * cells until evicted) and the block size of the KV event stream.
   */
  _renderRouterGauges(out, stats) {
    const gauge = (name, help, value, labels = '') => {
      const full = `${ROUTER_PREFIX}:${name}`;
      out.push(`# HELP ${full} ${help}`, `# TYPE ${full} gauge`, `${full}${labels} ${value}`);
    };
    gauge('num_requests_waiting', 'Requests and branch programs waiting for admission.', stats.queued);
    gauge(
      'num_requests_running',
      'Requests and branch programs admitted (in the batch).',
      stats.running + stats.programs,
    );
    gauge(
      'kv_cache_usage_perc',
      'Fraction of the KV cells running work holds, 0..1 (idle cached prefixes are reclaimable: left out, as vLLM does).',
      stats.nCtx > 0 ? stats.cellsInUse / stats.nCtx : 0,
    );
    gauge('cache_config_info', 'The KV cache block layout (value always 1).', 1, `{block_size="${BLOCK_SIZE}"}`);
  }

  /** The /v1/systemone counters (`metric` and `one` as in render). */
  _renderDecisions(metric, one) {
    metric('decisions_total', 'counter', 'Decisions answered by /v1/systemone.', one(this.decisions));
    metric('decision_questions_total', 'counter', 'Questions answered by /v1/systemone.', one(this.decisionQuestions));
    metric(
      'decision_input_tokens_total',
      'counter',
      'Input tokens of answered decisions (each state once, plus every question fork).',
      one(this.decisionInputTokens),
    );
  }
}

module.exports = { Metrics, ROUTER_PREFIX, BLOCK_SIZE };
