"""Minimal mock vllm.grpc.engine.VllmEngine worker to observe what SMG 1.13.0 calls.

usage: mock_worker.py PORT NAME [PRELOAD_TOKENS_CSV] [--model-path P] [--no-kv] [--no-tokenizer]
Logs every RPC to stdout with a timestamp. Block size 4.
"""
import hashlib, io, json, os, queue, sys, threading, time, zipfile
from concurrent import futures

import grpc
from smg_grpc_proto.generated import common_pb2, vllm_engine_pb2 as pb, vllm_engine_pb2_grpc as pbg

BS = 4
PORT = int(sys.argv[1]); NAME = sys.argv[2]
PRELOAD = [int(x) for x in sys.argv[3].split(",")] if len(sys.argv) > 3 and sys.argv[3] and not sys.argv[3].startswith("--") else []
MODEL_PATH = sys.argv[sys.argv.index("--model-path") + 1] if "--model-path" in sys.argv else ""
NO_KV = "--no-kv" in sys.argv
NO_TOK = "--no-tokenizer" in sys.argv
TOKDIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tok")

def log(*a):
    print(f"[{time.time():.3f}] [{NAME}]", *a, flush=True)

subs = []            # list of queues, one per live subscription
subs_lock = threading.Lock()
seq = 0
seq_lock = threading.Lock()
known = {}           # block_hash -> True (blocks this worker holds)
history = []         # all batches sent (for replay)

def chain_hashes(tokens):
    """Deterministic prefix-chained 63-bit hashes of full blocks."""
    out, prev = [], b""
    for i in range(0, len(tokens) - len(tokens) % BS, BS):
        blk = tokens[i:i + BS]
        h = hashlib.sha256(prev + json.dumps(blk).encode()).digest()
        prev = h
        out.append((int.from_bytes(h[:8], "big") & 0x7FFFFFFFFFFFFFFF, blk))
    return out

def publish_tokens(tokens):
    global seq
    hs = chain_hashes(tokens)
    new, parent = [], None
    for h, blk in hs:
        if h in known:
            parent = h
            continue
        new.append((h, blk))
    if not new:
        return
    for h, _ in new:
        known[h] = True
    stored = common_pb2.KvBlocksStored(blocks=[common_pb2.KvBlock(block_hash=h, token_ids=blk, block_size=BS) for h, blk in new])
    if parent is not None:
        stored.parent_block_hash = parent
    with seq_lock:
        seq += 1
        b = common_pb2.KvEventBatch(sequence_number=seq, timestamp=time.time(),
                                    events=[common_pb2.KvCacheEvent(event_id=seq, stored=stored)])
        history.append(b)
    with subs_lock:
        for q in subs:
            q.put(b)
    log(f"published KV seq={seq} blocks={len(new)} parent={parent}")

class Svc(pbg.VllmEngineServicer):
    def HealthCheck(self, req, ctx):
        log("HealthCheck")
        return pb.HealthCheckResponse(healthy=True, message="ok")

    def GetModelInfo(self, req, ctx):
        log("GetModelInfo")
        return pb.GetModelInfoResponse(model_path=MODEL_PATH, served_model_name="mock-model", is_generation=True,
                                       max_context_length=4096, vocab_size=300, eos_token_ids=[1])

    def GetServerInfo(self, req, ctx):
        log("GetServerInfo")
        return pb.GetServerInfoResponse(server_type="vllm-grpc", block_size=BS, data_parallel_size=1)

    def GetLoads(self, req, ctx):
        log("GetLoads", list(req.include))
        return pb.GetLoadsResponse(dp_rank_count=1, loads=[pb.SchedulerLoad(dp_rank=0, num_running_reqs=0, num_waiting_reqs=0, token_usage=0.0)])

    def GetTokenizer(self, req, ctx):
        log("GetTokenizer")
        if NO_TOK:
            ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "no tokenizer")
        buf = io.BytesIO()
        with zipfile.ZipFile(buf, "w", zipfile.ZIP_DEFLATED) as zf:
            for f in ("tokenizer.json", "tokenizer_config.json"):
                zf.write(os.path.join(TOKDIR, f), f)
        data = buf.getvalue()
        yield common_pb2.GetTokenizerChunk(data=data, sha256=hashlib.sha256(data).hexdigest())

    def SubscribeKvEvents(self, req, ctx):
        log(f"SubscribeKvEvents start_seq={req.start_sequence_number} load_first={req.load_records_before_first_batch}")
        if NO_KV:
            ctx.abort(grpc.StatusCode.UNIMPLEMENTED, "kv events off")
        ctx.send_initial_metadata(())
        q = queue.Queue()
        with subs_lock:
            for b in history:
                if b.sequence_number > req.start_sequence_number:
                    q.put(b)
            subs.append(q)
        try:
            while ctx.is_active():
                try:
                    b = q.get(timeout=0.5)
                except queue.Empty:
                    continue
                yield b
        finally:
            with subs_lock:
                subs.remove(q)
            log("SubscribeKvEvents closed")

    def Abort(self, req, ctx):
        log("Abort", list(req.request_ids))
        return pb.AbortResponse()

    def Generate(self, req, ctx):
        ids = list(req.tokenized.input_ids) if req.WhichOneof("input") == "tokenized" else []
        sp = req.sampling_params
        log(f"Generate rid={req.request_id} stream={req.stream} input={req.WhichOneof('input')} n_ids={len(ids)} ids={ids[:24]} "
            f"max_tokens={sp.max_tokens if sp.HasField('max_tokens') else None} stop={list(sp.stop)} stop_ids={list(sp.stop_token_ids)} "
            f"temp={sp.temperature if sp.HasField('temperature') else None} skip_special={sp.skip_special_tokens} n={sp.n}")
        out = [10, 11, 12]
        slow = bool(ids) and ids[0] == 299
        if slow:
            out = [10] * 40
        publish_tokens(ids + out)
        if req.stream:
            for t in out:
                yield pb.GenerateResponse(chunk=pb.GenerateStreamChunk(token_ids=[t], prompt_tokens=len(ids), completion_tokens=1, cached_tokens=0))
                if not ctx.is_active():
                    log(f"Generate rid={req.request_id} client cancelled stream")
                    return
                time.sleep(0.1 if slow else 0.02)
            yield pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=[], finish_reason="length", prompt_tokens=len(ids), completion_tokens=0))
        else:
            yield pb.GenerateResponse(complete=pb.GenerateComplete(output_ids=out, finish_reason="length", prompt_tokens=len(ids), completion_tokens=len(out)))

if __name__ == "__main__":
    if PRELOAD:
        publish_tokens(PRELOAD)
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    pbg.add_VllmEngineServicer_to_server(Svc(), server)
    server.add_insecure_port(f"127.0.0.1:{PORT}")
    server.start()
    log(f"listening on {PORT} preload={len(PRELOAD)} model_path={MODEL_PATH!r} no_kv={NO_KV}")
    server.wait_for_termination()
