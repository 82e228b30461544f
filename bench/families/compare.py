#!/usr/bin/env python3
"""Per-family cost of a LoRA training step: Loops' torch worker engine against plain
transformers + PEFT doing the same step, side by side in one script (CPU).

For each family of backends/torch/tests/family_models.py (the tiny random models the parity
test builds from a fixed seed) the script starts two subprocesses on the same model folder:

  * loops: ``loops_worker.engine.Engine`` in-process (as tests/test_families.py drives it):
    ``create_adapter`` (rank --rank on the family's targets: attention, MLP/experts, lm_head,
    the Tinker defaults), then per step ``forward_backward`` (cross_entropy over a fixed batch of
    --batch sequences of --seq tokens, as ForwardBackwardRequest protos built once) +
    ``optim_step`` (Adam, lr 1e-4);
  * plain: ``AutoModelForCausalLM.from_pretrained`` (same dtype float32, same attention
    implementation as the worker picks for the family) + ``PeftModel.from_pretrained`` of the
    adapter the loops process saved right after creating it (so the same targets, rank, alpha
    and initial weights, ``is_trainable=True``), then per step ``model(input_ids).logits →
    log_softmax → gather → −(weights·logprobs).sum() → backward()`` and ``torch.optim.AdamW``
    (the worker's Adam: betas 0.9/0.95, eps 1e-12, no weight decay) ``step()`` + ``zero_grad()``.

Both use --threads torch threads. The parent alternates the two processes (round r: loops runs
--steps timed steps, then plain does, for --rounds rounds, after one untimed warm-up step each),
so machine load hits both sides alike. Reported per family: the median step time of each side,
the ratio loops/plain (> 1: Loops is slower), the first step's loss of each side (the check that
they train the same model: equal to float32 rounding), and memory per process:

  * peak RSS: ``ru_maxrss`` of the process (imports, loading and the steps);
  * step peak: the peak RSS during the steps minus the RSS of the loaded model (Linux:
    ``/proc/self/clear_refs`` ← 5 resets VmHWM once the model is loaded, the adapter created
    and the batch built; VmHWM − VmRSS at that point after the steps).

    ~/.cache/loops/venvs/torch-worker/bin/python bench/families/compare.py [--families qwen3,gemma3] [--quick] [--out f.json]

No timed assertions: this is a benchmark, run by hand (README.md has the figures).
"""

import argparse
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TORCH_DIR = os.path.join(REPO, "backends", "torch")
TESTS_DIR = os.path.join(TORCH_DIR, "tests")
# kimi_k2 is deepseek_v3's model under a remote-code config (plain transformers cannot load it
# without the worker's config reader); the VL packagings are the same language models
SKIP = {"kimi_k2"}
LR = 1e-4
BETAS, EPS = (0.9, 0.95), 1e-12


def _rss_kib(field):
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(field + " not in /proc/self/status")


def _tokens(args, vocab):
    import torch

    g = torch.Generator().manual_seed(20261206)
    return torch.randint(3, vocab, (args.batch, args.seq), generator=g).tolist()


def _serve(step, first_loss, loaded_rss):
    """The child's loop: reads commands from stdin, answers one JSON line each."""
    out = sys.stdout
    print(json.dumps({"ready": True, "loss": first_loss}), file=out, flush=True)
    for line in sys.stdin:
        cmd = json.loads(line)
        if cmd["op"] == "run":
            times = []
            for _ in range(cmd["steps"]):
                t = time.perf_counter()
                step()
                times.append(time.perf_counter() - t)
            print(json.dumps({"times": times}), file=out, flush=True)
        elif cmd["op"] == "done":
            print(json.dumps({"peak_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
                              "loaded_rss_mib": loaded_rss / 1024,
                              "step_peak_mib": (_rss_kib("VmHWM") - loaded_rss) / 1024}), file=out, flush=True)
            return


def _reset_hwm():
    """Resets VmHWM to the current RSS; returns the current RSS (KiB)."""
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")
    return _rss_kib("VmRSS")


