"""python -m loops_worker --listen 127.0.0.1:0 --tls-cert F --tls-key F --tls-ca F --model NAME[=PATH] ...

Loads the models, starts the gRPC server (mutual TLS only: it answers only the gateway that
issued its credentials, credentials.py; with grpc.health.v1 beside the worker's services,
NOT_SERVING once it shuts down or its engine breaks, health.py) and prints one line
`LOOPS_WORKER_LISTENING <host:port>` on stdout when it is ready (the Go backend waits for
it). Logs go to stderr. Folders a request names must be inside the --allow-dir folders, and
checkpoint URLs of a --checkpoint-origin (confine.py).

With --world-size N the worker is rank 0 of a replica of N processes (shard.py): it starts
ranks 1..N-1, the frozen base is sharded over them with FSDP2, and it alone serves; every
rank runs each forward pass of a sample (the transformers sampler), rank 0 answers.

With --register URL --pool P --replica N --join-token-file F the worker also registers with
the gateway's RegistryService at URL (https://) and holds its lease with heartbeats
(register.py); it exits when the gateway tells it to drain or refuses it for good.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import sys
import threading


def build(args, local_rank: int | None = None):
    """The engine, sampler, device and dtype of args. On CUDA a rank of a multi-rank replica
    uses visible GPU local_rank (its rank when None: the replica's GPUs all visible to it)."""
    import torch

    from .engine import BaseModel, Engine

    if args.world_size > 1 and args.sampler == "vllm":
        from . import shard

        raise shard.refuse_vllm(args.world_size)
    tp = args.vllm_tensor_parallel_size
    if args.world_size > 1 and tp > 1:
        raise ValueError(f"--vllm-tensor-parallel-size {tp} is for a sampler replica of {tp} GPUs; "
                         f"a training replica of --world-size {args.world_size} samples over its sharded base")
    if args.device == "auto":
        device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    else:
        device = torch.device(args.device)
    sampler_kind = args.sampler
    if sampler_kind == "auto":
        from . import vllm_sampler

        sampler_kind = "vllm" if device.type == "cuda" and args.world_size == 1 and vllm_sampler.available() else "transformers"
    if tp > 1 and sampler_kind != "vllm":
        logging.warning("--vllm-tensor-parallel-size %d has no effect: this worker samples with the transformers "
                        "sampler, on %s", tp, device)
    if device.type == "cuda" and args.world_size > 1 and device.index is None:
        device = torch.device("cuda", args.rank if local_rank is None else local_rank)
    if args.dtype == "auto":
        dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    else:
        dtype = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}[args.dtype]
    if device.type == "cpu" and args.threads > 0:
        torch.set_num_threads(args.threads)
    models, order = {}, []
    for spec in args.model:
        name, _, path = spec.partition("=")
        if name in models:
            continue
        # checkpointing: every training pass on GPU, from --checkpoint-tokens tokens on CPU
        gc = args.grad_checkpointing if args.grad_checkpointing is not None else device.type == "cuda"
        ck = args.checkpoint_tokens if args.grad_checkpointing is not False else 0
        # a tensor-parallel vLLM sampler: vLLM holds the weights; the engine keeps shapes
        models[name] = BaseModel(name, path or None, torch.device("meta") if tp > 1 and sampler_kind == "vllm" else device,
                                 dtype, args.max_lora_rank,
                                 attn_impl=args.attn_implementation, grad_checkpointing=gc,
                                 checkpoint_tokens=ck, logits_budget=args.logits_budget)
        order.append(name)
    engine = Engine(models, order, max_lora_rank=args.max_lora_rank, max_adapters=args.max_adapters,
                    full_runs=args.full_finetune_runs)
    if args.world_size > 1:
        from . import shard

        return engine, None, device, dtype  # rank 0's sampler is shard.sampler(its Leader)
    if sampler_kind == "vllm":
        from .vllm_sampler import VLLMSampler

        sampler = VLLMSampler(engine, gpu_memory_utilization=args.vllm_gpu_memory_utilization,
                              max_loras=args.vllm_max_loras, enforce_eager=args.vllm_enforce_eager,
                              max_model_len=args.vllm_max_model_len, tensor_parallel_size=tp)
    else:
        from .sampler import HFSampler

        sampler = HFSampler(engine)
    return engine, sampler, device, dtype


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loops_worker", description="Loops GPU/CPU worker (loops.backend.v1 over gRPC)")
    p.add_argument("--listen", default="127.0.0.1:0", help="host:port to listen on (port 0 picks a free port)")
    p.add_argument("--model", action="append", default=[], help="base model to serve: NAME (local folder or HF id in the local cache) or NAME=PATH; repeatable")
    p.add_argument("--device", default="auto", help="auto (cuda if available), cpu, cuda, cuda:N")
    p.add_argument("--dtype", default="auto", choices=["auto", "float32", "bfloat16", "float16"], help="base weights: auto = bf16 on GPU, fp32 on CPU")
    p.add_argument("--sampler", default="auto", choices=["auto", "vllm", "transformers"], help="auto = vLLM on GPU when installed")
    p.add_argument("--max-lora-rank", type=int, default=64)
    p.add_argument("--max-adapters", type=int, default=256)
    p.add_argument("--full-finetune-runs", type=int, default=1,
                   help="full fine-tuning runs (LoRA rank 0) held at once, each with its own copy of the model, "
                        "float32 master weights, gradients and Adam state (0: refused)")
    p.add_argument("--threads", type=int, default=0, help="CPU threads for torch (0 = torch's default)")
    p.add_argument("--attn-implementation", default="auto",
                   help="transformers' attn_implementation; auto = the family's (sdpa, or eager where the family has no sdpa: gpt-oss)")
    p.add_argument("--grad-checkpointing", dest="grad_checkpointing", action="store_true", default=None)
    p.add_argument("--no-grad-checkpointing", dest="grad_checkpointing", action="store_false")
    p.add_argument("--checkpoint-tokens", type=int, default=None,
                   help="a training pass over at least this many tokens recomputes each layer in backward "
                        "(activation checkpointing; default engine.DEFAULT_CHECKPOINT_TOKENS, 4096; "
                        "--grad-checkpointing: every pass, the GPU default; 0: never)")
    p.add_argument("--logits-budget", type=int, default=0,
                   help="elements of logits the loss head computes at a time (0: 2^26 on CPU, 2^28 on GPU)")
    p.add_argument("--vllm-gpu-memory-utilization", type=float, default=0.4)
    p.add_argument("--vllm-max-loras", type=int, default=8)
    p.add_argument("--vllm-max-model-len", type=int, default=0)
    p.add_argument("--vllm-enforce-eager", action="store_true")
    p.add_argument("--vllm-tensor-parallel-size", type=int, default=1,
                   help="a sampler replica of N GPUs: vLLM shards each model over the N GPUs it sees (tensor parallel, "
                        "its mp executor); the worker then keeps no weights in torch and does not train")
    p.add_argument("--world-size", type=int, default=1,
                   help="ranks of this replica (torch.distributed, FSDP2-sharded base; shard.py): this process is rank 0 and starts the others")
    p.add_argument("--rank", type=int, default=0, help=argparse.SUPPRESS)  # set by rank 0 for the ranks it starts
    p.add_argument("--dist-init", default="", help=argparse.SUPPRESS)
    p.add_argument("--grpc-threads", type=int, default=64)
    p.add_argument("--tls-cert", default="", help="the worker's certificate, issued by the gateway (or $LOOPS_WORKER_TLS_CERT, PEM)")
    p.add_argument("--tls-key", default="", help="the worker's private key, a file of mode 0600 (or $LOOPS_WORKER_TLS_KEY, PEM)")
    p.add_argument("--tls-ca", default="", help="the gateway CA's certificate: the only clients answered, the registry trusted (or $LOOPS_WORKER_TLS_CA)")
    p.add_argument("--allow-dir", action="append", default=[], help="folder that requests may name to save adapters into or load and sample them from; repeatable (none: no folder)")
    p.add_argument("--checkpoint-origin", action="append", default=[], help="scheme://host[:port] of the checkpoint store that checkpoint URLs may name; repeatable (none: no URL)")
    p.add_argument("--register", default="", help="gateway registry URL (https://host:port): register and heartbeat there")
    p.add_argument("--pool", default="", help="with --register: the pool this worker is a replica of")
    p.add_argument("--replica", type=int, default=0, help="with --register: the replica index in the pool")
    p.add_argument("--join-token-file", default="", help="with --register: file holding the gateway's join token")
    p.add_argument("--advertise", default="", help="with --register: host the gateway dials (default: the --listen host, or this host's address when listening on all)")
    return p


