"""One torch-worker training step (loops_worker.engine: Engine.forward_backward, cross-entropy
on one sequence, LoRA rank 16 on every target) of --tokens tokens, printing its time and the
process's peak resident memory as JSON: the torch half of bench/longctx (run.py runs it once
per length and setting, each in its own process).

--mode plain: no activation checkpointing, the whole sequence's logits at once (the worker
with --checkpoint-tokens 0 and an unbounded --logits-budget); --mode long: the worker's
defaults (checkpointing from DEFAULT_CHECKPOINT_TOKENS tokens, logits in chunks)."""

import argparse
import json
import resource
import time


def rss_mib(key: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no {key} in /proc/self/status")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--model", required=True)
    p.add_argument("--tokens", type=int, required=True)
    p.add_argument("--mode", choices=["plain", "long"], required=True)
    p.add_argument("--threads", type=int, default=2)
    a = p.parse_args()
    import torch

    torch.set_num_threads(a.threads)
    from loops_worker.engine import BaseModel, Engine
    from loops_worker.proto import bpb, tpb

    kw = dict(checkpoint_tokens=0, logits_budget=1 << 62) if a.mode == "plain" else {}
    bm = BaseModel("m", a.model, torch.device("cpu"), torch.float32, 64, **kw)
    eng = Engine({"m": bm}, ["m"])
    eng.create_adapter(bpb.CreateAdapterRequest(adapter_id="a", base_model="m", lora=tpb.LoraConfig(
        rank=16, seed=1, train_attn=True, train_mlp=True, train_unembed=True)))
    g = torch.Generator().manual_seed(1)
    ids = [int(x) for x in torch.randint(0, bm.vocab, (a.tokens + 1,), generator=g)]
    d = tpb.Datum(tokens=ids[:-1])
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[a.tokens], int64_data=ids[1:]))
    d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[a.tokens], float32_data=[1.0] * a.tokens))
    req = bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(adapter_id="a", loss_fn="cross_entropy", data=[d])])
    before = rss_mib("VmRSS")
    t0 = time.perf_counter()
    res = eng.forward_backward(req)
    dt = time.perf_counter() - t0
    r = res.results[0]
    if r.HasField("error"):
        raise SystemExit(r.error.message)
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    print(json.dumps({"engine": "torch", "tokens": a.tokens, "checkpoint": a.mode == "long" and bm.checkpoints(a.tokens),
                      "mode": a.mode, "step_s": dt, "peak_rss_mib": peak, "rss_before_mib": before,
                      "loss": r.result.metrics["loss:sum"], "threads": a.threads}))


if __name__ == "__main__":
    main()
