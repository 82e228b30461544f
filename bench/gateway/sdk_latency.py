"""Round-trip latency of small operations through the real tinker SDK.

Run against a server (``loops serve``) with the SDK's environment set::

    VENV=$(scripts/pyenv.sh tinker-0.38.0 tinker==0.38.0 pytest pytest-timeout numpy transformers)
    TINKER_BASE_URL=http://127.0.0.1:8000 TINKER_API_KEY=tml-bench \
        $VENV/bin/python bench/gateway/sdk_latency.py --iterations 200

It times ``forward_backward(...).result()`` and ``optim_step(...).result()`` on one datum of
32 tokens (LoRA rank 8 on ``loops/tiny``), each call waited for before the next, and prints
p50/p99 in milliseconds. The same operations on the backend alone are measured by
``LOOPS_BENCH=1 go test -v -run Overhead ./bench/gateway/``.
"""

import argparse
import json
import statistics
import time

import tinker
from tinker import types


def pct(xs, p):
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(p * len(xs)))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iterations", type=int, default=200)
    ap.add_argument("--tokens", type=int, default=32)
    ap.add_argument("--base-model", default="loops/tiny")
    args = ap.parse_args()

    service = tinker.ServiceClient()
    training = service.create_lora_training_client(base_model=args.base_model, rank=8).result()
    ids = [65 + i % 26 for i in range(args.tokens + 1)]
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(ids[:-1]),
        loss_fn_inputs={"target_tokens": ids[1:], "weights": [1.0] * args.tokens},
    )
    adam = types.AdamParams(learning_rate=1e-4)
    fb, opt = [], []
    for i in range(args.iterations + 10):
        t0 = time.perf_counter()
        training.forward_backward([datum], "cross_entropy").result()
        t1 = time.perf_counter()
        training.optim_step(adam).result()
        t2 = time.perf_counter()
        if i >= 10:
            fb.append((t1 - t0) * 1e3)
            opt.append((t2 - t1) * 1e3)
    out = {
        "iterations": args.iterations,
        "tokens": args.tokens,
        "forward_backward_ms": {"p50": pct(fb, 0.5), "p99": pct(fb, 0.99), "mean": statistics.mean(fb)},
        "optim_step_ms": {"p50": pct(opt, 0.5), "p99": pct(opt, 0.99), "mean": statistics.mean(opt)},
    }
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
