#!/usr/bin/env python3
"""Side-by-side throughput of the Loops reference engine and PyTorch eager on the CPU.

For each model folder (the built-in ``loops/tiny`` and a randomly initialised Qwen3-0.6B-shaped
model that this script writes itself from a fixed seed), it measures, on the SAME folder and the
SAME token ids:

  * forward_backward tokens/s: cross-entropy (summed) over ``--batch`` sequences of ``--seq``
    tokens, LoRA rank 16 (alpha 32) on q,k,v,o,gate,up,down, gradients into the LoRA weights;
  * sampling tokens/s: a ``--prompt``-token prompt, ``--samples`` samples x ``--new`` new tokens,
    temperature 1, KV cache, with the same (zero-initialised) adapter.

The Go side runs ``bench/reference/cmd/fbbench`` (built by this script) as a subprocess; the
PyTorch side runs in a subprocess of this script (transformers ``Qwen3ForCausalLM`` + peft),
so each process's peak RSS (ru_maxrss) is its own. Both use ``--threads`` threads
(``torch.set_num_threads``; ``nn.SetThreads`` with GOMAXPROCS = NumCPU). OPENBLAS_CORETYPE
and OPENBLAS_L2_SIZE are removed from the environment of the PyTorch process only.

    ~/.cache/loops/venvs/tinker-0.38.0-torch/bin/python bench/reference/torch_compare.py

Results are printed as a table and written as JSON (``--out``).
"""

import argparse
import json
import os
import platform
import resource
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Qwen3-0.6B's shape (596M parameters with tied embeddings), random weights.
QWEN3_SHAPE = dict(
    architectures=["Qwen3ForCausalLM"], model_type="qwen3", vocab_size=151936, hidden_size=1024,
    num_hidden_layers=28, num_attention_heads=16, num_key_value_heads=8, head_dim=128,
    intermediate_size=3072, max_position_embeddings=4096, rope_theta=1000000.0,
    rms_norm_eps=1e-6, tie_word_embeddings=True, hidden_act="silu", attention_bias=False,
    attention_dropout=0.0, bos_token_id=151643, eos_token_id=151645, initializer_range=0.02,
)
# A tiny Gemma 3 (text) of loops/tiny's size: vocab 512, hidden 256, 4 layers (three
# sliding-window layers of window 64, shorter than --seq, then a global one), 4 query / 2 KV
# heads of 64, MLP 768, tied embeddings; random weights (float32).
GEMMA3_TINY = dict(
    vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, intermediate_size=768, max_position_embeddings=2048, sliding_window=64,
    layer_types=["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
    query_pre_attn_scalar=64, rms_norm_eps=1e-6, tie_word_embeddings=True, initializer_range=0.02,
)
# A tiny Qwen3-MoE of loops/tiny's attention shape: vocab 512, hidden 256, 4 layers, 4 query /
# 2 KV heads of 64, q/k norms, every layer a MoE block of 8 experts (moe_intermediate_size 192),
# top-2 with norm_topk_prob (Qwen3-30B-A3B's routing); random weights (float32).
QWEN3MOE_TINY = dict(
    vocab_size=512, hidden_size=256, num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
    head_dim=64, intermediate_size=768, moe_intermediate_size=192, num_experts=8, num_experts_per_tok=2,
    norm_topk_prob=True, max_position_embeddings=2048, rms_norm_eps=1e-6, tie_word_embeddings=True,
    initializer_range=0.02,
)
SEED = 20240917
DROP_ENV = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")


def write_random_qwen3(path, layers):
    """Writes config.json + model.safetensors (bf16, HF's own init, torch seed SEED)."""
    marker = os.path.join(path, "loops-bench-version")
    tag = f"qwen3-0.6b-shape seed={SEED} layers={layers} v1"
    if os.path.exists(marker) and open(marker).read().strip() == tag:
        return
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen3Config(**dict(QWEN3_SHAPE, num_hidden_layers=layers))
    model = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True, max_shard_size="20GB")
    with open(marker, "w") as f:
        f.write(tag + "\n")


