'use strict';

// The live page of `llama-branch serve` (lib/server/ui) in a real browser: Debian's Chromium
// driven by playwright-core, against real servers on 127.0.0.1 on the test model. Run by
// `npm run test:ui` (its own step of .ci/run; `npm run setup` installs the browser). Every test
// saves a screenshot under build/ui-screenshots/ (the path is printed);
// LLAMA_BRANCH_UPDATE_SCREENSHOTS=1 also refreshes the README's docs/img/branch-trees.png.

const assert = require('node:assert/strict');
const fs = require('node:fs');
const os = require('node:os');
const path = require('node:path');
const { spawnSync } = require('node:child_process');
const crypto = require('node:crypto');
const OpenAI = require('openai');
const { createContext, createServer } = require('../..');
const { MODEL } = require('../helpers');
const { projectorPath, png } = require('../helpers/images');
const { browserPath } = require('../../scripts/env');
const { testPython } = require('../../scripts/python');

const ROOT = path.join(__dirname, '..', '..');
const SHOTS = path.join(ROOT, 'build', 'ui-screenshots');
const README_SHOT = path.join(ROOT, 'docs', 'img', 'branch-trees.png');

/** Chromium as the probe of this machine kind starts it: headless, no network beyond loopback. */
const CHROMIUM_ARGS = [
  '--no-sandbox',
  '--disable-gpu',
  '--disable-quic',
  '--no-first-run',
  '--disable-background-networking',
  '--disable-component-update',
  '--disable-sync',
];

async function serve(options) {
  const ctx = await createContext({ modelPath: MODEL, nThreads: 2, ...options.context });
  const server = await createServer({ ctx, ...options.server });
  const { url } = await server.listen(0, '127.0.0.1');
  return {
    url,
    server,
    async close() {
      await server.close();
      ctx.dispose();
    },
  };
}

