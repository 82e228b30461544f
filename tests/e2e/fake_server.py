"""A tiny in-memory stand-in for a Tinker-compatible server, used only to self-test
this e2e suite (does the suite drive the 0.38.0 SDK correctly?) while the real
server is not runnable. It is NOT a reference implementation of Loops semantics:
the "model" is a bigram table (logits W[prev, next]) trained with Adam, checkpoints
live in memory, futures complete synchronously.

    export HF_HUB_CACHE=$(mktemp -d)   # where --write-tokenizer puts loops/tiny's tokenizer
    python tests/e2e/fake_server.py --write-tokenizer   # prints "listening on http://127.0.0.1:PORT"
    LOOPS_E2E_URL=http://127.0.0.1:PORT pytest tests/e2e

It follows docs/tinker-compat.md for the wire format (JSON shapes, proto results,
sample_sequence_ids, "<session>:train:<n>" ids, create-via-load).
"""

from __future__ import annotations

import copy
import json
import re
import sys
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

V = 512  # vocabulary: bytes and then some
BASE = "loops/tiny"
_lock = threading.RLock()


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


class Run:
    def __init__(self, run_id: str, rank: int, seed: int | None, owner: str, meta):
        rng = np.random.default_rng(seed if seed is not None else 0)
        self.id, self.rank, self.owner, self.meta = run_id, rank, owner, meta
        self.W = rng.normal(0, 0.5, (V, V))
        self.G = np.zeros_like(self.W)
        self.m = np.zeros_like(self.W)
        self.v = np.zeros_like(self.W)
        self.t = 0
        self.last = _now()
        self.checkpoints: dict[str, dict] = {}

    def state(self) -> dict:
        return {k: copy.deepcopy(getattr(self, k)) for k in ("W", "m", "v", "t", "rank")}


RUNS: dict[str, Run] = {}
SESSIONS: dict[str, dict] = {}
FUTURES: dict[str, tuple[str, object]] = {}  # id -> ("json"|"proto", payload)
SAMPLERS: dict[str, dict] = {}


def logsoftmax(x: np.ndarray) -> np.ndarray:
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def _tensor(t: pb.Tensor) -> np.ndarray:
    dt = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64}[t.dtype]
    if t.HasField("sparse_csr"):
        raise ValueError("sparse tensors not supported by the fake server")
    a = np.frombuffer(t.dense, dtype=dt)
    return a.reshape(list(t.shape)) if len(t.shape) else a


def forward_backward(body: bytes) -> bytes:
    req = pb.ForwardBackwardRequest()
    req.ParseFromString(body)
    run = RUNS[req.model_id]
    cfg = {k: v.number for k, v in req.loss_fn_config_v2.items() if v.WhichOneof("value") == "number"}
    cfg = cfg or dict(req.loss_fn_config)
    total, lps_all = 0.0, []
    for d in req.data:
        toks = np.concatenate([np.frombuffer(c.encoded_text.tokens, dtype=np.int32) for c in d.model_input])
        ins = {k: _tensor(v).astype(np.float64) for k, v in d.loss_fn_inputs.items()}
        y = ins["target_tokens"].astype(np.int64)
        logp = logsoftmax(run.W[toks])  # (N, V)
        lp = logp[np.arange(len(y)), y]
        if req.loss_fn == "cross_entropy":
            w = ins.get("weights", np.ones_like(lp))
            loss, dlp = -(w * lp).sum(), -w
        else:
            q, A = ins["logprobs"], ins["advantages"]
            r = np.exp(lp - q)
            lo, hi = cfg.get("clip_low_threshold", 0.8), cfg.get("clip_high_threshold", 1.2)
            if req.loss_fn == "importance_sampling":
                loss, dlp = -(r * A).sum(), -(r * A)
            elif req.loss_fn == "ppo":
                unclipped = r * A <= np.clip(r, lo, hi) * A
                loss = -np.minimum(r * A, np.clip(r, lo, hi) * A).sum()
                dlp = -np.where(unclipped, r * A, 0.0)
            elif req.loss_fn == "cispo":
                c = np.clip(r, lo, hi)
                loss, dlp = -(c * A * lp).sum(), -(c * A)
            elif req.loss_fn == "dro":
                beta = cfg.get("beta", 0.0)
                loss = -(lp * A - 0.5 * beta * (lp - q) ** 2).sum()
                dlp = -(A - beta * (lp - q))
            else:
                raise ValueError(f"unsupported loss {req.loss_fn}")
        total += float(loss)
        lps_all.append(lp.astype(np.float32))
        if not req.forward_only:
            # d lp_i / d W[t_i, :] = onehot(y_i) - softmax
            g = -np.exp(logp)
            g[np.arange(len(y)), y] += 1.0
            np.add.at(run.G, toks, dlp[:, None] * g)
    out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
    rec = out.loss_fn_outputs.add(type_tag="ArrayRecord", num_datums=len(lps_all))
    bt = rec.fields["logprobs"]
    bt.dtype = pb.DTYPE_FLOAT32
    bt.data = b"".join(a.tobytes() for a in lps_all)
    offs = np.cumsum([0] + [a.nbytes for a in lps_all]).astype(np.int64)
    bt.offsets = offs.tobytes()
    out.metrics["loss:sum"] = total
    run.last = _now()
    return out.SerializeToString()