def child_loops(args):
    sys.path[:0] = [TORCH_DIR]
    import torch

    torch.set_num_threads(args.threads)
    from loops_worker.engine import BaseModel, Engine
    from loops_worker.proto import bpb, tpb

    bm = BaseModel("m", args.model, torch.device("cpu"), torch.float32, 64)
    eng = Engine({"m": bm}, ["m"])
    eng.create_adapter(bpb.CreateAdapterRequest(adapter_id="a", base_model="m", lora=tpb.LoraConfig(
        rank=args.rank, seed=7, train_attn=True, train_mlp=True, train_unembed=True)))
    eng.save_adapter(bpb.SaveAdapterRequest(adapter_id="a", dir=args.adapter))
    data = []
    for toks in _tokens(args, bm.config.vocab_size):
        d = tpb.Datum(tokens=toks)
        n = len(toks)
        d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=toks[1:] + [0]))
        d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[1.0] * (n - 1) + [0.0]))
        data.append(d)
    fb = bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(adapter_id="a", loss_fn="cross_entropy", data=data)])
    opt = bpb.OptimStepRequest(adapter_id="a", adam=tpb.AdamParams(learning_rate=LR, beta1=BETAS[0], beta2=BETAS[1], eps=EPS))
    losses = []

    def step():
        res = eng.forward_backward(fb)
        r = res.results[0]
        if r.WhichOneof("outcome") != "result":
            raise RuntimeError(str(r))
        losses.append(r.result.metrics["loss:sum"])
        eng.optim_step(opt)

    loaded = _reset_hwm()
    step()  # warm-up (untimed); its loss is the first step's
    _serve(step, losses[0], loaded)


def child_plain(args):
    import torch

    torch.set_num_threads(args.threads)
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation=args.attn)
    model = PeftModel.from_pretrained(model, args.adapter, is_trainable=True)
    model.train()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=LR, betas=BETAS, eps=EPS, weight_decay=0.0)
    ids = torch.tensor(_tokens(args, model.config.vocab_size))
    tgt = ids[:, 1:]
    losses = []

    def step():
        logits = model(input_ids=ids).logits[:, :-1]
        lp = torch.log_softmax(logits.float(), -1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
        loss = -lp.sum()
        loss.backward()
        losses.append(float(loss))
        opt.step()
        opt.zero_grad(set_to_none=True)

    loaded = _reset_hwm()
    step()
    _serve(step, losses[0], loaded)


class Child:
    def __init__(self, side, args, model, adapter, attn=""):
        cmd = [sys.executable, os.path.abspath(__file__), "--child", side, "--model", model, "--adapter", adapter,
               "--attn", attn, "--threads", str(args.threads), "--batch", str(args.batch), "--seq", str(args.seq),
               "--rank", str(args.rank)]
        env = dict(os.environ, HF_HUB_OFFLINE="1", TRANSFORMERS_VERBOSITY="error", PYTHONWARNINGS="ignore")
        self.p = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)
        self.side = side

    def recv(self):
        line = self.p.stdout.readline()
        if not line:
            self.p.wait()
            raise RuntimeError(f"{self.side} process exited with {self.p.returncode}")
        return json.loads(line)

    def send(self, **cmd):
        self.p.stdin.write(json.dumps(cmd) + "\n")
        self.p.stdin.flush()
        return self.recv()

    def close(self):
        res = self.send(op="done")
        self.p.stdin.close()
        self.p.wait()
        return res


def run_family(family, d, args):
    from loops_worker import families as fams

    attn = fams.for_config(*fams.load_config(d)).attn_implementation
    adapter = os.path.join(d, "adapter")
    kids = []
    try:
        loops = Child("loops", args, d, adapter)
        kids.append(loops)
        lr = loops.recv()  # the adapter is saved before the plain side reads it
        plain = Child("plain", args, d, adapter, attn)
        kids.append(plain)
        pr = plain.recv()
        times = {"loops": [], "plain": []}
        for _ in range(args.rounds):
            for c in (loops, plain):
                times[c.side] += c.send(op="run", steps=args.steps)["times"]
        mem = {"loops": loops.close(), "plain": plain.close()}
    finally:
        for c in kids:  # a child that is still running reads EOF and exits
            if c.p.poll() is None:
                c.p.stdin.close()
                c.p.wait()
    med = {s: statistics.median(t) for s, t in times.items()}
    return dict(family=family, attn=attn, loss={"loops": lr["loss"], "plain": pr["loss"]}, times=times,
                median_ms={s: v * 1e3 for s, v in med.items()}, ratio=med["loops"] / med["plain"], memory=mem)


