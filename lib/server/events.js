'use strict';

/**
 * GET /v1/events and `--trace FILE`: the Scheduler's events (docs/events.md) as server-sent
 * events, and as a JSONL trace on disk. A client that connects mid-run first gets a replay — the
 * running requests and programs from their admission, the last finished ones, the last minute
 * of steps — with each branch's consecutive tokens merged into one event, then every event live.
 *
 * A slow client cannot hold the server's memory: its unsent output is capped and it is dropped
 * past the cap (the page reconnects and gets a fresh replay).
 */

const fs = require('node:fs');
const { TRACE_VERSION } = require('../scheduler/events');

/** Finished requests and programs kept for the replay. */
const RECENT_DONE = 16;
/** Step events kept for the replay (the page charts the last minute). */
const STEP_WINDOW_MS = 60_000;
/** Unsent bytes a client may have queued before it is dropped. */
const MAX_CLIENT_BACKLOG = 8 * 1024 * 1024;
/** A comment line this often keeps idle connections (and proxies) open. */
const HEARTBEAT_MS = 15_000;

/** One request's or program's events, each branch's consecutive tokens merged. */
class RequestLog {
  constructor() {
    /** @type {any[]} */
    this.events = [];
    /** @type {Map<string, any>} branch → its token event still being merged into */
    this._tokens = new Map();
  }

  add(event) {
    if (event.event === 'token') {
      const open = this._tokens.get(event.branch);
      if (open) {
        open.text += event.text;
        open.n = event.n;
        open.ppl = event.ppl;
        open.t = event.t;
        return;
      }
      const copy = { ...event };
      delete copy.draft;
      this._tokens.set(event.branch, copy);
      this.events.push(copy);
      return;
    }
    if (event.branch !== undefined) this._tokens.delete(event.branch);
    if (event.event === 'fork' && event.parent !== null) this._tokens.delete(event.parent);
    this.events.push(event);
  }
}

class EventFeed {
  /**
   * @param {any} scheduler
   * @param {{ model: string, ctx: any, traceFile?: string | null }} options
   */
  constructor(scheduler, { model, ctx, traceFile = null }) {
    this._hello = { event: 'hello', v: TRACE_VERSION, source: 'server', model, nCtx: ctx.nCtx, nSeqMax: ctx.nSeqMax };
    /** @type {Map<string, RequestLog>} running requests and programs */
    this._live = new Map();
    /** @type {RequestLog[]} the last finished ones, oldest first */
    this._recent = [];
    /** @type {any[]} step and evict events of the last minute */
    this._steps = [];
    /** @type {Set<{ res: import('http').ServerResponse, pending: string[] }>} */
    this._clients = new Set();
    this._flushing = false;
    this._trace = traceFile ? fs.createWriteStream(traceFile, { flags: 'w' }) : null;
    if (this._trace) {
      this._trace.on('error', (e) => process.emitWarning(`--trace ${traceFile}: ${e.message}; tracing stopped`));
      this._trace.write(`${JSON.stringify({ ...this._hello, t: Date.now() })}\n`);
    }
    this._heartbeat = setInterval(() => this._broadcast(': ping\n\n'), HEARTBEAT_MS);
    this._heartbeat.unref();
    this._unsubscribe = scheduler.subscribe((event) => this._take(event));
  }

  /** Clients connected to GET /v1/events. */
  get clients() {
    return this._clients.size;
  }

  _take(event) {
    this._record(event);
    if (!this._trace && this._clients.size === 0) return; // the replay log keeps the object
    const line = JSON.stringify(event);
    if (this._trace && this._trace.writable) this._trace.write(`${line}\n`);
    this._broadcast(`data: ${line}\n\n`);
  }

  _record(event) {
    if (event.request === undefined) {
      this._steps.push(event);
      const horizon = event.t - STEP_WINDOW_MS;
      let old = 0;
      while (old < this._steps.length && this._steps[old].t < horizon) old++;
      if (old > 0) this._steps.splice(0, old);
      return;
    }
    let log = this._live.get(event.request);
    if (!log) {
      log = new RequestLog();
      this._live.set(event.request, log);
    }
    log.add(event);
    if (event.event === 'done') {
      this._live.delete(event.request);
      this._recent.push(log);
      if (this._recent.length > RECENT_DONE) this._recent.shift();
    }
  }

  _broadcast(chunk) {
    if (this._clients.size === 0) return;
    for (const client of this._clients) client.pending.push(chunk);
    if (this._flushing) return;
    this._flushing = true;
    // One write per client per turn of the event loop: a step's events go out together.
    setImmediate(() => {
      this._flushing = false;
      for (const client of this._clients) this._flush(client);
    });
  }

  _flush(client) {
    if (client.pending.length === 0) return;
    const chunk = client.pending.join('');
    client.pending = [];
    if (client.res.writableLength + chunk.length > MAX_CLIENT_BACKLOG) {
      this._clients.delete(client);
      client.res.destroy();
      return;
    }
    client.res.write(chunk);
  }

  /** Answers GET /v1/events: the replay, then every event until the client goes away. */
  attach(req, res, headers) {
    res.writeHead(200, {
      ...headers,
      'content-type': 'text/event-stream; charset=utf-8',
      'cache-control': 'no-cache',
      connection: 'keep-alive',
      'x-accel-buffering': 'no',
    });
    const replay = [
      { ...this._hello, t: Date.now() },
      ...this._steps,
      ...this._recent.flatMap((log) => log.events),
      ...[...this._live.values()].flatMap((log) => log.events),
    ];
    const client = { res, pending: [] };
    res.write(`retry: 2000\n\n${replay.map((e) => `data: ${JSON.stringify(e)}\n\n`).join('')}`);
    this._clients.add(client);
    const drop = () => this._clients.delete(client);
    res.on('close', drop);
    res.on('error', drop);
  }

  /** Ends every client's stream and the trace file. */
  async close() {
    this._unsubscribe();
    clearInterval(this._heartbeat);
    for (const client of this._clients) client.res.end();
    this._clients.clear();
    if (this._trace) {
      const trace = this._trace;
      this._trace = null;
      await new Promise((resolve) => trace.end(resolve));
    }
  }
}

module.exports = { EventFeed, RequestLog };