def write_random_gemma3(path):
    """Writes config.json + model.safetensors of GEMMA3_TINY (float32, HF's init, seed SEED)."""
    marker = os.path.join(path, "loops-bench-version")
    tag = f"gemma3-tiny seed={SEED} v1"
    if os.path.exists(marker) and open(marker).read().strip() == tag:
        return
    import torch
    from transformers import Gemma3ForCausalLM, Gemma3TextConfig

    torch.manual_seed(SEED)
    cfg = Gemma3TextConfig(**GEMMA3_TINY)
    cfg.architectures = ["Gemma3ForCausalLM"]
    model = Gemma3ForCausalLM(cfg)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    with open(marker, "w") as f:
        f.write(tag + "\n")


def write_random_qwen3moe(path):
    """Writes config.json + model.safetensors of QWEN3MOE_TINY (float32, HF's init, seed SEED)."""
    marker = os.path.join(path, "loops-bench-version")
    tag = f"qwen3moe-tiny seed={SEED} v1"
    if os.path.exists(marker) and open(marker).read().strip() == tag:
        return
    import torch
    from transformers import Qwen3MoeConfig, Qwen3MoeForCausalLM

    torch.manual_seed(SEED)
    cfg = Qwen3MoeConfig(**QWEN3MOE_TINY)
    cfg.architectures = ["Qwen3MoeForCausalLM"]
    model = Qwen3MoeForCausalLM(cfg)
    os.makedirs(path, exist_ok=True)
    model.save_pretrained(path, safe_serialization=True)
    with open(marker, "w") as f:
        f.write(tag + "\n")


def peak_rss_mib():
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0  # Linux: KiB


