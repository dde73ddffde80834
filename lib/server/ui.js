'use strict';

/**
 * The page at `/`: static files of ./ui (no build step, nothing from a CDN), read once and
 * served from memory. The routes are public: the page holds no data; the events it fetches from
 * GET /v1/events are keyed like every other endpoint.
 */

const fs = require('node:fs');
const path = require('node:path');

const FILES = {
  '/': ['index.html', 'text/html; charset=utf-8'],
  '/ui/app.js': ['app.js', 'text/javascript; charset=utf-8'],
  '/ui/style.css': ['style.css', 'text/css; charset=utf-8'],
};

const HEADERS = {
  'cache-control': 'no-cache',
  'x-content-type-options': 'nosniff',
  'content-security-policy': "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'",
};

/** @type {Map<string, Buffer> | null} */
let cache = null;

function load() {
  if (!cache) {
    cache = new Map();
    for (const [route, [file]] of Object.entries(FILES)) {
      cache.set(route, fs.readFileSync(path.join(__dirname, 'ui', file)));
    }
  }
  return cache;
}

/** The page's routes (`GET /` and its assets), each marked `public`. */
function uiRoutes() {
  const files = load();
  /** @type {Record<string, any>} */
  const routes = {};
  for (const [route, [, type]] of Object.entries(FILES)) {
    const handler = (req, res) => {
      res.writeHead(200, { ...HEADERS, 'content-type': type });
      res.end(files.get(route));
    };
    handler.public = true;
    routes[`GET ${route}`] = handler;
  }
  return routes;
}

module.exports = { uiRoutes };
