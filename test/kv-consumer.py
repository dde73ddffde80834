"""A consumer of `serve --kv-events` built on the field's own pieces (test/kv-events.test.js).

Subscribes with pyzmq to each endpoint given as WORKER_ID:FORMAT=tcp://HOST:PORT (FORMAT: map or
array), decodes each message strictly with msgspec into vLLM's KV event structs (topic, 8-byte
sequence number, `[ts, events, dp_rank]` batch; events tagged by `type` maps since vLLM dropped
array_like on them, or the earlier tagged arrays), and applies the events to NVIDIA Dynamo's KV
indexer tree (`dynamo._core.RadixTree` of ai-dynamo-runtime 1.6.1): BlockStored blocks become
Dynamo stored events (Dynamo's own per-block token hash from `compute_block_hash_for_seq`, our
block hash as the external id), BlockRemoved removed events, AllBlocksCleared `clear_all_blocks`.
msgspec refuses a field of the wrong type or a missing one, and Dynamo's tree resolves parents and
removals itself and refuses what does not fit; the test relies on both.

The structs spell out vLLM's schema (vllm/distributed/kv_events.py: field names, order, types and
msgspec options) as a consumer of it would; they are not vLLM's code.

Commands on stdin, one JSON line each; one JSON line answers:
  {"cmd": "state"}               -> {"seq": {worker: last sequence}, "blocks": {worker: [hash...]},
                                     "groups": {worker: [[group_idx, kv_cache_spec_kind], ...]}, "errors": [...]}
  {"cmd": "match", "tokens": [...]} -> {"scores": {worker: matching blocks}}
"""

import json
import sys
from typing import Any, Union

import msgspec
import zmq
from dynamo._core import RadixTree, compute_block_hash_for_seq

BLOCK_SIZE = 16


class MapEvent(msgspec.Struct, tag_field="type", omit_defaults=True, gc=False):
    pass


class BlockStored(MapEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Union[int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None]
    lora_name: Union[str, None]
    extra_keys: Union[list[Union[tuple[Any, ...], None]], None] = None
    group_idx: Union[int, None] = None
    kv_cache_spec_kind: Union[str, None] = None
    kv_cache_spec_sliding_window: Union[int, None] = None


class BlockRemoved(MapEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Union[str, None]
    group_idx: Union[int, None] = None


class AllBlocksCleared(MapEvent, tag="AllBlocksCleared"):
    pass


class ArrayEvent(msgspec.Struct, array_like=True, tag=True, omit_defaults=True, gc=False):
    pass


class ArrayBlockStored(ArrayEvent, tag="BlockStored"):
    block_hashes: list[int]
    parent_block_hash: Union[int, None]
    token_ids: list[int]
    block_size: int
    lora_id: Union[int, None]
    medium: Union[str, None] = None


class ArrayBlockRemoved(ArrayEvent, tag="BlockRemoved"):
    block_hashes: list[int]
    medium: Union[str, None] = None


class ArrayAllBlocksCleared(ArrayEvent, tag="AllBlocksCleared"):
    pass


def batch_of(name, events):
    """vLLM's EventBatch: `[ts, events, data_parallel_rank]`, an array in both forms."""
    fields = [("ts", float), ("events", list[events]), ("data_parallel_rank", Union[int, None], None)]
    return msgspec.defstruct(name, fields, array_like=True, omit_defaults=True, gc=False)


MapBatch = batch_of("MapBatch", Union[BlockStored, BlockRemoved, AllBlocksCleared])
ArrayBatch = batch_of("ArrayBatch", Union[ArrayBlockStored, ArrayBlockRemoved, ArrayAllBlocksCleared])
DECODERS = {"map": msgspec.msgpack.Decoder(MapBatch), "array": msgspec.msgpack.Decoder(ArrayBatch)}


def local_hashes(tokens):
    return [compute_block_hash_for_seq(tokens[i : i + BLOCK_SIZE], BLOCK_SIZE)[0] for i in range(0, len(tokens) - BLOCK_SIZE + 1, BLOCK_SIZE)]


def main():
    ctx = zmq.Context()
    poller = zmq.Poller()
    sockets = {}
    for arg in sys.argv[1:]:
        name, endpoint = arg.split("=", 1)
        worker, fmt = name.split(":")
        sock = ctx.socket(zmq.SUB)
        sock.setsockopt(zmq.SUBSCRIBE, b"kv@")
        sock.connect(endpoint)
        poller.register(sock, zmq.POLLIN)
        sockets[sock] = (int(worker), DECODERS[fmt])
    groups = {}
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
                    kinds = {w: sorted(g, key=str) for w, g in groups.items()}
                    print(json.dumps({"seq": seq, "blocks": blocks, "groups": kinds, "errors": errors}), flush=True)
                elif cmd["cmd"] == "match":
                    scores = tree.find_matches(local_hashes(cmd["tokens"])).scores
                    print(json.dumps({"scores": {str(k[0] if isinstance(k, tuple) else k): v for k, v in scores.items()}}), flush=True)
                continue
            worker, decoder = sockets[item]
            topic, seq_bytes, payload = item.recv_multipart()
            seq[str(worker)] = int.from_bytes(seq_bytes, "big", signed=True)
            try:
                batch = decoder.decode(payload)
            except msgspec.DecodeError as e:  # a field of the wrong type, a missing one, another form
                errors.append(f"worker {worker}: {e}")
                continue
            for event in batch.events:
                kind = type(event).__name__.removeprefix("Array")
                event_id += 1
                try:
                    if kind == "AllBlocksCleared":
                        tree.clear_all_blocks(worker)
                        continue
                    if kind == "BlockStored":
                        hashes, tokens = event.block_hashes, event.token_ids
                        assert event.block_size == BLOCK_SIZE and len(tokens) == len(hashes) * BLOCK_SIZE, event
                        spec = (getattr(event, "group_idx", None), getattr(event, "kv_cache_spec_kind", None))
                        groups.setdefault(str(worker), set()).add(spec)
                        locals_ = local_hashes(tokens)
                        blocks = [{"block_hash": h, "tokens_hash": t} for h, t in zip(hashes, locals_)]
                        data = {"stored": {"parent_hash": event.parent_block_hash, "blocks": blocks}}
                    else:
                        data = {"removed": {"block_hashes": event.block_hashes}}
                    tree.apply_event(worker, json.dumps({"event_id": event_id, "data": data}).encode())
                except Exception as e:  # reported to the test, which fails on any
                    errors.append(f"{kind}: {e}")


if __name__ == "__main__":
    main()