def machine():
    flags = ""
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name") and not flags:
                name = line.split(":", 1)[1].strip()
            if line.startswith("flags"):
                flags = line.split(":", 1)[1].split()
                break
    keep = [x for x in flags if x.startswith(("avx", "fma", "amx"))]
    import torch

    return dict(cpu=name, cores=os.cpu_count(), flags=keep, torch=torch.__version__, python=platform.python_version(),
                torch_cpu_capability=torch.backends.cpu.get_cpu_capability())


def uptime():
    return subprocess.run(["uptime"], capture_output=True, text=True).stdout.strip()


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--families", default="", help="comma-separated (default: every family of family_models.CONFIGS)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=64)
    ap.add_argument("--rank", type=int, default=8)
    ap.add_argument("--rounds", type=int, default=3, help="interleaved rounds (loops, plain, loops, plain, ...)")
    ap.add_argument("--steps", type=int, default=3, help="timed steps per side per round")
    ap.add_argument("--quick", action="store_true", help="smoke: qwen3 only, 1 round of 1 step, batch 2 × 16")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument("--child", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--adapter", help=argparse.SUPPRESS)
    ap.add_argument("--attn", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.child:
        return {"loops": child_loops, "plain": child_plain}[args.child](args)
    if args.quick:
        args.families, args.rounds, args.steps, args.batch, args.seq = args.families or "qwen3", 1, 1, 2, 16

    sys.path[:0] = [TESTS_DIR, TORCH_DIR]
    from family_models import CONFIGS, build

    names = args.families.split(",") if args.families else [f for f in CONFIGS if f not in SKIP]
    for f in names:
        if f not in CONFIGS:
            sys.exit(f"unknown family {f!r}; families: {sorted(CONFIGS)}")
    info = dict(machine=machine(), settings={k: getattr(args, k) for k in ("threads", "batch", "seq", "rank", "rounds", "steps")},
                uptime_start=uptime(), results=[])
    print(f"# {info['machine']}\n# {info['settings']}\n# start: {info['uptime_start']}", flush=True)
    hdr = f"{'family':<13} {'loops ms':>9} {'plain ms':>9} {'ratio':>6} {'loops peak':>10} {'plain peak':>10} {'loops Δstep':>11} {'plain Δstep':>11}  loss loops / plain"
    with tempfile.TemporaryDirectory(prefix="famcost-") as tmp:
        print(hdr, flush=True)
        for f in names:
            d = build(f, os.path.join(tmp, f))
            try:
                r = run_family(f, d, args)
            except Exception as e:  # one family's failure does not lose the others' rows
                print(f"{f:<13} failed: {e}", flush=True)
                info["results"].append(dict(family=f, error=str(e)))
                continue
            info["results"].append(r)
            m, mem = r["median_ms"], r["memory"]
            print(f"{f:<13} {m['loops']:>9.1f} {m['plain']:>9.1f} {r['ratio']:>6.2f} "
                  f"{mem['loops']['peak_rss_mib']:>8.0f}Mi {mem['plain']['peak_rss_mib']:>8.0f}Mi "
                  f"{mem['loops']['step_peak_mib']:>9.1f}Mi {mem['plain']['step_peak_mib']:>9.1f}Mi  "
                  f"{r['loss']['loops']:.3f} / {r['loss']['plain']:.3f}", flush=True)
    info["uptime_end"] = uptime()
    print(f"# end: {info['uptime_end']}", flush=True)
    if args.out:
        with open(args.out, "w") as f:
            json.dump(info, f, indent=1)


if __name__ == "__main__":
    main()