def optim_step(run: Run, p: dict) -> dict:
    lr, b1, b2, eps = p["learning_rate"], p["beta1"], p["beta2"], p["eps"]
    run.t += 1
    run.m = b1 * run.m + (1 - b1) * run.G
    run.v = b2 * run.v + (1 - b2) * run.G**2
    mh, vh = run.m / (1 - b1**run.t), run.v / (1 - b2**run.t)
    run.W -= lr * mh / (np.sqrt(vh) + eps)
    run.G[:] = 0
    return {"metrics": {}}


def sample(req: dict) -> tuple[bytes, list[str]]:
    smp = SAMPLERS[req["sampling_session_id"]]
    W = smp["W"]
    prompt = [t for c in req["prompt"]["chunks"] for t in c["tokens"]]
    sp = req["sampling_params"]
    stop = sp.get("stop") or []
    if isinstance(stop, str):
        stop = [stop]
    seed = sp.get("seed")
    rng = np.random.default_rng(seed if seed is not None else None)
    out = pb.SampleResponse()
    ids = []
    for i in range(req.get("num_samples", 1)):
        toks, lps, reason = [], [], "length"
        prev = prompt[-1]
        for _ in range(sp.get("max_tokens") or 16):
            lp = logsoftmax(W[prev] / max(sp.get("temperature", 1.0), 1e-6))
            t = int(rng.choice(V, p=np.exp(lp)))
            toks.append(t)
            lps.append(lp[t])
            prev = t
            text = bytes(x for x in toks if x < 256).decode("utf-8", "replace")
            if any(isinstance(s, int) and s == t for s in stop) or any(
                isinstance(s, str) and text.endswith(s) for s in stop
            ):
                reason = "stop"
                break
        seq = out.sequences.add(
            stop_reason=pb.STOP_REASON_STOP if reason == "stop" else pb.STOP_REASON_LENGTH
        )
        seq.tokens = np.asarray(toks, np.int32).tobytes()
        seq.logprobs = np.asarray(lps, np.float32).tobytes()
        ids.append(f"{req['sampling_session_id']}:{req.get('seq_id')}:{i}:{uuid.uuid4().hex[:6]}")
    if req.get("prompt_logprobs"):
        lp = logsoftmax(W[prompt[:-1]])[np.arange(len(prompt) - 1), prompt[1:]]
        out.prompt_logprobs = np.concatenate([[np.nan], lp]).astype(np.float32).tobytes()
    if req.get("topk_prompt_logprobs", 0) > 0:
        k = req["topk_prompt_logprobs"]
        ids_m = np.zeros((len(prompt), k), np.int32)
        lps_m = np.full((len(prompt), k), -99999.0, np.float32)
        for pos in range(1, len(prompt)):
            lp = logsoftmax(W[prompt[pos - 1]])
            top = np.argsort(-lp)[:k]
            ids_m[pos], lps_m[pos] = top, lp[top]
        out.topk_prompt_logprobs.token_ids = ids_m.tobytes()
        out.topk_prompt_logprobs.logprobs = lps_m.tobytes()
        out.topk_prompt_logprobs.k = k
        out.topk_prompt_logprobs.length = len(prompt)
    return out.SerializeToString(), ids