def main(argv=None) -> int:
    p = parser()
    args = p.parse_args(argv)
    if args.register and (not args.pool or not args.join_token_file):
        p.error("--register needs --pool and --join-token-file")
    if args.register and not args.register.startswith("https://"):
        p.error(f"--register {args.register!r} must be https://host:port (the registry serves TLS only)")
    logging.basicConfig(level=os.environ.get("LOOPS_WORKER_LOG", "INFO"), stream=sys.stderr,
                        format="%(asctime)s loops_worker %(levelname)s %(message)s")
    if not args.model:
        print("loops_worker: at least one --model is required", file=sys.stderr)
        return 2
    from .shard import MAX_WORLD_SIZE

    if not 1 <= args.vllm_tensor_parallel_size <= MAX_WORLD_SIZE:
        print(f"loops_worker: --vllm-tensor-parallel-size {args.vllm_tensor_parallel_size} must be from 1 to {MAX_WORLD_SIZE}",
              file=sys.stderr)
        return 2
    if not 1 <= args.world_size <= MAX_WORLD_SIZE or not 0 <= args.rank < args.world_size:
        print(f"loops_worker: --world-size {args.world_size} must be from 1 to {MAX_WORLD_SIZE} "
              f"(and --rank {args.rank} below it)", file=sys.stderr)
        return 2
    if args.rank > 0:
        return follower(args)
    try:
        creds, confine = security(args)
    except (ValueError, OSError) as e:
        print(f"loops_worker: {e}", file=sys.stderr)
        return 2
    ranks = None
    if args.world_size > 1:
        from . import shard

        args.dist_init = f"tcp://127.0.0.1:{shard.free_port()}"
        ranks = shard.Ranks(sys.argv[1:] if argv is None else list(argv), args.world_size, args.dist_init)
    # The parent (the Go backend) closing our stdin means it is gone: exit then too.
    try:
        engine, sampler, device, dtype = build(args)
        if ranks is not None:
            d = shard.init(0, args.world_size, args.dist_init, device)
            shard.setup(engine, d)
            engine = shard.Leader(engine, d)
            sampler = shard.sampler(engine)
    except Exception as e:  # noqa: BLE001
        print(f"loops_worker: startup failed: {type(e).__name__}: {e}", file=sys.stderr)
        if ranks is not None:
            ranks.stop(timeout=2)
        return 1
    from . import tracing
    from .server import serve

    provider = tracing.setup()
    server = serve(engine, sampler, args.listen, creds, confine, threads=args.grpc_threads)
    host = args.listen.rsplit(":", 1)[0] or "127.0.0.1"
    logging.info("serving %s on %s (%s, %s, sampler %s)", engine.order, f"{host}:{server.bound_port}", device, dtype, sampler.name)
    print(f"LOOPS_WORKER_LISTENING {host}:{server.bound_port}", flush=True)
    done = threading.Event()
    reg = None
    if args.register:
        reg = start_registration(args, engine, server.bound_port, creds)
        threading.Thread(target=lambda: (reg.done.wait(), done.set()), daemon=True).start()
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: done.set())
    if os.environ.get("LOOPS_WORKER_EXIT_ON_STDIN_EOF") == "1":
        def watch():
            try:
                sys.stdin.read()
            finally:
                done.set()
        threading.Thread(target=watch, daemon=True).start()
    done.wait()
    server.health.drain()  # NOT_SERVING from now on: the gateway stops sending work
    if reg is not None:
        reg.stop()
    server.stop(grace=2).wait()
    if ranks is not None:
        engine.close()
        ranks.stop()
    if provider is not None:
        provider.shutdown()  # the spans still buffered
    return 0


