'use strict';

/**
 * A ZeroMQ PUB socket over node:net, enough for the KV event stream (./kv-events.js): ZMTP 3.0
 * with the NULL mechanism (the greeting, a READY command naming Socket-Type PUB), SUB peers'
 * subscriptions (3.0's subscribe/cancel messages and 3.1's SUBSCRIBE/CANCEL commands, as libzmq
 * sends either), and multipart messages sent to each peer whose subscriptions match the first
 * frame. Written here because the npm `zeromq` package downloads a prebuilt binary at install.
 * A peer that does not keep up loses messages (PUB's high-water mark), never blocks the server.
 */

const net = require('node:net');

/** Bytes a slow peer may have queued before messages to it are dropped (PUB semantics). */
const HIGH_WATER_BYTES = 64 * 1024 * 1024;
/** The largest frame a peer may send us (subscriptions are short; anything else is closed). */
const MAX_INCOMING_FRAME = 64 * 1024;

const FLAG_MORE = 0x01;
const FLAG_LONG = 0x02;
const FLAG_COMMAND = 0x04;

/** Our 64-byte greeting: signature, version 3.0, mechanism NULL, not as-server, filler. */
function greeting() {
  const g = Buffer.alloc(64);
  g[0] = 0xff;
  g[9] = 0x7f;
  g[10] = 3;
  g[11] = 0;
  g.write('NULL', 12, 'ascii');
  return g;
}

/** One frame's bytes: flags, a 1- or 8-byte size, the body. */
function frame(body, flags) {
  if (body.length <= 255) return Buffer.concat([Buffer.from([flags, body.length]), body]);
  const head = Buffer.alloc(9);
  head[0] = flags | FLAG_LONG;
  head.writeBigUInt64BE(BigInt(body.length), 1);
  return Buffer.concat([head, body]);
}

/** The READY command with the Socket-Type property. */
function readyCommand(socketType) {
  const name = Buffer.from('Socket-Type', 'ascii');
  const value = Buffer.from(socketType, 'ascii');
  const size = Buffer.alloc(4);
  size.writeUInt32BE(value.length);
  const body = Buffer.concat([
    Buffer.from([5]),
    Buffer.from('READY', 'ascii'),
    Buffer.from([name.length]),
    name,
    size,
    value,
  ]);
  return frame(body, FLAG_COMMAND);
}

/** One subscriber connection: the handshake, its subscriptions, what it is sent. */
class Peer {
  constructor(socket, onSubscribe) {
    this.socket = socket;
    this.subscriptions = [];
    this._onSubscribe = onSubscribe;
    this._buffer = Buffer.alloc(0);
    this._greeted = false;
    this._ready = false;
    socket.setNoDelay(true);
    socket.on('data', (chunk) => this._read(chunk));
    socket.on('error', () => socket.destroy());
    socket.write(greeting());
    socket.write(readyCommand('PUB'));
  }

  /** Sends `frames` (Buffers) as one multipart message if a subscription matches the first. */
  send(frames, force = false) {
    if (!this._ready || this.socket.destroyed) return;
    if (!force && !this.subscriptions.some((s) => frames[0].subarray(0, s.length).equals(s))) return;
    if (this.socket.writableLength > HIGH_WATER_BYTES) return; // dropped, as a PUB socket does
    const parts = frames.map((f, i) => frame(f, i < frames.length - 1 ? FLAG_MORE : 0));
    this.socket.write(Buffer.concat(parts));
  }

  _read(chunk) {
    this._buffer = Buffer.concat([this._buffer, chunk]);
    if (!this._greeted) {
      if (this._buffer.length < 64) return;
      const g = this._buffer;
      if (g[0] !== 0xff || g[9] !== 0x7f || g[10] < 3 || g.toString('ascii', 12, 16) !== 'NULL')
        return this.socket.destroy(); // not a ZMTP 3 peer with the NULL mechanism
      this._greeted = true;
      this._buffer = this._buffer.subarray(64);
    }
    for (;;) {
      if (this._buffer.length < 2) return;
      const flags = this._buffer[0];
      const long = (flags & FLAG_LONG) !== 0;
      if (long && this._buffer.length < 9) return;
      const size = long ? Number(this._buffer.readBigUInt64BE(1)) : this._buffer[1];
      const start = long ? 9 : 2;
      if (size > MAX_INCOMING_FRAME) return this.socket.destroy();
      if (this._buffer.length < start + size) return;
      const body = this._buffer.subarray(start, start + size);
      this._buffer = this._buffer.subarray(start + size);
      if (flags & FLAG_COMMAND) this._command(body);
      else this._message(body);
    }
  }

  _command(body) {
    const nameLength = body[0];
    const name = body.toString('ascii', 1, 1 + nameLength);
    const rest = body.subarray(1 + nameLength);
    if (name === 'READY') this._ready = true;
    else if (name === 'SUBSCRIBE') this._subscribe(Buffer.from(rest));
    else if (name === 'CANCEL') this._cancel(rest);
    else if (name === 'ERROR') this.socket.destroy();
  }

  /** ZMTP 3.0: a subscription is a message whose first byte is 1 (subscribe) or 0 (cancel). */
  _message(body) {
    if (body.length === 0) return;
    if (body[0] === 1) this._subscribe(Buffer.from(body.subarray(1)));
    else if (body[0] === 0) this._cancel(body.subarray(1));
  }

  _subscribe(topic) {
    this.subscriptions.push(topic);
    this._onSubscribe(this, topic);
  }

  _cancel(topic) {
    const i = this.subscriptions.findIndex((s) => s.equals(topic));
    if (i !== -1) this.subscriptions.splice(i, 1);
  }
}

/** A PUB socket bound to `tcp://HOST:PORT`; `onSubscribe(peer, topic)` may send that peer a replay. */
class PubSocket {
  constructor({ onSubscribe = () => {} } = {}) {
    /** @type {Set<Peer>} */
    this.peers = new Set();
    this._server = net.createServer((socket) => {
      const peer = new Peer(socket, onSubscribe);
      this.peers.add(peer);
      socket.on('close', () => this.peers.delete(peer));
    });
  }

  /** Binds `tcp://HOST:PORT` (port 0: a free one); resolves with the bound `tcp://` address. */
  bind(endpoint) {
    const m = /^tcp:\/\/(\[[^\]]+\]|[^:]+):(\d+)$/.exec(endpoint);
    if (!m) return Promise.reject(new Error(`expected tcp://HOST:PORT, got ${endpoint}`));
    const host = m[1].replace(/^\[|\]$/g, '');
    const host0 = host === '*' ? '0.0.0.0' : host;
    return new Promise((resolve, reject) => {
      this._server.once('error', reject);
      this._server.listen(Number(m[2]), host0, () => {
        this._server.off('error', reject);
        const address = /** @type {net.AddressInfo} */ (this._server.address());
        const shown = address.family === 'IPv6' ? `[${address.address}]` : address.address;
        resolve(`tcp://${shown}:${address.port}`);
      });
    });
  }

  /** Sends one multipart message to every peer subscribed to a prefix of its first frame. */
  send(frames) {
    for (const peer of this.peers) peer.send(frames);
  }

  close() {
    for (const peer of this.peers) peer.socket.destroy();
    return new Promise((resolve) => this._server.close(() => resolve()));
  }
}

module.exports = { PubSocket, HIGH_WATER_BYTES };
