"""A light tenant's forward_backward latency beside a flooding tenant, through the tinker SDK.

Run by bench/fairness/sdk_fairness.sh, which starts the servers; by hand, against a server
whose API keys put LIGHT_KEY and HEAVY_KEY in different workspaces:

    TINKER_BASE_URL=http://127.0.0.1:8000 python bench/fairness/sdk_fairness.py \\
        --light-key tml-light --heavy-key tml-heavy --scenarios alone,a,b,c

The light tenant sends forward_backward calls of one 32-token datum, each waited for
(``.result()``) before the next, and records their latency. The flooding tenant (another
process, another workspace) runs one of the issue's loads meanwhile:

  a  2 runs, each keeping 2 forward_backward calls of 4 datums x 512 tokens in flight
  b  1 run sending one forward_backward of 64k tokens (128 datums x 512) after another
  c  8 runs, each keeping one forward_backward of 256 tokens in flight
  d  two flooding workspaces (--heavy2-key), each running a's load: both of the model's
     batches taken by floods

It prints one JSON line per scenario: the light tenant's p50/p99 (ms), and the flooding
tenant's training tokens per second, from the server's loops_tokens_total{kind="train"}
(less the light tenant's), both while the light tenant was measured and alone over
--flood-seconds before it (the flood's own rate, which the pieces and batching set); and
the light workspace's mean queue wait and latency inflation as the server measured them
(its fairness histograms on /metrics), which separate what the scheduler adds from what the
client and the HTTP path take on a busy machine.
"""

import argparse
import json
import multiprocessing as mp
import os
import re
import time
import urllib.request

import tinker
from tinker import types

BASE_MODEL = "loops/tiny"


def datum(tokens, salt=0):
    ids = [1 + (salt * 7 + i) % 200 for i in range(tokens + 1)]
    return types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * tokens},
    )


SCENARIOS = {
    # runs, calls in flight per run, datums per call, tokens per datum
    "a": (2, 2, 4, 512),
    "b": (1, 1, 128, 512),
    "c": (8, 1, 1, 256),
}
# scenarios run by more than one flooding workspace: the load each runs
MULTI = {"d": ("a", 2)}


def flood(key, scenario, ready, stop, counter):
    """The flooding tenant: keeps its scenario's calls in flight until stop is set."""
    os.environ["TINKER_API_KEY"] = key
    runs, inflight, datums, tokens = SCENARIOS[scenario]
    service = tinker.ServiceClient()
    clients = [service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result() for _ in range(runs)]
    batch = [datum(tokens, salt=i) for i in range(datums)]
    per_call = datums * tokens
    pending = [[c.forward_backward(batch, "cross_entropy") for _ in range(inflight)] for c in clients]
    ready.set()
    while not stop.is_set():
        for i, c in enumerate(clients):
            fut = pending[i].pop(0)
            fut.result()
            with counter.get_lock():
                counter.value += per_call
            pending[i].append(c.forward_backward(batch, "cross_entropy"))
    for futs in pending:
        for f in futs:
            try:
                f.result()
            except Exception:
                pass


def metrics():
    """The server's /metrics text."""
    url = os.environ["TINKER_BASE_URL"].rstrip("/") + "/metrics"
    with urllib.request.urlopen(url, timeout=30) as r:
        return r.read().decode()


def trained_tokens():
    """The server's loops_tokens_total{kind="train"} (every workspace's)."""
    m = re.search(r'^loops_tokens_total\{kind="train"\} (\S+)$', metrics(), re.M)
    return float(m.group(1)) if m else 0.0


def light_server_side():
    """The light workspace's forward_backward queue wait (seconds) and latency inflation
    (time from submission to end over service time), each as (sum, count), from the
    server's fairness histograms: how much of the light tenant's latency the scheduler
    adds, against what its client and the HTTP path take."""
    text = metrics()
    out = {}
    for name in ("loops_queue_wait_seconds", "loops_latency_inflation"):
        vals = []
        for part in ("sum", "count"):
            m = re.search(r'^%s_%s\{kind="forward_backward",workspace="light"\} (\S+)$' % (name, part), text, re.M)
            vals.append(float(m.group(1)) if m else 0.0)
        out[name] = vals
    return out


