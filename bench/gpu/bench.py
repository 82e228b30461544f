#!/usr/bin/env python3
"""GPU benchmark of the Loops worker (one GPU, nothing downloaded; about 6-7 minutes on an H200).

  python bench/gpu/bench.py [--out results.json] [--workdir /tmp/loops-gpu-bench]
  python bench/gpu/bench.py --dry-run   # CPU smoke run of everything but vLLM (tiny model,
                                        # transformers sampler, no raw-vLLM baseline)

Steps:
  1. writes a Qwen3-8B-shaped model with random bf16 weights (seed 0) plus a synthetic
     word-level tokenizer, and a random rank-32 LoRA adapter (all targets, PEFT layout);
  2. raw vLLM baseline (a subprocess, so its GPU memory is freed after): offline
     LLM.generate of the sampling workload with that adapter;
  3. starts the worker (python -m loops_worker --device cuda --sampler vllm) and measures
     through gRPC, as the gateway would call it:
       - LoRA forward_backward tokens/s and MFU (cross_entropy, rank 32, all targets);
       - sampling tokens/s for the same workload with the same adapter (concurrent requests);
       - weight-publish latency: save_weights_for_sampler (SaveAdapter) + first sample with
         the new folder (vLLM hot-loads it; nothing restarts).
MFU = (4·P·T + 6·L·B·S²·h) / (t · peak), P = base parameters of the matmuls (no input
embedding; lm_head included), T = B·S tokens, h = heads·head_dim: forward 2PT + backward
activation gradients 2PT (frozen base weights get no weight gradients), plus causal attention
(forward 2·L·S²·h per sequence, backward twice that). LoRA FLOPs and the recompute of
activation checkpointing are not counted (model FLOPs, not hardware FLOPs); mfu_matmul_only
leaves attention out. Peak: 989 TFLOP/s dense bf16 (H100/H200 SXM), override with
--peak-tflops. vLLM runs with CUDA graphs off by default (both sides)
to stay in the time budget; --cuda-graphs turns them on for both.

  python bench/gpu/bench.py --world-size N [--out results.json]   # N GPUs on one machine
  python bench/gpu/bench.py --world-size 2 --dry-run               # CPU, gloo

--world-size N measures one sharded training replica (the worker with --world-size N:
FSDP2-sharded base, N ranks on cuda:0..N-1, NCCL; docs/scale-out.md): forward_backward
tokens/s and MFU against N × peak, optim_step time, and each rank's peak memory (GPU:
the peak of nvidia-smi's used memory per GPU, polled every 50 ms, so CUDA context and the
caching allocator's reserve included: what must fit; CPU: each rank process's peak resident
set, VmHWM). The training replica's sampling is the transformers sampler over the sharded
base (for correctness, not speed: docs/scale-out.md), so the raw-vLLM, sampling and publish
stages are skipped.

  python bench/gpu/bench.py --tensor-parallel N [--out results.json]   # N GPUs on one machine
  python bench/gpu/bench.py --tensor-parallel 2 --dry-run               # CPU: the script only

--tensor-parallel N measures one sampler replica of N GPUs (the worker with --sampler vllm
--vllm-tensor-parallel-size N: vLLM tensor-parallel over cuda:0..N-1, its mp executor): it
checks that the replica refuses training (no weights in torch), that its greedy tokens with
the adapter equal raw vLLM's (same engine arguments, tensor_parallel_size N), and measures
sampling tokens/s against raw vLLM and each GPU's peak memory. The dry run starts a CPU
worker (the transformers sampler: the flag has no effect there) to check the script.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import os
import subprocess
import sys
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "backends", "torch"))
sys.path.insert(0, os.path.join(ROOT, "gen", "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
os.environ.setdefault("VLLM_NO_USAGE_STATS", "1")  # the GPU machine has no network

QWEN3_8B = dict(vocab_size=151936, hidden_size=4096, intermediate_size=12288, num_hidden_layers=36,
                num_attention_heads=32, num_key_value_heads=8, head_dim=128, max_position_embeddings=40960,
                rope_theta=1000000.0, rms_norm_eps=1e-6, tie_word_embeddings=False, eos_token_id=151645,
                bos_token_id=151643)
# --dry-run: a tiny model of the same family (CPU).
TINY = dict(QWEN3_8B, vocab_size=1024, hidden_size=64, intermediate_size=128, num_attention_heads=4,
            num_key_value_heads=2, head_dim=16, max_position_embeddings=512, eos_token_id=1023, bos_token_id=1022)
RANK = 32
GREEDY_PROMPTS, GREEDY_TOKENS = 4, 16  # the greedy check: worker against raw vLLM


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


def write_model(d: str, c: dict, device: str) -> None:
    import torch
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast, Qwen3Config, Qwen3ForCausalLM

    if os.path.exists(os.path.join(d, "bench-done")):
        return
    os.makedirs(d, exist_ok=True)
    cfg = Qwen3Config(**c)
    cfg.dtype = torch.bfloat16
    torch.manual_seed(0)
    with torch.device(device):
        m = Qwen3ForCausalLM(cfg).to(torch.bfloat16)
    with torch.no_grad():
        for p in m.parameters():
            if p.dim() > 1:
                p.normal_(0, 0.02)
    m.save_pretrained(d, max_shard_size="5GB")
    del m
    if device == "cuda":
        torch.cuda.empty_cache()
    vocab = {f"t{i}": i for i in range(cfg.vocab_size)}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="t0"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, unk_token="t0", eos_token=f"t{cfg.eos_token_id}",
                                   bos_token=f"t{cfg.bos_token_id}", pad_token="t0")
    fast.save_pretrained(d)
    with open(os.path.join(d, "generation_config.json"), "w") as f:
        json.dump({"eos_token_id": cfg.eos_token_id, "bos_token_id": cfg.bos_token_id}, f)
    open(os.path.join(d, "bench-done"), "w").close()


def write_adapter(model_dir: str, d: str, c: dict) -> None:
    """A random rank-32 adapter on every target, in the shared PEFT layout."""
    import torch
    from safetensors.torch import save_file

    from loops_worker.checkpoint import peft_config

    os.makedirs(d, exist_ok=True)
    layers = c["num_hidden_layers"]
    H, I, hd = c["hidden_size"], c["intermediate_size"], c["head_dim"]
    shapes = {"self_attn.q_proj": (H, c["num_attention_heads"] * hd), "self_attn.k_proj": (H, c["num_key_value_heads"] * hd),
              "self_attn.v_proj": (H, c["num_key_value_heads"] * hd), "self_attn.o_proj": (c["num_attention_heads"] * hd, H),
              "mlp.gate_proj": (H, I), "mlp.up_proj": (H, I), "mlp.down_proj": (I, H)}
    g = torch.Generator().manual_seed(1)
    ws = {}
    for i in range(layers):
        for name, (fin, fout) in shapes.items():
            k = f"base_model.model.model.layers.{i}.{name}"
            ws[k + ".lora_A.weight"] = (torch.rand(RANK, fin, generator=g) * 2 - 1) / fin ** 0.5
            ws[k + ".lora_B.weight"] = torch.randn(fout, RANK, generator=g) * 1e-3
    ws["base_model.model.lm_head.lora_A.weight"] = (torch.rand(RANK, H, generator=g) * 2 - 1) / H ** 0.5
    ws["base_model.model.lm_head.lora_B.weight"] = torch.randn(c["vocab_size"], RANK, generator=g) * 1e-3
    save_file(ws, os.path.join(d, "adapter_model.safetensors"), metadata={"format": "pt", "loops.seed": "1"})
    targets = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj", "lm_head"]
    with open(os.path.join(d, "adapter_config.json"), "w") as f:
        json.dump(peft_config(RANK, 32, targets, model_dir), f, indent=2)


def prompts(n: int, length: int, vocab: int, seed: int = 0):
    import random

    r = random.Random(seed)
    lo = min(1000, vocab // 8)  # away from the special ids at both ends
    return [[r.randrange(lo, vocab - lo) for _ in range(length)] for _ in range(n)]


def raw_vllm(args) -> None:
    """Subprocess: raw vLLM offline throughput on the sampling workload."""
    from vllm import LLM, SamplingParams
    from vllm.lora.request import LoRARequest

    t0 = time.time()
    # The engine arguments VLLMSampler uses (backends/torch/loops_worker/vllm_sampler.py).
    tp = {"tensor_parallel_size": args.tensor_parallel, "distributed_executor_backend": "mp"} if args.tensor_parallel > 1 else {}
    llm = LLM(model=args.model_dir, tokenizer=args.model_dir, enable_lora=True, max_lora_rank=RANK, max_loras=8,
              max_cpu_loras=64, dtype="bfloat16", gpu_memory_utilization=args.vllm_mem,
              max_model_len=args.max_model_len, enforce_eager=not args.cuda_graphs, enable_prefix_caching=True,
              logprobs_mode="processed_logprobs", max_logprobs=1024, **tp)
    start = time.time() - t0
    lora = LoRARequest("bench", 1, args.adapter_dir)
    ps = [{"prompt_token_ids": p} for p in prompts(args.prompts, args.prompt_len, QWEN3_8B["vocab_size"])]
    # As the worker sends it, except ignore_eos (random weights rarely sample EOS anyway).
    sp = SamplingParams(n=args.samples, max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0,
                        logprobs=0, ignore_eos=True, detokenize=False, skip_special_tokens=False,
                        include_stop_str_in_output=True)
    llm.generate(ps[:2], sp, lora_request=lora, use_tqdm=False)  # warm-up (loads the adapter)
    t1 = time.time()
    outs = llm.generate(ps, sp, lora_request=lora, use_tqdm=False)
    dt = time.time() - t1
    n = sum(len(o.token_ids) for out in outs for o in out.outputs)
    # greedy tokens of the first prompts, for the worker's check (same engine arguments)
    greedy = llm.generate(ps[:GREEDY_PROMPTS], SamplingParams(n=1, max_tokens=GREEDY_TOKENS, temperature=0.0, detokenize=False,
                                                               skip_special_tokens=False), lora_request=lora, use_tqdm=False)
    print("RAW_VLLM_RESULT " + json.dumps({"tokens": n, "seconds": dt, "tokens_per_s": n / dt, "startup_s": start,
                                           "greedy": [list(o.outputs[0].token_ids) for o in greedy]}), flush=True)


class PeakMemory:
    """Each rank's peak memory while it runs (module doc): GPU via nvidia-smi, polled; CPU via
    the rank processes' VmHWM (the worker is rank 0, its children the other ranks)."""

    def __init__(self, proc, gpu: bool, world: int):
        self.proc, self.gpu, self.world = proc, gpu, world
        self.peak = [0] * world
        self.stop = threading.Event()
        if gpu:
            threading.Thread(target=self._poll, daemon=True).start()

    def _poll(self) -> None:
        while not self.stop.wait(0.05):
            out = subprocess.run(["nvidia-smi", "--query-gpu=index,memory.used", "--format=csv,noheader,nounits"],
                                 capture_output=True, text=True).stdout
            for line in out.splitlines():
                i, used = (int(x) for x in line.split(","))
                if i < self.world:
                    self.peak[i] = max(self.peak[i], used << 20)

    def result(self) -> dict:
        self.stop.set()
        if not self.gpu:
            pids = [self.proc.pid]
            try:
                with open(f"/proc/{self.proc.pid}/task/{self.proc.pid}/children") as f:
                    pids += [int(x) for x in f.read().split()]
            except OSError:
                pass
            for r, pid in enumerate(pids[: self.world]):
                with open(f"/proc/{pid}/status") as f:
                    for line in f:
                        if line.startswith("VmHWM:"):
                            self.peak[r] = int(line.split()[1]) << 10
        kind = "gpu_used_bytes (nvidia-smi)" if self.gpu else "rss_peak_bytes (VmHWM)"
        return {"kind": kind, "per_rank": self.peak, "max_gib": round(max(self.peak) / 2**30, 2)}


