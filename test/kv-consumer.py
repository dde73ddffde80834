"""A consumer of `serve --kv-events` built on the field's own pieces (test/kv-events.test.js).

Subscribes with pyzmq to each endpoint given as WORKER_ID=tcp://HOST:PORT, decodes each message
with the msgpack package (topic, 8-byte sequence number, `[ts, events, dp_rank]` batch in vLLM's
array-like encoding) and applies the events to NVIDIA Dynamo's KV indexer tree
(`dynamo._core.RadixTree` of ai-dynamo-runtime 1.6.1): BlockStored blocks become Dynamo stored
events (Dynamo's own per-block token hash from `compute_block_hash_for_seq`, our block hash as the
external id), BlockRemoved removed events, AllBlocksCleared `clear_all_blocks`. Dynamo's tree
resolves parents and removals itself and refuses what does not fit, which this test relies on.

Commands on stdin, one JSON line each; one JSON line answers:
  {"cmd": "state"}               -> {"seq": {worker: last sequence}, "blocks": {worker: [hash...]}, "errors": [...]}
  {"cmd": "match", "tokens": [...]} -> {"scores": {worker: matching blocks}}
"""

import json
import sys

import msgpack
import zmq
from dynamo._core import RadixTree, compute_block_hash_for_seq

BLOCK_SIZE = 16


def local_hashes(tokens):
    return [compute_block_hash_for_seq(tokens[i : i + BLOCK_SIZE], BLOCK_SIZE)[0] for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE)]


def main():
    ctx = zmq.Context()
    poller = zmq.Poller()
    sockets = {}
    for arg in sys.argv[1:]:
        worker, endpoint = arg.split("=", 1)
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sock.connect(endpoint)
        poller.register(sock, zmq.POLLIN)
        sockets[sock] = int(worker)
    poller.register(sys.stdin, zmq.POLLIN)
    tree = RadixTree()
    seq = {}
    errors = []
    event_id = 0
    print(json.dumps({"ready": True}), flush=True)
    while True:
        for item, _ in poller.poll():
            if item is sys.stdin or item == sys.stdin.fileno():
                line = sys.stdin.readline()
                if not line:
                    return
                cmd = json.loads(line)
                if cmd["cmd"] == "state":
                    blocks = {}
                    for dumped in tree.dump_tree_as_events():
                        ev = json.loads(dumped)
                        stored = ev["event"]["data"].get("stored")
                        if stored:
                            blocks.setdefault(str(ev["worker_id"]), []).extend(str(b["block_hash"]) for b in stored["blocks"])
                    print(json.dumps({"seq": seq, "blocks": blocks, "errors": errors}), flush=True)
                elif cmd["cmd"] == "match":
                    scores = tree.find_matches(local_hashes(cmd["tokens"])).scores
                    print(json.dumps({"scores": {str(k[0] if isinstance(k, tuple) else k): v for k, v in scores.items()}}), flush=True)
                continue
            worker = sockets[item]
            topic, seq_bytes, payload = item.recv_multipart()
            seq[str(worker)] = int.from_bytes(seq_bytes, "big", signed=True)
            ts, events, dp_rank = msgpack.unpackb(payload)
            for event in events:
                kind = event[0]
                event_id += 1
                try:
                    if kind == "AllBlocksCleared":
                        tree.clear_all_blocks(worker)
                        continue
                    if kind == "BlockStored":
                        hashes, parent, tokens, block_size = event[1], event[2], event[3], event[4]
                        assert block_size == BLOCK_SIZE and len(tokens) == len(hashes) * BLOCK_SIZE, event
                        locals_ = local_hashes(tokens)
                        data = {"stored": {"parent_hash": parent, "blocks": [{"block_hash": h, "tokens_hash": t} for h, t in zip(hashes, locals_)]}}
                    elif kind == "BlockRemoved":
                        data = {"removed": {"block_hashes": event[1]}}
                    else:
                        raise ValueError(f"unknown event {kind}")
                    tree.apply_event(worker, json.dumps({"event_id": event_id, "data": data}).encode())
                except Exception as e:  # reported to the test, which fails on any
                    errors.append(f"{kind}: {e}")


if __name__ == "__main__":
    main()