def mean_between(before, after, name):
    (s0, n0), (s1, n1) = before[name], after[name]
    return (s1 - s0) / (n1 - n0) if n1 > n0 else None


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def measure_light(training, iterations, warmup, max_seconds):
    """The light tenant's latencies: iterations calls after warmup ones, or fewer when
    max_seconds pass first (at least 5)."""
    d = datum(32, salt=99)
    out = []
    deadline = time.monotonic() + max_seconds
    for i in range(warmup + iterations):
        t0 = time.perf_counter()
        training.forward_backward([d], "cross_entropy").result()
        if i >= warmup:
            out.append((time.perf_counter() - t0) * 1e3)
            if len(out) >= 5 and time.monotonic() > deadline:
                break
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--light-key", required=True)
    ap.add_argument("--heavy-key", required=True)
    ap.add_argument("--heavy2-key", default="", help="the second flooding workspace's key (scenario d)")
    ap.add_argument("--scenarios", default="alone,a,b,c")
    ap.add_argument("--iterations", type=int, default=100)
    ap.add_argument("--warmup", type=int, default=5)
    ap.add_argument("--max-seconds", type=float, default=120, help="stop measuring a scenario after this long")
    ap.add_argument("--flood-seconds", type=float, default=20, help="how long the flood runs alone first")
    ap.add_argument("--label", default="")
    args = ap.parse_args()

    os.environ["TINKER_API_KEY"] = args.light_key
    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=BASE_MODEL, rank=8).result()
    for sc in args.scenarios.split(","):
        procs = []
        if sc != "alone":
            ctx = mp.get_context("spawn")
            stop, counter = ctx.Event(), ctx.Value("q", 0)
            load, n = MULTI.get(sc, (sc, 1))
            keys = [args.heavy_key, args.heavy2_key][:n]
            if not all(keys):
                raise SystemExit(f"scenario {sc} needs {n} flooding keys (--heavy2-key)")
            for key in keys:
                ready = ctx.Event()
                proc = ctx.Process(target=flood, args=(key, load, ready, stop, counter))
                proc.start()
                if not ready.wait(300):
                    raise SystemExit("a flooding tenant did not start")
                procs.append(proc)
            time.sleep(2)  # its calls are queued and running
            a0, ta = trained_tokens(), time.perf_counter()
            time.sleep(args.flood_seconds)
            alone_tps = (trained_tokens() - a0) / (time.perf_counter() - ta)
        start_tokens = trained_tokens()
        server0 = light_server_side()
        t0 = time.perf_counter()
        lat = measure_light(training, args.iterations, args.warmup, args.max_seconds)
        elapsed = time.perf_counter() - t0
        server1 = light_server_side()
        wait = mean_between(server0, server1, "loops_queue_wait_seconds")
        inflation = mean_between(server0, server1, "loops_latency_inflation")
        heavy_tps = None
        if procs:
            light_tokens = 32 * (len(lat) + args.warmup)
            heavy_tps = (trained_tokens() - start_tokens - light_tokens) / elapsed
            stop.set()
            for proc in procs:
                proc.join(600)
        print(json.dumps({
            "label": args.label, "scenario": sc, "light_p50_ms": round(pct(lat, 0.5), 1),
            "light_p99_ms": round(pct(lat, 0.99), 1), "light_n": len(lat),
            "flood_tokens_per_s": None if heavy_tps is None else round(heavy_tps, 1),
            "flood_alone_tokens_per_s": None if not procs else round(alone_tps, 1),
            "light_server_wait_ms": None if wait is None else round(wait * 1e3, 2),
            "light_server_inflation": None if inflation is None else round(inflation, 2),
            "load_avg": os.getloadavg()[0],
        }), flush=True)


if __name__ == "__main__":
    main()