def start_worker(args, certs_dir):
    """Starts the worker with test credentials (loops_worker.testcerts: the worker serves
    mutual TLS only) and the work folder allowed."""
    from loops_worker import testcerts

    env = dict(os.environ, PYTHONPATH=os.pathsep.join([os.path.join(ROOT, "backends", "torch"), os.path.join(ROOT, "gen", "python")]))
    common = [*testcerts.worker_args(certs_dir), "--allow-dir", os.path.abspath(args.workdir)]
    if args.dry_run:
        cmd = [sys.executable, "-m", "loops_worker", "--listen", "127.0.0.1:0", "--device", "cpu", "--sampler", "transformers",
               "--model", f"{BASE}={args.model_dir}", "--max-lora-rank", str(RANK), *common]
    elif args.world_size > 1:
        cmd = [sys.executable, "-m", "loops_worker", "--listen", "127.0.0.1:0", "--device", "cuda",
               "--model", f"{BASE}={args.model_dir}", "--max-lora-rank", str(RANK), *common]

    else:
        cmd = [sys.executable, "-m", "loops_worker", "--listen", "127.0.0.1:0", "--device", "cuda", "--sampler", "vllm",
               "--model", f"{BASE}={args.model_dir}", "--max-lora-rank", str(RANK), *common,
               "--vllm-gpu-memory-utilization", str(args.vllm_mem), "--vllm-max-model-len", str(args.max_model_len)]
        if not args.cuda_graphs:
            cmd.append("--vllm-enforce-eager")
    if args.world_size > 1:
        cmd += ["--world-size", str(args.world_size)]
    if args.tensor_parallel > 1:
        cmd += ["--vllm-tensor-parallel-size", str(args.tensor_parallel)]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, text=True)
    t0 = time.time()
    for line in p.stdout:
        if line.startswith("LOOPS_WORKER_LISTENING "):
            log(f"worker ready in {time.time() - t0:.1f}s")
            # Keep reading stdout (to stderr), so a full pipe never blocks the worker.
            threading.Thread(target=lambda: [sys.stderr.write(ln) for ln in p.stdout], daemon=True).start()
            return p, line.split()[1], time.time() - t0
        sys.stderr.write(line)
    raise RuntimeError(f"worker exited with {p.wait()}")