def ckpt_entry(run: Run, kind: str, name: str) -> dict:
    seg = {"training": "weights", "sampler": "sampler_weights"}[kind]
    return {
        "checkpoint_id": f"{seg}/{name}",
        "checkpoint_type": kind,
        "time": _now(),
        "tinker_path": f"tinker://{run.id}/{seg}/{name}",
        "size_bytes": run.W.nbytes,
        "public": False,
    }


def run_json(run: Run) -> dict:
    cks = list(run.checkpoints.values())
    last = [c["entry"] for c in cks if c["entry"]["checkpoint_type"] == "training"]
    lasts = [c["entry"] for c in cks if c["entry"]["checkpoint_type"] == "sampler"]
    return {
        "training_run_id": run.id, "base_model": BASE, "model_owner": run.owner,
        "is_lora": True, "lora_rank": run.rank, "last_request_time": run.last,
        "last_checkpoint": last[-1] if last else None,
        "last_sampler_checkpoint": lasts[-1] if lasts else None,
        "user_metadata": run.meta or None,
    }


def find_ckpt(path: str) -> tuple[Run, dict]:
    m = re.fullmatch(r"tinker://(.+)/(weights|sampler_weights)/([^/]+)", path)
    if not m or m.group(1) not in RUNS:
        raise KeyError(path)
    run = RUNS[m.group(1)]
    return run, run.checkpoints[f"{m.group(2)}/{m.group(3)}"]


def new_future(kind: str, payload: object, extra: dict | None = None) -> dict:
    rid = uuid.uuid4().hex
    FUTURES[rid] = (kind, payload)
    return {"request_id": rid, **(extra or {})}


def new_sampler(session: str, seq: int, W: np.ndarray, path: str | None) -> str:
    sid = f"{session}:sample:{seq}"
    SAMPLERS[sid] = {"W": W.copy(), "path": path}
    return sid


