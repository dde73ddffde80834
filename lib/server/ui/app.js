// The page at `/` of `llama-branch serve`: the Scheduler's events (docs/events.md) drawn as one
// branch tree per request or program, with the scheduler's gauges beside them. Live from
// GET /v1/events (fetch, so an API key can be sent), or replayed from a JSONL trace file (the
// examples' --jsonl output, or the server's --trace). No framework and no build step: events
// change a model, and one animation frame redraws only what changed, so 16 requests × 8
// branches stay smooth.
'use strict';

(() => {
  const $ = (id) => document.getElementById(id);
  const WINDOW_MS = 60000;
  const MAX_TREES = 48;
  const TEXT_TAIL = 400;
  const LOG_LINES = 60;

  // ---------------------------------------------------------------------------------------------
  // Model

  let model;
  function resetModel() {
    model = {
      /** @type {Map<string, any>} */ trees: new Map(),
      /** @type {Map<string, any>} */ nodes: new Map(),
      steps: [],
      gauges: null,
      nCtx: 0,
      nSeqMax: 0,
      dirtyNodes: new Set(),
      dirtyTrees: new Set(),
      dirtyGauges: true,
    };
    $('trees').replaceChildren($('empty') || emptyNote());
    $('log').replaceChildren();
    schedule();
  }

  function emptyNote() {
    const p = document.createElement('p');
    p.id = 'empty';
    p.textContent = 'No requests yet. Send one to the server, or open a trace.';
    return p;
  }

  function tree(id, fields) {
    let t = model.trees.get(id);
    if (!t) {
      t = { id, kind: 'script', status: 'running', n: null, promptTokens: null, cachedTokens: null, tokens: 0 };
      t.roots = [];
      model.trees.set(id, t);
    }
    Object.assign(t, fields);
    model.dirtyTrees.add(t);
    return t;
  }

  function node(id) {
    return model.nodes.get(id);
  }

  const touch = (n) => {
    model.dirtyNodes.add(n);
    model.dirtyTrees.add(n.tree);
  };

  /** Applies one event to the model (unknown events go to the log). */
  function apply(e) {
    if (!e || typeof e !== 'object' || typeof e.event !== 'string') return;
    switch (e.event) {
      case 'hello':
        model.nCtx = e.nCtx || model.nCtx;
        model.nSeqMax = e.nSeqMax || model.nSeqMax;
        model.dirtyGauges = true;
        return;
      case 'admit':
        tree(e.request, {
          kind: e.kind,
          status: 'running',
          n: e.n ?? null,
          promptTokens: e.promptTokens ?? null,
          cachedTokens: e.cachedTokens ?? null,
          images: Array.isArray(e.images) ? e.images : null,
        });
        return;
      case 'fork':
        return fork(e);
      case 'append':
      case 'token':
        return grow(e);
      case 'finish': {
        const n = node(e.branch);
        if (!n) return log(e);
        n.state = 'finished';
        n.reason = e.reason;
        if (e.ppl !== undefined) n.ppl = e.ppl;
        if (typeof e.n === 'number') n.n = e.n;
        return touch(n);
      }
      case 'prune': {
        const n = node(e.branch);
        if (!n) return;
        n.state = 'pruned';
        return touch(n);
      }
      case 'decision':
        return decision(e);
      case 'done':
        return treeDone(e);
      case 'step':
        if (typeof e.rows !== 'number') return log(e);
        model.gauges = e;
        model.steps.push(e);
        while (model.steps.length > 0 && model.steps[0].t < e.t - WINDOW_MS) model.steps.shift();
        model.dirtyGauges = true;
        return;
      default:
        return log(e);
    }
  }

  function fork(e) {
    if (model.nodes.has(e.branch)) return;
    const parent = e.parent == null ? null : node(e.parent);
    const treeId = e.request ?? (parent ? parent.tree.id : e.branch);
    const t = tree(treeId, {});
    const isPrompt = e.request !== undefined && e.branch === e.request;
    const n = {
      id: e.branch,
      parent,
      tree: t,
      at: e.at || 0,
      n: e.at || 0,
      text: '',
      ppl: undefined,
      state: isPrompt ? 'prompt' : 'running',
      reason: null,
      el: null,
    };
    model.nodes.set(n.id, n);
    if (!parent) t.roots.push(n);
    touch(n);
  }

  /** An `append` (prompt text) or `token` event: the branch's text grows. */
  function grow(e) {
    const n = node(e.branch);
    if (!n) return log(e);
    n.text += e.text || '';
    if (typeof e.n === 'number') n.n = e.n;
    if (e.event === 'token') {
      if (e.ppl !== undefined) n.ppl = e.ppl;
      if (n.state !== 'pruned' && n.state !== 'prompt') n.state = 'running';
      n.reason = null;
    }
    touch(n);
  }

  /**
   * A `decision` event: each question's forks of the state become its answer, with every option's
   * probability drawn under the question's first fork (state → question forks → options).
   */
  function decision(e) {
    const state = node(e.branch);
    if (!state || !Array.isArray(e.questions)) return log(e);
    state.decided = (state.decided || 0) + e.questions.length;
    touch(state);
    for (const q of e.questions) {
      const forks = (q.branches || []).map(node).filter(Boolean);
      forks.forEach((n, i) => {
        n.state = 'answered';
        n.reason = null;
        if (i === 0) n.decision = q;
        touch(n);
      });
    }
  }

  /** A `done` event: the request or program ended; branches still running end with it. */
  function treeDone(e) {
    const t = model.trees.get(e.request);
    if (!t) return;
    tree(e.request, { status: e.status, error: e.error ? `${e.error.code}: ${e.error.message}` : null });
    for (const n of model.nodes.values()) {
      if (n.tree !== t || n.state !== 'running') continue;
      n.state = 'finished';
      n.reason = 'end';
      touch(n);
    }
  }

  function log(e) {
    const li = document.createElement('li');
    const { event, t: _t, ...rest } = e;
    li.textContent = `${event} ${JSON.stringify(rest)}`.slice(0, 300);
    const list = $('log');
    list.append(li);
    while (list.children.length > LOG_LINES) list.firstElementChild.remove();
  }

  // ---------------------------------------------------------------------------------------------
  // View: one animation frame redraws what changed

  let frame = 0;
  function schedule() {
    if (!frame) frame = requestAnimationFrame(render);
  }

  function el(tag, className, text) {
    const e = document.createElement(tag);
    if (className) e.className = className;
    if (text !== undefined) e.textContent = text;
    return e;
  }

  function treeElement(t) {
    if (t.el) return t.el;
    const details = el('details', 'request');
    details.open = true;
    details.dataset.request = t.id;
    const summary = el('summary');
    summary.append(el('span', 'rid', t.id), el('span', 'kind'), el('span', 'status'), el('span', 'meta'));
    const list = el('ul', 'tree');
    details.append(summary, list);
    t.el = details;
    t.listEl = list;
    const empty = $('empty');
    if (empty) empty.remove();
    $('trees').prepend(details);
    trimTrees();
    return details;
  }

  /** Keeps the page light: at most MAX_TREES cards, the oldest finished ones go first. */
  function trimTrees() {
    if (model.trees.size <= MAX_TREES) return;
    for (const t of model.trees.values()) {
      if (model.trees.size <= MAX_TREES) break;
      if (t.status === 'running') continue;
      if (t.el) t.el.remove();
      model.trees.delete(t.id);
      for (const [id, n] of model.nodes) if (n.tree === t) model.nodes.delete(id);
    }
  }

  function nodeElement(n) {
    if (n.el) return n.el;
    const li = el('li', 'node');
    li.dataset.branch = n.id;
    const head = el('div', 'node-head');
    head.append(el('span', 'bid', n.id), el('span', 'state'), el('span', 'edge'), el('span', 'stats'));
    li.append(head, el('div', 'text'));
    n.el = li;
    const host = n.parent ? childList(n.parent) : treeElement(n.tree) && n.tree.listEl;
    host.append(li);
    return li;
  }

  function childList(parent) {
    const li = nodeElement(parent);
    let list = li.querySelector(':scope > ul.tree');
    if (!list) {
      list = el('ul', 'tree');
      li.append(list);
    }
    return list;
  }

  function renderNode(n) {
    const li = nodeElement(n);
    li.dataset.state = n.state;
    if (n.reason) li.dataset.reason = n.reason;
    else delete li.dataset.reason;
    const [, state, edge, stats] = li.firstElementChild.children;
    state.textContent = n.state === 'finished' && n.reason ? `finished: ${n.reason}` : n.state;
    edge.textContent = n.parent ? `forked at ${n.at} (shared prefix)` : '';
    const own = Math.max(0, n.n - n.at);
    stats.textContent = `${own} tok${n.ppl !== undefined ? ` · ppl ${n.ppl.toFixed(2)}` : ''}`;
    li.dataset.tokens = String(own);
    const text = li.querySelector(':scope > .text');
    text.textContent = n.text.length > TEXT_TAIL ? `…${n.text.slice(-TEXT_TAIL)}` : n.text;
    if (n.decided) stats.textContent += ` · state of ${n.decided} question${n.decided === 1 ? '' : 's'}`;
    if (n.decision) renderDecision(li, n.decision);
    if (n.id === n.tree.id && n.tree.images) renderImages(li, n.tree.images);
  }

  /** Only data URLs of the formats the projector decodes reach an <img> (a trace file is input too). */
  const THUMBNAIL_URL = /^data:image\/(png|jpeg|gif|bmp);base64,[A-Za-z0-9+/]+=*$/;

  /**
   * A prompt's images (its `admit` event's `images`) above its text: a thumbnail for each image
   * the event carries as a data URL, a placeholder with its size and SHA-256 prefix for the rest.
   */
  function renderImages(li, images) {
    if (li.querySelector(':scope > .images')) return;
    const box = el('div', 'images');
    for (const image of images) {
      const size = typeof image.bytes === 'number' ? `${(image.bytes / 1024).toFixed(1)} KiB` : 'size unknown';
      const about = `image · ${size} · sha256 ${String(image.id).slice(0, 16)}… · ${image.nPos} positions`;
      let item;
      if (typeof image.url === 'string' && THUMBNAIL_URL.test(image.url)) {
        item = el('img', 'thumb');
        item.src = image.url;
        item.alt = about;
      } else item = el('span', 'thumb placeholder', `image · ${size} · ${String(image.id).slice(0, 8)}`);
      item.title = about;
      item.dataset.id = String(image.id);
      box.append(item);
    }
    li.insertBefore(box, li.children[1]);
  }

  /** A question's options under its fork: a bar per option, its probability, the winner marked. */
  function renderDecision(li, q) {
    let box = li.querySelector(':scope > .decision');
    if (!box) {
      box = el('div', 'decision');
      li.insertBefore(box, li.children[2] || null);
    }
    const best = q.options.reduce((b, o, i) => (o.p > q.options[b].p ? i : b), 0);
    const head = el('div', 'question');
    const shown = typeof q.answer === 'number' ? q.answer.toFixed(3) : String(q.answer);
    head.append(
      el('span', 'qname', q.name),
      el('span', 'qtype', `${q.type} · ${q.read === 'label' ? 'one logits row' : 'option texts scored'}`),
      el('span', 'qanswer', `→ ${shown} · confidence ${Math.round(q.confidence * 100)} %`),
    );
    const list = el('ul', 'options');
    q.options.forEach((o, i) => {
      const item = el('li', i === best ? 'option winner' : 'option');
      item.dataset.option = o.name;
      item.dataset.p = String(o.p);
      const bar = el('span', 'bar');
      bar.style.width = `${Math.round(o.p * 100)}%`;
      item.append(el('span', 'oname', o.name), el('span', 'track'), el('span', 'p', `${(o.p * 100).toFixed(1)} %`));
      item.children[1].append(bar);
      list.append(item);
    });
    box.replaceChildren(head, list);
  }

  function renderTree(t) {
    if (!model.trees.has(t.id)) return;
    const details = treeElement(t);
    details.dataset.status = t.status;
    details.dataset.kind = t.kind;
    const [, kind, status, meta] = details.firstElementChild.children;
    kind.textContent = t.kind;
    status.textContent = t.status === 'running' ? 'running' : t.status === 'ok' ? 'done' : t.status;
    let branches = 0;
    let tokens = 0;
    for (const n of model.nodes.values()) {
      if (n.tree !== t) continue;
      branches++;
      if (n.state !== 'prompt') tokens += Math.max(0, n.n - n.at);
    }
    const parts = [`${branches} branches`, `${tokens} tokens`];
    if (t.promptTokens != null)
      parts.push(`prompt ${t.promptTokens}${t.cachedTokens ? ` (${t.cachedTokens} cached)` : ''}`);
    if (t.error) parts.push(t.error);
    meta.textContent = parts.join(' · ');
    details.dataset.branches = String(branches);
  }

  function chart(svg, values, times, now) {
    const max = Math.max(1, ...values);
    const points = values.map((v, i) => {
      const x = ((times[i] - (now - WINDOW_MS)) / WINDOW_MS) * 300;
      return `${x.toFixed(1)},${(58 - (v / max) * 54).toFixed(1)}`;
    });
    svg.firstElementChild.setAttribute('points', points.join(' '));
    return max;
  }

  function renderGauges() {
    const g = model.gauges;
    const nCtx = (g && g.nCtx) || model.nCtx;
    const nSeqMax = (g && g.nSeqMax) || model.nSeqMax;
    const used = g ? g.cellsUsed : 0;
    const kv = $('kv');
    kv.textContent = nCtx ? `${used} / ${nCtx}` : '–';
    kv.dataset.used = String(used);
    $('kv-meter').max = nCtx || 1;
    $('kv-meter').value = used;
    const leases = g ? g.leasesUsed : 0;
    $('leases').textContent = nSeqMax ? `${leases} / ${nSeqMax}` : '–';
    $('leases-meter').max = nSeqMax || 1;
    $('leases-meter').value = leases;
    $('running').textContent = g ? String(g.running) : '0';
    $('queued').textContent = g ? String(g.queued) : '0';
    $('steps').textContent = g ? String(g.step) : '0';
    if (g && g.cache) {
      const c = g.cache;
      $('cache').textContent =
        `${c.entries} entries · ${c.tokens} tokens · hit rate ${Math.round(c.hitRate * 100)} % · ${c.evictions} evicted` +
        (c.tiers ? tierText(c.tiers) : '');
    }
    const steps = model.steps;
    const now = steps.length ? steps[steps.length - 1].t : 0;
    const times = steps.map((s) => s.t);
    const rowsMax = chart(
      $('rows-chart'),
      steps.map((s) => s.rows),
      times,
      now,
    );
    const msMax = chart(
      $('ms-chart'),
      steps.map((s) => s.stepMs),
      times,
      now,
    );
    $('rows-max').textContent = steps.length ? `(max ${rowsMax})` : '';
    $('ms-max').textContent = steps.length ? `(max ${Math.round(msMax)})` : '';
  }

  function render() {
    frame = 0;
    for (const n of model.dirtyNodes) if (model.nodes.has(n.id)) renderNode(n);
    for (const t of model.dirtyTrees) renderTree(t);
    model.dirtyNodes.clear();
    model.dirtyTrees.clear();
    if (model.dirtyGauges) renderGauges();
    model.dirtyGauges = false;
    // A replay is marked done only once its last events are drawn, and the mark names the file,
    // so whoever waits on it (a person, a test) never reads the previous replay's page.
    if (player.ended && !$('status').dataset.done) {
      $('status').dataset.file = player.name;
      $('status').dataset.done = 'true';
    }
  }

  function take(event) {
    apply(event);
    schedule();
  }

  // ---------------------------------------------------------------------------------------------
  // Live: GET /v1/events with fetch (an EventSource cannot send the API key)

  let live = null; // AbortController of the live connection
  let retry = 0;
  let typedKey = ''; // the key typed in, when sessionStorage is off

  function setStatus(mode, text) {
    const s = $('status');
    s.dataset.mode = mode;
    s.textContent = text;
  }

  function apiKey() {
    try {
      return sessionStorage.getItem('llama-branch-key') || typedKey;
    } catch {
      return typedKey;
    }
  }

  async function connect() {
    stopReplay();
    if (live) live.abort();
    const controller = new AbortController();
    live = controller;
    clearTimeout(retry);
    setStatus('connecting', 'connecting…');
    const key = apiKey();
    try {
      const res = await fetch('/v1/events', {
        headers: key ? { authorization: `Bearer ${key}` } : {},
        signal: controller.signal,
      });
      if (res.status === 401) {
        setStatus('key', 'this server needs an API key');
        $('key-form').hidden = false;
        $('key').focus();
        return;
      }
      if (!res.ok || !res.body) throw new Error(`HTTP ${res.status}`);
      $('key-form').hidden = true;
      resetModel();
      setStatus('live', 'live');
      const reader = res.body.pipeThrough(new TextDecoderStream()).getReader();
      let buffer = '';
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        buffer += value;
        let end;
        while ((end = buffer.indexOf('\n\n')) !== -1) {
          const message = buffer.slice(0, end);
          buffer = buffer.slice(end + 2);
          for (const line of message.split('\n')) {
            if (line.startsWith('data: ')) take(JSON.parse(line.slice(6)));
          }
        }
      }
      throw new Error('the server closed the stream');
    } catch (e) {
      if (controller.signal.aborted) return;
      setStatus('offline', `disconnected (${e.message}); retrying…`);
      retry = setTimeout(connect, 2000);
    }
  }

  function disconnect() {
    clearTimeout(retry);
    if (live) live.abort();
    live = null;
  }

  // ---------------------------------------------------------------------------------------------
  // Replay of a JSONL trace

  const player = { events: [], at: 0, timer: 0, paused: false, ended: false, name: '' };

  function stopReplay() {
    clearTimeout(player.timer);
    player.timer = 0;
    player.events = [];
    player.ended = false;
    $('play').disabled = true;
    delete $('status').dataset.done;
    delete $('status').dataset.file;
  }

  function parseTrace(text) {
    const events = [];
    for (const line of text.split('\n')) {
      const s = line.trim();
      if (!s.startsWith('{')) continue;
      try {
        const e = JSON.parse(s);
        if (e && typeof e.event === 'string') events.push(e);
      } catch {
        // not an event line (a script's human output mixed in): skipped
      }
    }
    return events;
  }

  function replay(name, text) {
    disconnect();
    stopReplay();
    resetModel();
    player.events = parseTrace(text);
    player.at = 0;
    player.paused = false;
    player.name = name;
    $('play').disabled = false;
    $('play').textContent = 'Pause';
    if (player.events.length === 0) {
      setStatus('replay', `${name}: no events in this file`);
      player.ended = true;
      schedule();
      return;
    }
    advance();
  }

  function advance() {
    player.timer = 0;
    const speed = Number($('speed').value);
    const { events } = player;
    // Events due together (same time, or `instant`) are applied in one go.
    do {
      take(events[player.at]);
      player.at++;
    } while (player.at < events.length && (speed === 0 || gap(player.at) <= 0));
    const done = player.at >= events.length;
    setStatus('replay', `replay ${player.name}: ${player.at} / ${events.length} events${done ? ' (end)' : ''}`);
    if (done) {
      // A script's trace has no `done` events: its trees end with the file.
      for (const t of model.trees.values())
        if (t.kind === 'script' && t.status === 'running') tree(t.id, { status: 'end' });
      player.ended = true;
      schedule();
      $('play').disabled = true;
      return;
    }
    if (!player.paused) player.timer = setTimeout(advance, speed === 0 ? 0 : Math.min(1000, gap(player.at) / speed));
  }

  /** Milliseconds between event `i - 1` and `i` (0 without times). */
  function gap(i) {
    const [a, b] = [player.events[i - 1].t, player.events[i].t];
    return typeof a === 'number' && typeof b === 'number' ? Math.max(0, b - a) : 0;
  }

  // ---------------------------------------------------------------------------------------------
  // Controls

  $('live').addEventListener('click', () => connect());
  $('trace-file').addEventListener('change', async (ev) => {
    const file = ev.target.files && ev.target.files[0];
    if (file) replay(file.name, await file.text());
  });
  $('play').addEventListener('click', () => {
    player.paused = !player.paused;
    $('play').textContent = player.paused ? 'Play' : 'Pause';
    if (player.paused) {
      clearTimeout(player.timer);
      player.timer = 0;
    } else if (player.at < player.events.length) advance();
  });
  $('key-form').addEventListener('submit', (ev) => {
    ev.preventDefault();
    typedKey = $('key').value;
    try {
      sessionStorage.setItem('llama-branch-key', $('key').value);
    } catch {
      // storage off: the key lasts until the page reloads
    }
    connect();
  });

  resetModel();
  connect();
})();

/** The prefix cache's tiers in the cache line: hits per tier, bytes per tier, tokens restored. */
function tierText(t) {
  const mb = (b) => `${(b / 1048576).toFixed(b < 10485760 ? 1 : 0)} MiB`;
  const disk = t.diskOn ? mb(t.diskBytes) : 'off';
  return ` · hits kv ${t.kvHits} / RAM ${t.ramHits} / disk ${t.diskHits} · RAM ${mb(t.ramBytes)} · disk ${disk} · ${t.restoredTokens} tokens restored`;
}
