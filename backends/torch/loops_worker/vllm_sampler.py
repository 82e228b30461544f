"""Sampling with vLLM (GPU), LoRA adapters hot-loaded per request.

Each adapter folder is an immutable snapshot, so it gets one LoRARequest id for its path
(plus size and mtime of its weights file); publishing new sampler weights is just saving a
new folder and naming it in the next request; the engine is never restarted. Concurrent
Sample calls go to one AsyncLLM engine, which batches them.

Semantics differences from the reference engine, by design of vLLM: sampling randomness is
vLLM's (the same seed still gives the same output), and log-probs are vLLM's
"processed_logprobs" (after temperature, top-k and top-p), which is the distribution that
was actually sampled. Prompt log-probs are at temperature 1. vLLM accepts temperatures up to
2 only (higher is refused) and raises 0 < T < 0.01 to 0.01; greedy requests (T = 0) with
num_samples > 1 are run once and repeated (vLLM refuses n > 1 when greedy). An adapter whose
unembedding LoRA adapts the shared matrix of a model with tied embeddings (ensure_weight_tying:
the input embedding too) is refused: vLLM's LoRA adapts the head's logits only.

A sampler replica of N GPUs runs vLLM with tensor_parallel_size N (engine_args); the
worker then keeps the base models' shapes only (the meta device: no weights in torch), as
it samples with vLLM and does not train.

API as of vLLM 0.33.0 (the pinned version): AsyncLLM.generate is an async generator;
n > 1 must use RequestOutputKind.FINAL_ONLY, otherwise each streamed RequestOutput carries
only the child sequence that just advanced (and the last one only the last to finish).
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import threading
import uuid
from typing import Dict

from . import full
from .errors import FAILED_PRECONDITION, INTERNAL, UNAVAILABLE, WorkerError, invalid
from .adjust import vllm_kwargs
from .sampler import adapter_cache_key, build_result, validate

# vLLM logs to stdout by default, where the worker announces itself (LOOPS_WORKER_LISTENING)
# and which a caller may stop reading after that line; send vLLM's logs (this process and the
# engine-core processes it starts, which inherit the environment) to stderr. Set before vLLM is
# first imported (available() imports it).
os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
MAX_VLLM_TEMPERATURE = 2.0


def available() -> bool:
    try:
        import vllm  # noqa: F401
    except Exception:  # noqa: BLE001
        return False
    return True


class VLLMSampler:
    name = "vllm"

    def __init__(self, engine, gpu_memory_utilization: float = 0.4, max_loras: int = 8,
                 max_cpu_loras: int = 64, max_model_len: int = 0, enforce_eager: bool = False,
                 tensor_parallel_size: int = 1):
        os.environ.setdefault("VLLM_WORKER_MULTIPROC_METHOD", "spawn")
        from vllm import SamplingParams  # noqa: F401
        from vllm.engine.arg_utils import AsyncEngineArgs
        from vllm.v1.engine.async_llm import AsyncLLM

        self.engine = engine
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="vllm-loop", daemon=True)
        self.thread.start()
        self.llms: Dict[str, object] = {}
        self.lora_ids: Dict[str, int] = {}
        self.lora_added: Dict[str, set] = {}
        self.next_id = itertools.count(1)
        self.mu = threading.Lock()
        for name in engine.order:
            bm = engine.models[name]
            args = AsyncEngineArgs(**engine_args(bm, engine.max_lora_rank, gpu_memory_utilization, max_loras, max_cpu_loras,
                                                 max_model_len, enforce_eager, tensor_parallel_size))
            fut = asyncio.run_coroutine_threadsafe(_make(AsyncLLM, args), self.loop)
            self.llms[name] = fut.result()

    def _lora(self, bm, dir_: str):
        from vllm.lora.request import LoRARequest

        if full.is_full_dir(dir_):
            raise invalid(f"{dir_} is a full fine-tuning checkpoint (a whole model); the vLLM sampler serves LoRA "
                          f"adapters on its base only: sample it on a worker started with --sampler transformers")
        key = adapter_cache_key(bm, dir_)
        with self.mu:
            if key not in self.lora_ids:
                self.lora_ids[key] = next(self.next_id)
            lid = self.lora_ids[key]
        return LoRARequest(lora_name=f"loops-{lid}", lora_int_id=lid, lora_path=dir_)

    def sample(self, req):
        from vllm import SamplingParams
        from vllm.exceptions import VLLMValidationError
        from vllm.sampling_params import RequestOutputKind

        if req.embed:
            raise WorkerError(FAILED_PRECONDITION, "the vLLM sampler does not compute embeddings (the torch worker's "
                              "transformers sampler and the reference engine do): serve the model without vLLM to embed")
        bm = self.engine.model(req.base_model)
        if len(req.prompt_images) > 0:
            raise WorkerError(FAILED_PRECONDITION, "image chunks are not served by the vLLM sampler yet; start the worker without vLLM "
                          "(the transformers sampler serves them)")
        s = validate(req, bm)
        if s.targets is not None or s.alt_k > 0:
            raise WorkerError(FAILED_PRECONDITION, "the vLLM sampler does not compute target_prompt_logprobs or "
                              "prompt_alt_tokens (the transformers sampler does): ask without them")
        if s.temperature > MAX_VLLM_TEMPERATURE:
            raise invalid(f"temperature must be at most {MAX_VLLM_TEMPERATURE:g} with the vLLM sampler, got {s.temperature:g}")
        lora = self._lora(bm, req.adapter_dir) if req.adapter_dir else None
        want_prompt = s.prompt_logprobs or s.topk > 0
        greedy = s.temperature == 0
        # vLLM gives child i of an n > 1 request the seed seed + i; keep that within 64 bits.
        seed = s.seed % (1 << 63) if s.seed is not None else None
        try:
            sp = SamplingParams(
                n=1 if greedy else s.n, max_tokens=s.max_tokens, temperature=s.temperature,
                top_k=s.top_k if s.top_k > 0 else 0, top_p=s.top_p, seed=seed,
                stop=s.stop_strings or None, stop_token_ids=s.stop_tokens or None,
                include_stop_str_in_output=True, skip_special_tokens=False, logprobs=0,
                prompt_logprobs=(max(s.topk, 0) if want_prompt else None),
                detokenize=bool(s.stop_strings), output_kind=RequestOutputKind.FINAL_ONLY,
                **vllm_kwargs(s, _structured_outputs_cls() if s.response_format else None))
        except VLLMValidationError as e:
            raise invalid(f"vLLM refused the sampling parameters: {e}")
        llm = self.llms[bm.name]
        if lora is not None and lora.lora_int_id not in self.lora_added.setdefault(bm.name, set()):
            # Check a new folder as the trainer would load it (config, headers, names, shapes,
            # rank limit) before vLLM allocates anything for it.
            plan = self.engine.check_adapter_dir(req.adapter_dir, bm, False)
            if plan.tied and bm.tied and any(k.endswith(".lm_head") for k in plan.keys):
                # vLLM applies a LoRA to the head's logits only; this adapter's head LoRA also
                # adapts the tied input embedding, which vLLM would leave out: refuse rather
                # than sample from a different model.
                raise WorkerError(FAILED_PRECONDITION, "the vLLM sampler cannot apply this adapter: it trains the "
                                  "unembedding of a model with tied embeddings, which adapts the shared embedding "
                                  "matrix (the input embedding too, ensure_weight_tying), and vLLM's LoRA adapts the "
                                  "head only; sample it with the transformers sampler (serve without vLLM), or train "
                                  "with train_unembed off")
            # Load a new adapter folder with add_lora first: a folder vLLM cannot load then fails
            # this request only (a load failing inside a batch step would kill the engine core).
            try:
                asyncio.run_coroutine_threadsafe(llm.add_lora(lora), self.loop).result()
            except Exception as e:  # noqa: BLE001
                _exit_if_engine_dead(e)
                raise invalid(f"vLLM cannot load the adapter in {req.adapter_dir}: {e}")
            self.lora_added[bm.name].add(lora.lora_int_id)
        fut = asyncio.run_coroutine_threadsafe(
            _generate(llm, {"prompt_token_ids": s.prompt, "cache_salt": cache_salt(req.workspace)}, sp, lora), self.loop)
        try:
            out = fut.result()
        except VLLMValidationError as e:
            raise invalid(f"vLLM refused the request: {e}")
        except Exception as e:  # noqa: BLE001
            _exit_if_engine_dead(e)
            cause = e.__cause__ or e.__context__
            raise WorkerError(INTERNAL, f"vLLM sampling failed: {type(e).__name__}: {e}"
                              + (f" (caused by {type(cause).__name__}: {cause})" if cause is not None else ""))
        if out is None or not out.outputs:
            raise WorkerError(INTERNAL, "vLLM sampling returned no output")
        outs = sorted(out.outputs, key=lambda o: o.index)
        if greedy:
            outs = outs[:1] * s.n
        bad = [o.finish_reason for o in outs if o.finish_reason in ("abort", "error")]
        if bad or len(outs) != s.n:
            raise WorkerError(INTERNAL, f"vLLM sampling failed: {len(outs)} of {s.n} sequences, finish reasons {[o.finish_reason for o in outs]}")
        stops = set(s.stop_tokens) | set(s.eos)
        seqs = []
        for o in outs:
            toks = list(o.token_ids)
            lps = []
            for t, d in zip(toks, o.logprobs or []):
                lp = d.get(t) if d else None
                lps.append(float(lp.logprob) if lp is not None else float("nan"))
            stopped = o.finish_reason == "stop" or (toks and toks[-1] in stops)
            seqs.append((toks, lps, bool(stopped)))
        plp, topk = None, None
        if want_prompt and out.prompt_logprobs is not None:
            plp = [float("nan")]
            topk = [[]]
            for r, d in enumerate(out.prompt_logprobs[1:], start=1):
                t = s.prompt[r]
                plp.append(float(d[t].logprob) if d and t in d else float("nan"))
                row = []
                if d:
                    ranked = sorted(((v.rank or math.inf, tid, v.logprob) for tid, v in d.items()), key=lambda x: (x[0], x[1]))
                    row = [(tid, lp) for rank, tid, lp in ranked if rank <= s.topk][: s.topk]
                topk.append(row)
        resp = build_result(seqs, plp, topk, s)
        resp.result.prompt_cached_tokens = cached_tokens(out, len(s.prompt))
        return resp


def engine_args(bm, max_lora_rank: int, gpu_memory_utilization: float, max_loras: int, max_cpu_loras: int,
                max_model_len: int, enforce_eager: bool, tensor_parallel_size: int = 1) -> dict:
    """vLLM's engine arguments (AsyncEngineArgs) for base model bm. With tensor_parallel_size
    N > 1 (a sampler replica of N GPUs) vLLM shards the model over the N GPUs this process
    sees (CUDA_VISIBLE_DEVICES: the local provider's replica GPUs, or the Ray actor's) with
    its multiprocessing executor: it starts one worker process per GPU. "mp" is named, not
    left to vLLM: inside a Ray actor vLLM would otherwise pick its Ray executor, whose engine
    core process does not see the actor's placement group (vLLM issue 30016)."""
    kw = dict(model=bm.dir, tokenizer=bm.dir, enable_lora=True, max_lora_rank=_vllm_rank(max_lora_rank),
              max_loras=max_loras, max_cpu_loras=max(max_cpu_loras, max_loras), dtype="bfloat16",
              gpu_memory_utilization=gpu_memory_utilization, enable_prefix_caching=True,
              enforce_eager=enforce_eager, logprobs_mode="processed_logprobs", max_logprobs=1024,
              max_model_len=max_model_len if max_model_len > 0 else bm.max_seq)
    if tensor_parallel_size > 1:
        kw.update(tensor_parallel_size=tensor_parallel_size, distributed_executor_backend="mp")
    return kw