def load_into(run: Run, path: str, optimizer: bool) -> None:
    _, ck = find_ckpt(path)
    st = ck["state"]
    run.W = st["W"].copy()
    if optimizer:
        run.m, run.v, run.t = st["m"].copy(), st["v"].copy(), st["t"]
    else:
        run.m[:] = 0
        run.v[:] = 0
        run.t = 0
    run.G[:] = 0


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, fmt, *args):  # noqa: A002
        sys.stderr.write("%s %s\n" % (self.command, self.path))

    def _send(self, code: int, obj=None, raw: bytes | None = None, ctype="application/json"):
        body = raw if raw is not None else json.dumps(obj if obj is not None else {}).encode()
        self.send_response(code)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _body(self) -> bytes:
        return self.rfile.read(int(self.headers.get("Content-Length") or 0))

    def do_GET(self):  # noqa: N802
        self._dispatch("GET")

    def do_POST(self):  # noqa: N802
        self._dispatch("POST")

    def do_DELETE(self):  # noqa: N802
        self._dispatch("DELETE")

    def do_PUT(self):  # noqa: N802
        self._dispatch("PUT")

    def _dispatch(self, method: str) -> None:
        raw = self._body()
        u = urlparse(self.path)
        path = u.path.removeprefix("/api/v1/")
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        owner = self.headers.get("X-API-Key", "")
        try:
            with _lock:
                self._route(method, path, q, raw, owner)
        except KeyError as e:
            self._send(404, {"detail": f"not found: {e}"})
        except Exception as e:  # noqa: BLE001
            self._send(400, {"detail": f"{type(e).__name__}: {e}"})

    def _route(self, method, path, q, raw, owner):  # noqa: C901
        j = json.loads(raw) if raw and self.headers.get("Content-Type", "").startswith("application/json") else {}
        if path in ("client/config", "client/dynamic_config", "session_heartbeat"):
            return self._send(200, {})
        if path == "telemetry":
            return self._send(200, {"status": "accepted"})
        if path == "get_server_capabilities":
            return self._send(200, {"supported_models": [{"model_name": BASE, "max_context_length": 512}]})
        if path == "create_session":
            sid = uuid.uuid4().hex[:12]
            SESSIONS[sid] = {"owner": owner, "runs": [], "samplers": []}
            return self._send(200, {"session_id": sid})
        if re.fullmatch(r"sessions/[^/]+/finish", path):
            return self._send(200, {})
        if path == "create_model":
            if j["base_model"] != BASE:
                return self._send(400, {"detail": f"unknown base model {j['base_model']}"})
            rid = f"{j['session_id']}:train:{j['model_seq_id']}"
            RUNS[rid] = Run(rid, j["lora_config"]["rank"], j["lora_config"].get("seed"), owner, j.get("user_metadata"))
            SESSIONS[j["session_id"]]["runs"].append(rid)
            return self._send(200, new_future("json", {"model_id": rid}))
        if path == "get_info":
            run = RUNS[j["model_id"]]
            return self._send(200, {"model_id": run.id, "model_data": {"model_name": BASE}, "is_lora": True, "lora_rank": run.rank})
        if path == "forward_backward":
            return self._send(200, new_future("proto", forward_backward(raw)))
        if path == "optim_step":
            return self._send(200, new_future("json", optim_step(RUNS[j["model_id"]], j["adam_params"])))
        if path == "save_weights":
            run = RUNS[j["model_id"]]
            e = ckpt_entry(run, "training", j["path"])
            run.checkpoints[e["checkpoint_id"]] = {"entry": e, "state": run.state()}
            return self._send(200, new_future("json", {"path": e["tinker_path"]}))
        if path == "save_weights_for_sampler":
            run = RUNS[j["model_id"]]
            if j.get("path"):
                e = ckpt_entry(run, "sampler", j["path"])
                run.checkpoints[e["checkpoint_id"]] = {"entry": e, "state": run.state()}
                return self._send(200, new_future("json", {"path": e["tinker_path"]}))
            session = run.id.rsplit(":", 2)[0]
            sid = new_sampler(session, j["sampling_session_seq_id"], run.W, None)
            return self._send(200, new_future("json", {"sampling_session_id": sid}))
        if path == "load_weights":
            if "session_id" in j:
                src, _ = find_ckpt(j["path"])
                rid = f"{j['session_id']}:train:{j['model_seq_id']}"
                RUNS[rid] = Run(rid, src.rank, 0, owner, j.get("user_metadata"))
                load_into(RUNS[rid], j["path"], j["optimizer"])
                return self._send(200, new_future("json", {"model_id": rid}))
            load_into(RUNS[j["model_id"]], j["path"], j["optimizer"])
            return self._send(200, new_future("json", {}))
        if path == "create_sampling_session":
            if j.get("model_path"):
                _, ck = find_ckpt(j["model_path"])
                W = ck["state"]["W"]
            else:
                W = Run("base", 1, 0, owner, None).W
            sid = new_sampler(j["session_id"], j["sampling_session_seq_id"], W, j.get("model_path"))
            return self._send(200, {"sampling_session_id": sid})
        if path.startswith("samplers/"):
            sid = path.removeprefix("samplers/")
            s = SAMPLERS[sid]
            return self._send(200, {"sampler_id": sid, "base_model": BASE, "model_path": s["path"]})
        if path == "asample":
            payload, ids = sample(j)
            return self._send(200, new_future("proto", payload, {"sample_sequence_ids": ids}))
        if path == "retrieve_future":
            kind, payload = FUTURES[j["request_id"]]
            if kind == "proto":
                return self._send(200, raw=payload, ctype="application/x-protobuf")
            return self._send(200, payload)
        if path == "weights_info":
            run, _ = find_ckpt(j["tinker_path"])
            return self._send(200, {"base_model": BASE, "is_lora": True, "lora_rank": run.rank})
        if path == "training_runs" and method == "GET":
            runs = [run_json(r) for r in RUNS.values() if r.owner == owner]
            off, lim = int(q.get("offset", 0)), int(q.get("limit", 20))
            return self._send(200, {"training_runs": runs[off : off + lim], "cursor": {"offset": off, "limit": lim, "total_count": len(runs)}})
        if path == "checkpoints":
            cks = [c["entry"] for r in RUNS.values() if r.owner == owner for c in r.checkpoints.values()]
            off, lim = int(q.get("offset", 0)), int(q.get("limit", 100))
            return self._send(200, {"checkpoints": cks[off : off + lim], "cursor": {"offset": off, "limit": lim, "total_count": len(cks)}})
        m = re.fullmatch(r"training_runs/([^/]+)(/checkpoints(/.+)?)?", path)
        if m:
            run = RUNS[m.group(1)]
            if run.owner != owner:
                raise KeyError(run.id)
            if not m.group(2):
                return self._send(200, run_json(run))
            if not m.group(3):
                return self._send(200, {"checkpoints": [c["entry"] for c in run.checkpoints.values()]})
            if method == "DELETE":
                del run.checkpoints[m.group(3).lstrip("/")]
                return self._send(200, {})
        if path == "sessions":
            return self._send(200, {"sessions": [s for s, v in SESSIONS.items() if v["owner"] == owner]})
        if path.startswith("sessions/"):
            sid = path.removeprefix("sessions/")
            return self._send(200, {"training_run_ids": SESSIONS[sid]["runs"], "sampler_ids": []})
        return self._send(404, {"detail": f"no route {method} {path}"})