BASE = "bench/qwen3-8b-random"


def sample_replica(args, res, sa, tr, c, mem) -> None:
    """--tensor-parallel N: a sampler replica (vLLM tensor-parallel over N GPUs). Checks that
    it refuses training (it holds no weights in torch) and that its greedy tokens with the
    adapter equal raw vLLM's with the same engine arguments, then measures sampling tokens/s
    (concurrent requests, the workload of the 1-GPU run) and each GPU's peak memory."""
    import grpc

    from loops_worker.proto import bpb, tpb

    ps = prompts(args.prompts, args.prompt_len, c["vocab_size"])
    try:
        tr.CreateAdapter(bpb.CreateAdapterRequest(adapter_id="x", base_model=BASE, lora=tpb.LoraConfig(rank=8, train_attn=True)))
        res["refuses_training"] = False
    except grpc.RpcError as e:
        res["refuses_training"] = e.code() == grpc.StatusCode.FAILED_PRECONDITION
    greedy = []
    for p in ps[:GREEDY_PROMPTS]:
        r = sa.Sample(bpb.SampleRequest(base_model=BASE, adapter_dir=args.adapter_dir, prompt=p, num_samples=1,
                                        params=tpb.SamplingParams(max_tokens=GREEDY_TOKENS, temperature=0.0)))
        greedy.append(list(r.result.sequences[0].tokens))
    res["greedy_tokens"] = greedy
    if "raw_vllm" in res:
        res["greedy_equals_raw_vllm"] = greedy == res["raw_vllm"].get("greedy")
    log(f"refuses training: {res['refuses_training']}; greedy equals raw vLLM: {res.get('greedy_equals_raw_vllm')}")

    def one(p):
        return sa.Sample(bpb.SampleRequest(base_model=BASE, adapter_dir=args.adapter_dir, prompt=p, num_samples=args.samples,
                                           params=tpb.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0)))

    one(ps[0])  # warm-up
    t = time.time()
    with cf.ThreadPoolExecutor(max_workers=len(ps)) as ex:
        outs = list(ex.map(one, ps))
    dt = time.time() - t
    n = sum(len(s.tokens) for o in outs for s in o.result.sequences)
    res["sampling_worker"] = {"tokens": n, "seconds": dt, "tokens_per_s": n / dt}
    if "raw_vllm" in res:
        res["sampling_worker"]["vs_raw_vllm"] = (n / dt) / res["raw_vllm"]["tokens_per_s"]
    if mem is not None:
        res["sampling_worker"]["peak_memory"] = mem.result()
    log(f"sampling through the tensor-parallel replica: {res['sampling_worker']}")


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--dry-run", action="store_true", help="CPU smoke run: tiny model, transformers sampler, no vLLM")
    ap.add_argument("--workdir", default="/tmp/loops-gpu-bench")
    ap.add_argument("--out", default="")
    ap.add_argument("--layers", type=int, default=36, help="fewer layers for a quick smoke run")
    ap.add_argument("--fb-batch", type=int, default=8)
    ap.add_argument("--fb-seqlen", type=int, default=2048)
    ap.add_argument("--fb-steps", type=int, default=4)
    ap.add_argument("--prompts", type=int, default=64)
    ap.add_argument("--prompt-len", type=int, default=128)
    ap.add_argument("--samples", type=int, default=4)
    ap.add_argument("--max-tokens", type=int, default=256)
    ap.add_argument("--max-model-len", type=int, default=4096)
    ap.add_argument("--vllm-mem", type=float, default=0.45)
    ap.add_argument("--cuda-graphs", action="store_true")
    ap.add_argument("--peak-tflops", type=float, default=989.0, help="per GPU")
    ap.add_argument("--world-size", type=int, default=1,
                    help="ranks of one sharded training replica (N GPUs; module doc): training only")
    ap.add_argument("--tensor-parallel", type=int, default=1,
                    help="a sampler replica of N GPUs: vLLM tensor-parallel over them (module doc): sampling only")
    ap.add_argument("--skip-raw", action="store_true")
    ap.add_argument("--raw-timeout", type=int, default=300)
    ap.add_argument("--raw-vllm", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--model-dir", default="", help=argparse.SUPPRESS)
    ap.add_argument("--adapter-dir", default="", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.raw_vllm:
        raw_vllm(args)
        return 0
    if args.world_size < 1 or args.tensor_parallel < 1:
        ap.error("--world-size and --tensor-parallel must be at least 1")
    if args.world_size > 1 and args.tensor_parallel > 1:
        ap.error("--world-size (a training replica) and --tensor-parallel (a sampler replica) are two runs")
    gpus = max(args.world_size, args.tensor_parallel)
    if args.world_size > 1:
        args.skip_raw = True  # training only: its sampling is the transformers sampler's (not vLLM's)
    if gpus > 1 and not args.dry_run:
        import torch

        if torch.cuda.device_count() < gpus:
            ap.error(f"{gpus} GPUs needed; this machine shows {torch.cuda.device_count()}")
    if args.dry_run:
        args.skip_raw = True
        if args.workdir == ap.get_default("workdir"):
            args.workdir += "-dry"
        for k, v in dict(layers=2, fb_batch=2, fb_seqlen=32, fb_steps=2, prompts=4, prompt_len=8, samples=2,
                         max_tokens=8).items():
            if getattr(args, k) == ap.get_default(k):
                setattr(args, k, v)
    c = dict(TINY if args.dry_run else QWEN3_8B, num_hidden_layers=args.layers)
    T0 = time.time()
    res: dict = {"model": ("tiny (dry run, CPU)" if args.dry_run else "Qwen3-8B-shaped") + ", random bf16 weights",
                 "layers": args.layers, "rank": RANK, "world_size": args.world_size, "tensor_parallel": args.tensor_parallel}

    def save() -> None:
        if args.out:
            with open(args.out, "w") as f:
                json.dump(res, f, indent=2)

    workdir = os.path.abspath(args.workdir)
    args.model_dir = os.path.join(workdir, f"model-L{c['num_hidden_layers']}-H{c['hidden_size']}-V{c['vocab_size']}")
    args.adapter_dir = os.path.join(workdir, f"adapter-L{c['num_hidden_layers']}-H{c['hidden_size']}-V{c['vocab_size']}")
    log("writing the model")
    write_model(args.model_dir, c, "cpu" if args.dry_run else "cuda")
    write_adapter(args.model_dir, args.adapter_dir, c)
    res["setup_s"] = round(time.time() - T0, 1)
    log(f"model and adapter ready ({res['setup_s']}s)")
    save()

    if not args.skip_raw:
        log("raw vLLM baseline")
        cmd = [sys.executable, __file__, "--raw-vllm", "--model-dir", args.model_dir, "--adapter-dir", args.adapter_dir,
               "--prompts", str(args.prompts), "--prompt-len", str(args.prompt_len), "--samples", str(args.samples),
               "--max-tokens", str(args.max_tokens), "--max-model-len", str(args.max_model_len), "--vllm-mem", str(args.vllm_mem),
               "--tensor-parallel", str(args.tensor_parallel)]
        if args.cuda_graphs:
            cmd.append("--cuda-graphs")
        try:
            out = subprocess.run(cmd, capture_output=True, text=True, timeout=args.raw_timeout)
            stdout, stderr = out.stdout, out.stderr
        except subprocess.TimeoutExpired as e:
            stdout = e.stdout.decode(errors="replace") if isinstance(e.stdout, bytes) else (e.stdout or "")
            stderr = (e.stderr.decode(errors="replace") if isinstance(e.stderr, bytes) else (e.stderr or "")) + \
                f"\n[bench] raw vLLM timed out after {args.raw_timeout}s"
        for line in stdout.splitlines():
            if line.startswith("RAW_VLLM_RESULT "):
                res["raw_vllm"] = json.loads(line.split(" ", 1)[1])
        if "raw_vllm" not in res:
            res["raw_vllm_error"] = (stdout[-1500:] + "\n--- stderr ---\n" + stderr[-4000:])
        log(f"raw vLLM: {res.get('raw_vllm') or res['raw_vllm_error']}")
        save()

    def finish() -> int:
        res["total_s"] = round(time.time() - T0, 1)
        print(json.dumps(res, indent=2))
        save()
        return 0

    from loops_worker import testcerts
    from loops_worker.proto import bgrpc, bpb, tpb

    certs_dir = os.path.join(workdir, "certs")
    certs = testcerts.make(certs_dir)
    proc, addr, res["worker_start_s"] = start_worker(args, certs_dir)
    mem = PeakMemory(proc, not args.dry_run, gpus) if gpus > 1 else None
    save()
    try:
        ch = testcerts.channel(certs, addr, options=[("grpc.max_send_message_length", 1 << 30), ("grpc.max_receive_message_length", 1 << 30)])
        tr, sa = bgrpc.TrainerServiceStub(ch), bgrpc.SamplerServiceStub(ch)
        base = BASE
        if args.tensor_parallel > 1:
            sample_replica(args, res, sa, tr, c, mem)
            return finish()
        # --- forward_backward ---
        tr.LoadAdapter(bpb.LoadAdapterRequest(adapter_id="bench", dir=args.adapter_dir))
        data = []
        for p in prompts(args.fb_batch, args.fb_seqlen, c["vocab_size"], seed=1):
            d = tpb.Datum(tokens=p)
            d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, int64_data=p[1:] + [0]))
            d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, float32_data=[1.0] * len(p)))
            data.append(d)
        req = bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(adapter_id="bench", loss_fn="cross_entropy", data=data)])
        r = tr.ForwardBackward(req)  # warm-up
        assert r.results[0].WhichOneof("outcome") == "result", r.results[0]
        tr.OptimStep(bpb.OptimStepRequest(adapter_id="bench", adam=tpb.AdamParams(learning_rate=1e-5)))
        times = []
        for _ in range(args.fb_steps):
            t = time.time()
            tr.ForwardBackward(req)
            times.append(time.time() - t)
        t = time.time()
        tr.OptimStep(bpb.OptimStepRequest(adapter_id="bench", adam=tpb.AdamParams(learning_rate=1e-5)))
        optim_s = time.time() - t
        toks = args.fb_batch * args.fb_seqlen
        H, I, hd, L = c["hidden_size"], c["intermediate_size"], c["head_dim"], args.layers
        P = L * (H * hd * (c["num_attention_heads"] * 2 + c["num_key_value_heads"] * 2) + 3 * H * I) + H * c["vocab_size"]
        attn = 6 * L * args.fb_batch * args.fb_seqlen ** 2 * c["num_attention_heads"] * hd
        best = min(times)
        peak = args.peak_tflops * 1e12 * args.world_size
        res["forward_backward"] = {"tokens_per_call": toks, "seconds_per_call": times, "tokens_per_s": toks / best,
                                   "mfu": (4 * P * toks + attn) / best / peak, "mfu_matmul_only": 4 * P * toks / best / peak,
                                   "model_flops_per_call": 4 * P * toks + attn, "params_non_embedding": P,
                                   "optim_step_s": optim_s}
        if mem is not None:
            res["forward_backward"]["peak_memory"] = mem.result()
        log(f"forward_backward: {res['forward_backward']}")
        save()
        if args.world_size > 1:
            return finish()
        # --- sampling through the worker ---
        ps = prompts(args.prompts, args.prompt_len, c["vocab_size"])

        def one(p, adapter_dir):
            return sa.Sample(bpb.SampleRequest(base_model=base, adapter_dir=adapter_dir, prompt=p, num_samples=args.samples,
                                               params=tpb.SamplingParams(max_tokens=args.max_tokens, temperature=1.0, top_p=1.0, seed=0)))

        one(ps[0], args.adapter_dir)  # warm-up
        t = time.time()
        with cf.ThreadPoolExecutor(max_workers=len(ps)) as ex:
            outs = list(ex.map(lambda p: one(p, args.adapter_dir), ps))
        dt = time.time() - t
        n = sum(len(s.tokens) for o in outs for s in o.result.sequences)
        res["sampling_worker"] = {"tokens": n, "seconds": dt, "tokens_per_s": n / dt,
                                  "note": "stops at EOS like any request; raw vLLM uses ignore_eos (random weights rarely hit EOS)"}
        if "raw_vllm" in res:
            res["sampling_worker"]["vs_raw_vllm"] = (n / dt) / res["raw_vllm"]["tokens_per_s"]
        log(f"sampling through the worker: {res['sampling_worker']}")
        save()
        # --- weight publish latency ---
        pubs = []
        for i in range(3):
            tr.ForwardBackward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(adapter_id="bench", loss_fn="cross_entropy", data=data[:1])]))
            tr.OptimStep(bpb.OptimStepRequest(adapter_id="bench", adam=tpb.AdamParams(learning_rate=1e-5)))
            d = os.path.join(workdir, f"published-{int(time.time() * 1000)}-{i}")
            t = time.time()
            tr.SaveAdapter(bpb.SaveAdapterRequest(adapter_id="bench", dir=d))
            t_save = time.time() - t
            sa.Sample(bpb.SampleRequest(base_model=base, adapter_dir=d, prompt=ps[0][:16], num_samples=1,
                                        params=tpb.SamplingParams(max_tokens=1, temperature=1.0, top_p=1.0, seed=0)))
            pubs.append({"save_s": t_save, "save_and_first_sample_s": time.time() - t})
        res["weight_publish"] = pubs
        log(f"weight publish: {pubs}")
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
    return finish()


if __name__ == "__main__":
    sys.exit(main())