def follower(args) -> int:
    """Rank r > 0 of a multi-rank replica (shard.py): loads the models, joins rank 0's
    process group and applies its commands; exits when rank 0 is gone."""
    from . import shard

    shard.exit_with_parent()
    try:
        engine, _, device, _ = build(args)
        d = shard.init(args.rank, args.world_size, args.dist_init, device)
        shard.setup(engine, d)
    except Exception as e:  # noqa: BLE001
        print(f"loops_worker: rank {args.rank} startup failed: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    logging.info("rank %d of %d following (%s)", args.rank, args.world_size, device)
    return shard.follow(engine, d)


def security(args):
    """The worker's credentials (credentials.from_args) and what its requests may name."""
    from . import credentials
    from .confine import Confinement

    return credentials.from_args(args), Confinement(args.allow_dir, args.checkpoint_origin)


def advertise_host(listen: str, advertise: str = "") -> str:
    """The host the gateway dials: --advertise, else the --listen host, else (listening on
    all interfaces) this host's address."""
    if advertise:
        return advertise
    host = listen.rsplit(":", 1)[0].strip("[]")
    if host and host not in ("0.0.0.0", "::"):
        return host
    import socket

    try:
        return socket.gethostbyname(socket.gethostname())
    except OSError:
        return "127.0.0.1"


def start_registration(args, engine, port: int, creds, gpus: int | None = None):
    """Registers the serving worker (register.Registration) and returns it."""
    from .register import Registration, read_token

    host = advertise_host(args.listen, args.advertise)
    addr = f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
    if gpus is None:
        cvd = os.environ.get("CUDA_VISIBLE_DEVICES", "")
        gpus = len([g for g in cvd.split(",") if g.strip()])
    return Registration(args.register, args.pool, args.replica, addr, read_token(args.join_token_file), creds,
                        capabilities=engine.capabilities(), gpus=gpus).start()


if __name__ == "__main__":
    sys.exit(main())