describe('the live page in Chromium', function () {
  this.timeout(300000);
  const executablePath = browserPath();
  const noBrowser =
    'no Chromium found (install Debian\'s "chromium" package, which `npm run setup` does as root, or set LLAMA_BRANCH_BROWSER to a Chromium binary)';
  // Outside CI a machine without Chromium runs none of this tier, and the one test says why. In
  // CI a missing browser is a broken setup, not an optional tier: the hook below fails, so the
  // step cannot pass having run nothing.
  if (!executablePath && process.env.CI !== 'true') {
    it(`not run here: ${noBrowser}`, () => assert.equal(browserPath(), null));
    return;
  }
  let chromium;
  let browser;
  let page;
  let live;
  let errors;
  const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'llama-branch-ui-'));
  const traceFile = path.join(dir, 'server.jsonl');

  async function screenshot(name) {
    fs.mkdirSync(SHOTS, { recursive: true });
    const file = path.join(SHOTS, `${name}.png`);
    await page.screenshot({ path: file });
    console.log(`      screenshot: ${path.relative(process.cwd(), file)}`);
    return file;
  }

  /** Node states in the card of `request`, as `state` or `state:reason`. */
  const states = (request) =>
    page.$$eval(`details.request[data-request="${request}"] li.node`, (nodes) =>
      nodes.map((n) => (n.dataset.reason ? `${n.dataset.state}:${n.dataset.reason}` : n.dataset.state)),
    );

  before(async function () {
    if (!executablePath) throw new Error(`CI=true and ${noBrowser}`);
    ({ chromium } = require('playwright-core'));
    browser = await chromium.launch({ executablePath, args: CHROMIUM_ARGS });
    page = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    errors = [];
    page.on('console', (m) => {
      if (m.type() === 'error') errors.push(m.text());
    });
    page.on('pageerror', (e) => errors.push(String(e)));
    live = await serve({
      context: { nCtx: 4096, nSeqMax: 32 },
      server: { parallel: 4, traceFile, modelName: 'test-model' },
    });
  });
  after(async () => {
    if (browser) await browser.close();
    if (live) await live.close();
    fs.rmSync(dir, { recursive: true, force: true });
  });

  it('draws a request with n = 3 and a program that forks and prunes, live', async () => {
    await page.goto(`${live.url}/`);
    await page.waitForSelector('#status[data-mode="live"]');
    await page.evaluate(() => {
      const kv = document.getElementById('kv');
      window.kvSeen = [kv.dataset.used];
      new MutationObserver(() => window.kvSeen.push(kv.dataset.used)).observe(kv, { attributes: true });
    });
    const client = new OpenAI({ baseURL: `${live.url}/v1`, apiKey: 'x', maxRetries: 0 });
    const [completion, kept] = await Promise.all([
      client.completions.create({ model: 'test-model', prompt: 'Once upon a time', n: 3, max_tokens: 12, seed: 5 }),
      live.server.scheduler.run(async (s) => {
        s.append('A list of colors:');
        const lines = s.fork(3);
        await Promise.all(lines.map((l) => l.gen({ maxTokens: 6 })));
        lines[1].release();
        lines[2].release();
        await lines[0].gen({ maxTokens: 3 });
        return lines[0].text;
      }),
    ]);
    assert.equal(completion.choices.length, 3);
    assert.ok(kept.length > 0);
    await page.waitForSelector('details.request[data-kind="completion"][data-status="ok"]');
    await page.waitForSelector('details.request[data-kind="program"][data-status="ok"]');
    const request = await page.$eval('details.request[data-kind="completion"]', (d) => d.dataset.request);
    const program = await page.$eval('details.request[data-kind="program"]', (d) => d.dataset.request);

    const requestStates = await states(request);
    assert.equal(requestStates.length, 4, 'the prompt and its 3 choices');
    assert.equal(requestStates[0], 'prompt');
    for (const s of requestStates.slice(1)) assert.match(s, /^finished:(stop|length)$/);
    const texts = await page.$$eval(`details.request[data-request="${request}"] li.node li.node > .text`, (t) =>
      t.map((e) => e.textContent),
    );
    assert.deepEqual(
      texts.sort(),
      completion.choices.map((c) => c.text).sort(),
      "each finished branch shows its choice's text",
    );
    const head = await page.$eval(`li.node[data-branch="${request}.0"] .node-head`, (h) => h.textContent);
    assert.match(head, /finished: (stop|length)/);
    assert.match(head, /forked at \d+/);
    assert.match(head, /ppl \d/);

    const programStates = await states(program);
    assert.equal(programStates.length, 4, 'the root line and its 3 forks');
    assert.equal(programStates.filter((s) => s.startsWith('pruned')).length, 2, programStates.join(' '));
    const seen = (await page.evaluate(() => window.kvSeen)).map(Number);
    assert.ok(new Set(seen).size >= 3, `the KV gauge moved: ${seen.join(' ')}`);
    assert.ok(Math.max(...seen) > 0);
    assert.match(await page.$eval('#cache', (e) => e.textContent), /entries/);
    assert.ok((await page.$eval('#rows-chart polyline', (p) => p.getAttribute('points'))).length > 0);
    const shot = await screenshot('live-1280x800');
    if (process.env.LLAMA_BRANCH_UPDATE_SCREENSHOTS === '1') {
      fs.mkdirSync(path.dirname(README_SHOT), { recursive: true });
      fs.copyFileSync(shot, README_SHOT);
    }
    assert.deepEqual(errors, [], 'no console errors');
  });

  it('draws a decision: the state, a fork per question, every option with its probability', async () => {
    const res = await fetch(`${live.url}/v1/systemone`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        state: 'Support ticket: I was charged twice for my order last week and nobody answers my emails.',
        questions: {
          urgent: { type: 'noul', instructions: 'Does this ticket need an answer today?' },
          team: {
            type: 'choice',
            instructions: 'Which team should handle it?',
            criteria: { billing: 'payments and invoices', shipping: null, technical: 'bugs and outages' },
          },
          mood: { type: 'score', instructions: 'How upset is the customer?', criteria: ['calm', 'annoyed', 'angry'] },
        },
      }),
    });
    assert.equal(res.status, 200);
    const { answers } = await res.json();
    await page.waitForFunction(() => document.querySelectorAll('li.node > .decision').length === 3);
    const drawn = await page.$$eval('li.node', (nodes) =>
      nodes
        .filter((n) => n.querySelector(':scope > .decision'))
        .map((n) => ({
          state: n.dataset.state,
          parent: n.parentElement.closest('li.node').dataset.branch,
          name: n.querySelector('.qname').textContent,
          options: [...n.querySelectorAll('.option')].map((o) => ({
            name: o.dataset.option,
            p: Number(o.dataset.p),
            winner: o.classList.contains('winner'),
          })),
        })),
    );
    assert.deepEqual(drawn.map((q) => q.name).sort(), ['mood', 'team', 'urgent']);
    const root = drawn[0].parent;
    const rootHead = await page.$eval(`li.node[data-branch="${root}"] > .node-head`, (h) => h.textContent);
    assert.match(rootHead, /state of 3 questions/, 'the state is the root every question forks');
    for (const q of drawn) {
      assert.equal(q.parent, root, `${q.name} is a fork of the state`);
      assert.equal(q.state, 'answered');
      const total = q.options.reduce((s, o) => s + o.p, 0);
      assert.ok(Math.abs(total - 1) < 1e-3, `${q.name}: the probabilities sum to ${total}`);
      assert.equal(q.options.filter((o) => o.winner).length, 1);
    }
    const byName = Object.fromEntries(drawn.map((q) => [q.name, q]));
    const close = (a, b, what) => assert.ok(Math.abs(a - b) < 1e-3, `${what}: drawn ${a}, answered ${b}`);
    assert.deepEqual(
      byName.urgent.options.map((o) => o.name),
      ['true', 'false'],
    );
    close(byName.urgent.options[0].p, answers.urgent.noul, 'urgent');
    assert.deepEqual(
      byName.team.options.map((o) => o.name),
      ['billing', 'shipping', 'technical'],
    );
    for (const o of byName.team.options) close(o.p, answers.team.probabilities[o.name], `team.${o.name}`);
    assert.equal(byName.team.options.find((o) => o.winner).name, answers.team.choice);
    assert.deepEqual(
      byName.mood.options.map((o) => o.name),
      ['calm', 'annoyed', 'angry'],
    );
    // On the wire a score's probabilities are keyed by level index (as its legend is).
    byName.mood.options.forEach((o, i) => close(o.p, answers.mood.probabilities[String(i)], `mood.${o.name}`));
    await screenshot('decision');
    assert.deepEqual(errors, []);
  });

  it('draws an OpenAI decision (POST /v1/decisions) as it draws a System One one', async () => {
    if (!page.url().startsWith(live.url)) {
      // run alone (mocha -g): the page is not on the live server yet
      await page.goto(`${live.url}/`);
      await page.waitForSelector('#status[data-mode="live"]');
    }
    const before = await page.$$eval('li.node > .decision', (d) => d.length);
    const res = await fetch(`${live.url}/v1/decisions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json' },
      body: JSON.stringify({
        input: 'Support ticket: the parcel arrived broken and I want my money back.',
        questions: [
          { type: 'predicate', name: 'refund', instructions: 'Does the customer ask for a refund?' },
          { type: 'choice', instructions: 'Which team?', choices: [{ value: 'billing' }, { value: true }] },
          {
            type: 'score',
            name: 'temper',
            instructions: 'How upset?',
            levels: [{ label: 'calm' }, { label: 'angry' }],
          },
        ],
      }),
    });
    assert.equal(res.status, 200);
    const { answers } = await res.json();
    await page.waitForFunction((n) => document.querySelectorAll('li.node > .decision').length === n, before + 3);
    const drawn = await page.$$eval('li.node', (nodes) =>
      nodes
        .filter((n) => n.querySelector(':scope > .decision'))
        .map((n) => ({
          name: n.querySelector('.qname').textContent,
          options: [...n.querySelectorAll('.option')].map((o) => ({ name: o.dataset.option, p: Number(o.dataset.p) })),
        })),
    );
    // names unlike the System One decision's above ('mood'), whose nodes are on the page too
    const byName = Object.fromEntries(drawn.map((q) => [q.name, q]));
    // an unnamed question is drawn by its place in the list
    for (const name of ['refund', 'questions[1]', 'temper']) assert.ok(byName[name], `${name} drawn`);
    const close = (a, b, what) => assert.ok(Math.abs(a - b) < 1e-3, `${what}: drawn ${a}, answered ${b}`);
    close(byName.refund.options[0].p, answers[0].probability, 'refund');
    assert.deepEqual(
      byName['questions[1]'].options.map((o) => o.name),
      ['billing', 'true'],
    );
    byName['questions[1]'].options.forEach((o, i) => close(o.p, answers[1].probabilities[i].probability, o.name));
    byName.temper.options.forEach((o, i) => close(o.p, answers[2].probabilities[i].probability, o.name));
    assert.deepEqual(errors, []);
  });

  it('renders at 390×844 without horizontal scrolling', async () => {
    await page.setViewportSize({ width: 390, height: 844 });
    const width = await page.evaluate(() => document.documentElement.scrollWidth);
    assert.ok(width <= 390, `page is ${width}px wide`);
    assert.ok(await page.isVisible('details.request'));
    assert.ok(await page.isVisible('#kv-meter'));
    await screenshot('live-390x844');
    await page.setViewportSize({ width: 1280, height: 800 });
    assert.deepEqual(errors, []);
  });

  it('works from the keyboard alone', async () => {
    await page.reload();
    await page.waitForSelector('#status[data-mode="live"]');
    await page.waitForSelector('details.request');
    const reached = [];
    for (let i = 0; i < 12; i++) {
      await page.keyboard.press('Tab');
      reached.push(
        await page.evaluate(() => document.activeElement.id || document.activeElement.tagName.toLowerCase()),
      );
    }
    for (const control of ['live', 'trace-file', 'speed', 'summary'])
      assert.ok(reached.includes(control), `Tab reaches ${control}: ${reached.join(', ')}`);
    // Focus the first card's summary by Tab, then fold and unfold it with Enter.
    await page.focus('#speed');
    while ((await page.evaluate(() => document.activeElement.tagName)) !== 'SUMMARY') await page.keyboard.press('Tab');
    const open = () => page.evaluate(() => document.activeElement.parentElement.open);
    assert.equal(await open(), true);
    await page.keyboard.press('Enter');
    assert.equal(await open(), false, 'Enter folds the card');
    await page.keyboard.press('Enter');
    assert.equal(await open(), true);
    await page.focus('#live');
    await page.keyboard.press('Space');
    await page.waitForSelector('#status[data-mode="live"]');
    const focus = await page.evaluate(() => getComputedStyle(document.activeElement).outlineStyle);
    assert.notEqual(focus, 'none', 'the focused control is outlined');
    await screenshot('keyboard');
    assert.deepEqual(errors, []);
  });

  it("replays the server's --trace file and an example's --jsonl output", async () => {
    await new Promise((resolve) => setTimeout(resolve, 200)); // the trace stream's last writes
    const recorded = path.join(dir, 'recorded.jsonl');
    fs.copyFileSync(traceFile, recorded);
    const liveRequests = await page.$$eval('details.request', (d) => d.map((e) => e.dataset.request).sort());
    const liveStates = await page.$$eval('li.node', (n) =>
      n.map((e) => `${e.dataset.branch}=${e.dataset.state}`).sort(),
    );

    await page.selectOption('#speed', '0');
    await page.setInputFiles('#trace-file', recorded);
    await page.waitForSelector('#status[data-mode="replay"][data-done="true"][data-file="recorded.jsonl"]');
    assert.deepEqual(await page.$$eval('details.request', (d) => d.map((e) => e.dataset.request).sort()), liveRequests);
    assert.deepEqual(
      await page.$$eval('li.node', (n) => n.map((e) => `${e.dataset.branch}=${e.dataset.state}`).sort()),
      liveStates,
      'the replay ends where the live view did',
    );
    assert.notEqual(await page.$eval('#kv', (e) => e.dataset.used), '0');
    await screenshot('replay-server-trace');

    const beam = spawnSync(
      process.execPath,
      [path.join(ROOT, 'examples', 'beam-search.js'), '--jsonl', '--model', MODEL, '--width', '3', '--max-tokens', '6'],
      { encoding: 'utf8' },
    );
    assert.equal(beam.status, 0, beam.stderr);
    const beamFile = path.join(dir, 'beam.jsonl');
    fs.writeFileSync(beamFile, beam.stdout);
    await page.setInputFiles('#trace-file', beamFile);
    await page.waitForSelector('#status[data-mode="replay"][data-done="true"][data-file="beam.jsonl"]');
    const beamStates = await page.$$eval('li.node', (n) => n.map((e) => e.dataset.state));
    assert.ok(beamStates.length > 3, `${beamStates.length} beam nodes`);
    assert.ok(beamStates.includes('pruned'), 'pruned beams are shown pruned');
    assert.equal(await page.$$eval('li.node[data-reason="best"]', (n) => n.length), 1, 'the best beam is marked');
    assert.ok((await page.$$eval('#log li', (l) => l.length)) > 0, "the example's own events are listed");
    await screenshot('replay-beam-search');
    await page.click('#live');
    await page.waitForSelector('#status[data-mode="live"]');
    assert.deepEqual(errors, []);
  });

  it('stays usable with 16 requests × 8 branches live', async () => {
    const busy = await serve({
      context: { nCtx: 8192, nSeqMax: 160 },
      server: { parallel: 16, modelName: 'test-model' },
    });
    try {
      await page.goto(`${busy.url}/`);
      await page.waitForSelector('#status[data-mode="live"]');
      await page.evaluate(() => {
        window.peak = 0;
        window.frameGap = 0;
        window.frames = 0;
        window.framesSince = performance.now();
        let last = performance.now();
        const tick = (now) => {
          window.frameGap = Math.max(window.frameGap, now - last);
          window.frames++;
          last = now;
          window.peak = Math.max(window.peak, document.querySelectorAll('li.node[data-state="running"]').length);
          requestAnimationFrame(tick);
        };
        requestAnimationFrame(tick);
      });
      const started = Date.now();
      const results = await Promise.all(
        Array.from({ length: 16 }, (_, i) =>
          fetch(`${busy.url}/v1/completions`, {
            method: 'POST',
            headers: { 'content-type': 'application/json' },
            body: JSON.stringify({ prompt: `Story ${i}: once upon a time`, n: 8, max_tokens: 16, seed: i }),
          }).then((r) => r.json()),
        ),
      );
      const seconds = (Date.now() - started) / 1000;
      for (const r of results) assert.equal(r.choices.length, 8);
      await page.waitForFunction(
        () => document.querySelectorAll('details.request[data-status="ok"]').length === 16,
        null,
        { timeout: 30000 },
      );
      const finished = await page.$$eval('li.node[data-state="finished"]', (n) => n.length);
      assert.equal(finished, 128, 'every branch of every request ends finished');
      const { peak, frameGap, meanFrame } = await page.evaluate(() => ({
        peak: window.peak,
        frameGap: window.frameGap,
        meanFrame: (performance.now() - window.framesSince) / window.frames,
      }));
      assert.ok(peak >= 64, `at least 8 requests' branches were drawn running at once (peak ${peak})`);
      console.log(
        `      16 × 8 branches: ${seconds.toFixed(1)} s, peak ${peak} running nodes, longest frame gap ${Math.round(frameGap)} ms (mean frame ${meanFrame.toFixed(1)} ms)`,
      );
      // Usable means the page never froze while 128 branches streamed in. Measured on the 2-core
      // VM under load average 6-8 (4 runs): frames every 16.7 ms on average (60 Hz) and a longest
      // gap of 50 ms every time (at most two frames dropped in a row). 250 ms leaves 5× that for
      // a busier machine, and a page stalled for a quarter of a second is no longer live.
      assert.ok(frameGap < 250, `the page froze for ${Math.round(frameGap)} ms while branches streamed`);
      await screenshot('busy-16x8');
      assert.deepEqual(errors, []);
    } finally {
      await busy.close();
    }
  });

  it('asks for the API key of a keyed server, then streams', async () => {
    const keyed = await serve({
      context: { nCtx: 2048, nSeqMax: 16 },
      server: { apiKeys: ['sk-page'], modelName: 'm' },
    });
    const keyedErrors = [];
    const keyedPage = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    keyedPage.on('pageerror', (e) => keyedErrors.push(String(e)));
    try {
      await keyedPage.goto(`${keyed.url}/`);
      await keyedPage.waitForSelector('#status[data-mode="key"]');
      assert.ok(await keyedPage.isVisible('#key-form'));
      assert.equal(await keyedPage.evaluate(() => document.activeElement.id), 'key', 'the key field has the focus');
      await keyedPage.keyboard.type('sk-page');
      await keyedPage.keyboard.press('Enter');
      await keyedPage.waitForSelector('#status[data-mode="live"]');
      assert.equal(await keyedPage.isVisible('#key-form'), false);
      const r = await fetch(`${keyed.url}/v1/completions`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', authorization: 'Bearer sk-page' },
        body: JSON.stringify({ prompt: 'Hello', n: 2, max_tokens: 4 }),
      });
      assert.equal(r.status, 200);
      await keyedPage.waitForSelector('details.request[data-status="ok"]');
      assert.equal(await keyedPage.$$eval('li.node', (n) => n.length), 3);
      fs.mkdirSync(SHOTS, { recursive: true });
      await keyedPage.screenshot({ path: path.join(SHOTS, 'api-key.png') });
      console.log(`      screenshot: ${path.relative(process.cwd(), path.join(SHOTS, 'api-key.png'))}`);
      assert.deepEqual(keyedErrors, []);
    } finally {
      await keyedPage.close();
      await keyed.close();
    }
  });

  const hasWriter = spawnSync(testPython() || 'python3', ['-c', 'import gguf'], { stdio: 'ignore' }).status === 0;
  if (!hasWriter && process.env.CI !== 'true') {
    it('not run here: the image thumbnail test needs the Python gguf package (python3 -m pip install gguf==0.19.0)', () =>
      assert.notEqual(spawnSync(testPython() || 'python3', ['-c', 'import gguf'], { stdio: 'ignore' }).status, 0));
    return;
  }

  it("draws a chat's images in its prompt node: a small one as a thumbnail, a large one as a placeholder", async () => {
    const vision = await serve({
      context: { nCtx: 1024, nSeqMax: 8, mmprojPath: projectorPath() },
      server: { parallel: 1, modelName: 'vision' },
    });
    const visionPage = await browser.newPage({ viewport: { width: 1280, height: 800 } });
    const pageErrors = [];
    visionPage.on('console', (m) => m.type() === 'error' && pageErrors.push(m.text()));
    visionPage.on('pageerror', (e) => pageErrors.push(String(e)));
    try {
      await visionPage.goto(`${vision.url}/`);
      await visionPage.waitForSelector('#status[data-mode="live"]');
      const small = png(64, 48, { seed: 1 });
      const large = png(160, 160, { seed: 4 }); // over the 64 KiB of a thumbnail
      assert.ok(small.length < 64 * 1024 && large.length > 64 * 1024);
      const url = (b) => ({ type: 'image_url', image_url: { url: `data:image/png;base64,${b.toString('base64')}` } });
      const client = new OpenAI({ baseURL: `${vision.url}/v1`, apiKey: 'x', maxRetries: 0 });
      const res = await client.chat.completions.create({
        model: 'vision',
        messages: [{ role: 'user', content: [{ type: 'text', text: 'Compare ' }, url(small), url(large)] }],
        max_tokens: 3,
      });
      assert.equal(res.choices.length, 1);
      await visionPage.waitForSelector('details.request[data-kind="chat"][data-status="ok"]');
      const request = await visionPage.$eval('details.request[data-kind="chat"]', (d) => d.dataset.request);
      const prompt = `li.node[data-branch="${request}"]`;
      const thumb = await visionPage.$eval(`${prompt} > .images > img.thumb`, (img) => ({
        src: img.src,
        width: img.naturalWidth,
        height: img.naturalHeight,
        id: img.dataset.id,
      }));
      assert.equal(thumb.src, `data:image/png;base64,${small.toString('base64')}`);
      assert.deepEqual([thumb.width, thumb.height], [64, 48], 'the browser decoded the thumbnail');
      const sha = (b) => crypto.createHash('sha256').update(b).digest('hex').slice(0, 16);
      assert.equal(thumb.id, sha(small));
      const placeholder = await visionPage.$eval(`${prompt} > .images > span.thumb.placeholder`, (p) => ({
        text: p.textContent,
        id: p.dataset.id,
      }));
      assert.equal(placeholder.id, sha(large));
      assert.equal(placeholder.text, `image · ${(large.length / 1024).toFixed(1)} KiB · ${sha(large).slice(0, 8)}`);
      const text = await visionPage.$eval(`${prompt} > .text`, (t) => t.textContent);
      assert.match(text, /Compare <__media__><__media__>/, 'the prompt shows where each image went');
      fs.mkdirSync(SHOTS, { recursive: true });
      await visionPage.screenshot({ path: path.join(SHOTS, 'images.png') });
      console.log(`      screenshot: ${path.relative(process.cwd(), path.join(SHOTS, 'images.png'))}`);
      assert.deepEqual(pageErrors, [], "no console errors (the page's CSP allows data: images)");
    } finally {
      await visionPage.close();
      await vision.close();
    }
  });
});