def torch_worker(a):
    import torch

    torch.set_num_threads(a.threads)
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    toks = json.load(open(a.tokens))
    t0 = time.perf_counter()
    model = AutoModelForCausalLM.from_pretrained(a.model, dtype=torch.float32)
    if model.config.model_type == "qwen3_moe":  # the experts through PEFT's target_parameters, as Loops
        targets = dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj"],
                       target_parameters=["gate_up_proj", "down_proj"])
    else:
        targets = dict(target_modules=["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"])
    model = get_peft_model(model, LoraConfig(r=a.rank, lora_alpha=32, lora_dropout=0.0, bias="none", **targets))
    load_s = time.perf_counter() - t0
    res = dict(engine="torch", torch=torch.__version__, threads=torch.get_num_threads(),
               cpu_capability=torch.backends.cpu.get_cpu_capability(),
               attn_implementation=getattr(model.config, "_attn_implementation", None),
               mkldnn=torch.backends.mkldnn.is_available(), mkl=torch.backends.mkl.is_available(),
               load_seconds=load_s, params=sum(p.numel() for p in model.base_model.model.parameters() if not p.requires_grad))
    cfgshow = torch.__config__.show()
    res["blas"] = [l.strip() for l in cfgshow.splitlines()
                   if ("MKL" in l or "oneDNN" in l or "OpenBLAS" in l or "CPU capability" in l) and "Build settings" not in l]
    res["blas"] += [f.strip() for f in cfgshow.split(",") if f.strip().startswith(("BLAS_INFO", "LAPACK_INFO"))]
    modes = a.modes.split(",")
    if "fb" in modes:
        model.train()
        ids = torch.tensor(toks["fb"], dtype=torch.long)
        inp, tgt = ids[:, :-1], ids[:, 1:]
        times, cpu = [], []
        for i in range(a.warmup + a.iters):
            t, c = time.perf_counter(), time.process_time()
            logits = model(input_ids=inp).logits
            lp = torch.log_softmax(logits.float(), dim=-1).gather(-1, tgt.unsqueeze(-1)).squeeze(-1)
            loss = -lp.sum()
            loss.backward()
            d, dc = time.perf_counter() - t, time.process_time() - c
            model.zero_grad(set_to_none=True)
            if i == 0:
                res["fb_loss_sum"] = loss.item()
            del logits, lp, loss
            if i >= a.warmup:
                times.append(d)
                cpu.append(dc)
        res["fb_seconds"] = times
        res["fb_tokens_per_s"] = inp.numel() / sorted(times)[len(times) // 2]
        res["fb_cpu_seconds"] = cpu
        res["fb_tokens_per_cpu_s"] = inp.numel() / sorted(cpu)[len(cpu) // 2]
    if "sample" in modes:
        model.eval()
        prompt = torch.tensor([toks["prompt"]] * a.samples, dtype=torch.long)
        times, cpu = [], []
        torch.manual_seed(1)
        for i in range(a.warmup + a.iters):
            t, c = time.perf_counter(), time.process_time()
            with torch.no_grad():
                out = model.generate(input_ids=prompt, attention_mask=torch.ones_like(prompt), do_sample=True,
                                     temperature=1.0, top_k=0, top_p=1.0, max_new_tokens=a.new,
                                     min_new_tokens=a.new, use_cache=True, pad_token_id=0)
            d, dc = time.perf_counter() - t, time.process_time() - c
            gen = (out.shape[1] - prompt.shape[1]) * out.shape[0]
            if i >= a.warmup:
                times.append(d)
                cpu.append(dc)
        res["sample_seconds"] = times
        res["sample_tokens_per_s"] = gen / sorted(times)[len(times) // 2]
        res["sample_cpu_seconds"] = cpu
        res["sample_tokens_per_cpu_s"] = gen / sorted(cpu)[len(cpu) // 2]
    res["peak_rss_mib"] = peak_rss_mib()
    print(json.dumps(res))


def run_json(cmd, env=None):
    p = subprocess.run(cmd, capture_output=True, text=True, env=env)
    if p.returncode != 0:
        sys.stderr.write(p.stdout + p.stderr)
        raise SystemExit(f"failed: {' '.join(cmd)}")
    return json.loads(p.stdout.strip().splitlines()[-1])


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", default=os.path.expanduser("~/.cache/loops/bench"), help="model folders go here")
    ap.add_argument("--models", default="tiny,qwen3-0.6b-shape", help="tiny, qwen3-0.6b-shape, gemma3-tiny, qwen3moe-tiny")
    ap.add_argument("--layers", type=int, default=28, help="layers of the Qwen3-shaped model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--batch", type=int, default=4)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--prompt", type=int, default=32)
    ap.add_argument("--new", type=int, default=64)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--iters", type=int, default=0, help="timed iterations (0: 5 tiny, 2 large)")
    ap.add_argument("--warmup", type=int, default=1)
    ap.add_argument("--modes", default="fb,sample")
    ap.add_argument("--engines", default="go,torch")
    ap.add_argument("--go-bin", default="", help="prebuilt fbbench binary (default: go build it)")
    ap.add_argument("--out", default="", help="write the results as JSON here")
    ap.add_argument("--torch-worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model", help=argparse.SUPPRESS)
    ap.add_argument("--tokens", help=argparse.SUPPRESS)
    a = ap.parse_args()
    if a.torch_worker:
        return torch_worker(a)

    os.makedirs(a.workdir, exist_ok=True)
    gobin = a.go_bin
    if not gobin:
        gobin = os.path.join(a.workdir, "fbbench")
        subprocess.run(["go", "build", "-o", gobin, "./bench/reference/cmd/fbbench"], cwd=REPO, check=True)
    import random

    results = []
    for name in a.models.split(","):
        if name == "tiny":
            path = os.path.join(a.workdir, "loops-tiny")
            subprocess.run([gobin, "-write-tiny", path], check=True)
        elif name == "gemma3-tiny":
            path = os.path.join(a.workdir, "gemma3-tiny-random")
            write_random_gemma3(path)
        elif name == "qwen3moe-tiny":
            path = os.path.join(a.workdir, "qwen3moe-tiny-random")
            write_random_qwen3moe(path)
        else:
            path = os.path.join(a.workdir, f"qwen3-0.6b-shape-random-{a.layers}l")
            write_random_qwen3(path, a.layers)
        vocab = json.load(open(os.path.join(path, "config.json")))["vocab_size"]
        rng = random.Random(SEED)
        toks = {"fb": [[rng.randrange(vocab) for _ in range(a.seq + 1)] for _ in range(a.batch)],
                "prompt": [rng.randrange(vocab) for _ in range(a.prompt)]}
        tokfile = os.path.join(a.workdir, f"tokens-{name}.json")
        json.dump(toks, open(tokfile, "w"))
        iters = a.iters or (5 if name == "tiny" else 2)
        row = {"model": name, "path": path}
        common = dict(threads=a.threads, iters=iters, warmup=a.warmup)
        if "go" in a.engines:
            cmd = [gobin, "-model", path, "-tokens", tokfile, "-json", "-threads", str(a.threads),
                   "-samples", str(a.samples), "-new", str(a.new), "-rank", str(a.rank),
                   "-iters", str(iters), "-warmup", str(a.warmup), "-modes", a.modes]
            print(f"[{name}] go: {' '.join(cmd)}", file=sys.stderr, flush=True)
            row["go"] = run_json(cmd)
        if "torch" in a.engines:
            env = {k: v for k, v in os.environ.items() if k not in DROP_ENV}
            cmd = [sys.executable, os.path.abspath(__file__), "--torch-worker", "--model", path, "--tokens", tokfile,
                   "--threads", str(a.threads), "--samples", str(a.samples), "--new", str(a.new),
                   "--rank", str(a.rank), "--iters", str(iters), "--warmup", str(a.warmup), "--modes", a.modes]
            print(f"[{name}] torch: {' '.join(cmd)}", file=sys.stderr, flush=True)
            row["torch"] = run_json(cmd, env=env)
        results.append(row)

    report = {"machine": {"cpu": cpu_name(), "nproc": os.cpu_count(), "platform": platform.platform()},
              "dropped_env_for_torch": {k: os.environ[k] for k in DROP_ENV if k in os.environ},
              "args": vars(a), "results": results}
    print_table(results)
    if a.out:
        json.dump(report, open(a.out, "w"), indent=2)


def cpu_name():
    try:
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor()


def print_table(results):
    print(f"{'model':<18} {'measure':<22} {'loops':>10} {'torch':>10} {'loops/torch':>12}")
    for r in results:
        g, t = r.get("go", {}), r.get("torch", {})
        for key, label in (("fb_tokens_per_s", "forward_backward tok/s"), ("fb_tokens_per_cpu_s", "fb tok/CPU-s"),
                           ("sample_tokens_per_s", "sample tok/s"), ("sample_tokens_per_cpu_s", "sample tok/CPU-s"),
                           ("peak_rss_mib", "peak RSS MiB")):
            gv, tv = g.get(key), t.get(key)
            ratio = f"{gv / tv:.2f}" if gv and tv else "-"
            fmt = lambda v: f"{v:.1f}" if v else "-"
            print(f"{r['model']:<18} {label:<22} {fmt(gv):>10} {fmt(tv):>10} {ratio:>12}")
        if g.get("fb_roofline_share"):
            share = f"{100 * g['fb_roofline_share']:.0f}%"
            print(f"{r['model']:<18} {'fb roofline (loops)':<22} {share:>10} {'-':>10} {'-':>12}"
                  f"   ({g['fb_flops_per_token'] / 1e9:.3f} GFLOP/token, kernel {g['kernel_gflops']:.1f} GFLOP/s)")
        if g.get("fb_loss_sum") and t.get("fb_loss_sum"):
            print(f"{r['model']:<18} {'loss sum (check)':<22} {g['fb_loss_sum']:>10.3f} {t['fb_loss_sum']:>10.3f}")


if __name__ == "__main__":
    main()