def write_tokenizer() -> None:
    """Put a byte-level tokenizer for loops/tiny into the HF hub cache (huggingface_hub's:
    HF_HUB_CACHE, else $HF_HOME/hub, else $XDG_CACHE_HOME/huggingface/hub, else
    ~/.cache/huggingface/hub, as internal/hfcache finds it), the layout that
    AutoTokenizer.from_pretrained("loops/tiny") finds with HF_HUB_OFFLINE=1:
    models--loops--tiny/refs/main (a commit id) and snapshots/<commit>/{tokenizer.json,
    tokenizer_config.json, config.json}. Ids 0..255 are bytes, 256 is <|endoftext|>."""
    from pathlib import Path

    from huggingface_hub import constants
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    hub = constants.HF_HUB_CACHE
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1))
    bs += list(range(ord("®"), ord("ÿ") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    byte_to_char = dict(zip(bs, map(chr, cs)))
    vocab = {byte_to_char[b]: b for b in range(256)}
    vocab["<|endoftext|>"] = 256
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(["<|endoftext|>"])
    commit = "0" * 40
    repo = Path(hub) / "models--loops--tiny"
    snap = repo / "snapshots" / commit
    snap.mkdir(parents=True, exist_ok=True)
    tok.save(str(snap / "tokenizer.json"))
    (snap / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|endoftext|>", "model_max_length": 512}
    ))
    (snap / "config.json").write_text(json.dumps({"model_type": "qwen3", "vocab_size": V}))
    (repo / "refs").mkdir(exist_ok=True)
    (repo / "refs" / "main").write_text(commit)


def main() -> None:
    if "--write-tokenizer" in sys.argv:
        write_tokenizer()
    srv = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    sys.stderr.write(f"listening on http://127.0.0.1:{srv.server_address[1]}\n")
    sys.stderr.flush()
    srv.serve_forever()


if __name__ == "__main__":
    main()