def cache_salt(workspace: str) -> str:
    """vLLM's prefix-cache salt of a workspace's prompts: vLLM mixes it into the first block's
    hash, so a prompt reuses only keys and values its own workspace computed (the reference
    engine's rule, docs/semantics.md: a hit shows in the reported cached tokens and in the
    latency, so a shared cache would tell one workspace what another sent). vLLM's block
    hashes already include the LoRA adapter."""
    return "loops-ws:" + workspace


def cached_tokens(out, prompt_len: int) -> int:
    """The prompt tokens vLLM served from its prefix cache (RequestOutput.num_cached_tokens),
    within [0, prompt_len]; 0 when vLLM does not say."""
    n = getattr(out, "num_cached_tokens", None)
    if not isinstance(n, int):
        return 0
    return max(0, min(n, prompt_len))


def _vllm_rank(r: int) -> int:
    for c in (8, 16, 32, 64, 128, 256, 320, 512):
        if r <= c:
            return c
    return r


def _exit_if_engine_dead(e: BaseException) -> None:
    """vLLM's engine core cannot recover once it has died, and the worker would otherwise keep
    answering health checks. Fail the request as Unavailable and exit the process shortly
    after (so the answer still goes out); the gateway restarts a local worker."""
    try:
        from vllm.v1.engine.exceptions import EngineDeadError
    except ImportError:  # pragma: no cover - other vLLM layouts
        return
    if not isinstance(e, EngineDeadError):
        return
    import sys

    sys.stderr.write(f"loops_worker: vLLM's engine core died ({e}); exiting so the gateway restarts this worker\n")
    sys.stderr.flush()
    threading.Timer(0.5, lambda: os._exit(3)).start()
    raise WorkerError(UNAVAILABLE, "the worker's vLLM engine died; the worker is restarting: retry the request shortly") from e


async def _make(cls, args):
    return cls.from_engine_args(args)


async def _generate(llm, prompt, sp, lora):
    final = None
    async for out in llm.generate(prompt, sp, request_id=uuid.uuid4().hex, lora_request=lora):
        final = out
    return final


def _structured_outputs_cls():
    """vLLM's structured-outputs parameters (guided decoding), whose backend enforces the
    response_format's JSON schema on the GPU."""
    from vllm.sampling_params import StructuredOutputsParams

    return StructuredOutputsParams
