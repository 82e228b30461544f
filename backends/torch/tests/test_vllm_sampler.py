"""VLLMSampler against a stand-in for the vLLM 0.33.0 API (no GPU, no vLLM install).

The stand-in copies the behaviour of the pinned vLLM that the sampler depends on (read from its
source): AsyncEngineArgs field names, max_lora_rank values, max_cpu_loras >= max_loras;
SamplingParams refusing n > 1 when greedy and temperatures above 2; AsyncLLM.generate as an
async generator that, unless output_kind is FINAL_ONLY, streams each child of an n > 1 request
in its own RequestOutput; LoRARequest(lora_name, lora_int_id, lora_path); Logprob(logprob, rank);
prompt_logprobs with None first and the prompt token added to the top-k.
"""

import asyncio
import enum
import json
import math
import os
import sys
import types

import pytest

from loops_worker.errors import FAILED_PRECONDITION, INVALID_ARGUMENT, WorkerError
from loops_worker.proto import bpb, tpb

ENGINE_FIELDS = {"model", "tokenizer", "enable_lora", "max_lora_rank", "max_loras", "max_cpu_loras", "dtype",
                 "gpu_memory_utilization", "enable_prefix_caching", "enforce_eager", "logprobs_mode",
                 "max_logprobs", "max_model_len", "tensor_parallel_size", "distributed_executor_backend"}


class VLLMValidationError(ValueError):
    pass


class EngineDeadError(Exception):
    """vllm.v1.engine.exceptions.EngineDeadError: the engine core died; unrecoverable."""


class RequestOutputKind(enum.Enum):
    CUMULATIVE = 0
    DELTA = 1
    FINAL_ONLY = 2


class SamplingParams:
    def __init__(self, n=1, temperature=1.0, top_p=1.0, top_k=0, seed=None, stop=None, stop_token_ids=None,
                 max_tokens=16, logprobs=None, prompt_logprobs=None, detokenize=True, skip_special_tokens=True,
                 include_stop_str_in_output=False, output_kind=RequestOutputKind.CUMULATIVE, ignore_eos=False):
        self.__dict__.update(locals())
        del self.__dict__["self"]
        if not 0 <= temperature <= 2:
            raise VLLMValidationError(f"temperature must be in [0, 2], got {temperature}.")
        if not 0 < top_p <= 1:
            raise VLLMValidationError(f"top_p must be in (0, 1], got {top_p}.")
        if stop and not detokenize:
            raise VLLMValidationError("stop strings are only supported when detokenize is True.")
        if temperature < 1e-5 and n > 1:
            raise VLLMValidationError(f"n must be 1 when using greedy sampling, got {n}.")
        if seed is not None and not 0 <= seed + n - 1 < 1 << 64:
            raise OverflowError("seed out of range")


class Logprob:
    def __init__(self, logprob, rank=None):
        self.logprob, self.rank = logprob, rank


class LoRARequest:
    def __init__(self, lora_name, lora_int_id, lora_path=""):
        assert lora_int_id >= 1 and lora_path
        self.lora_name, self.lora_int_id, self.lora_path = lora_name, lora_int_id, lora_path


class AsyncEngineArgs:
    def __init__(self, **kw):
        assert set(kw) <= ENGINE_FIELDS, set(kw) - ENGINE_FIELDS
        assert kw["max_lora_rank"] in (1, 8, 16, 32, 64, 128, 256, 320, 512)
        assert kw["max_cpu_loras"] >= kw["max_loras"]
        self.kw = kw


class AsyncLLM:
    V = 320
    calls = []
    added = []

    def __init__(self, args):
        self.args = args
        self.blocks = set()  # the prefix cache: (salt, adapter, prompt blocks so far)

    @classmethod
    def from_engine_args(cls, args):
        asyncio.get_running_loop()
        return cls(args)

    def _child(self, prompt, sp, i):
        seed = (sp.seed if sp.seed is not None else 0) + i
        toks, lps = [], []
        for j in range(sp.max_tokens):
            t = (seed * 7 + j * 13 + len(prompt)) % self.V if sp.temperature > 0 else (len(prompt) + j) % self.V
            toks.append(t)
            lps.append({t: Logprob(-1.0 - 0.01 * j, rank=3)})
            if t in (sp.stop_token_ids or []):
                break
        fr = "stop" if toks[-1] in (sp.stop_token_ids or []) else "length"
        return types.SimpleNamespace(index=i, token_ids=toks, logprobs=lps, finish_reason=fr)

    def _prompt_logprobs(self, prompt, k):
        rows = [None]
        for r in range(1, len(prompt)):
            d = {tid: Logprob(-float(rank), rank=rank) for rank, tid in enumerate(range(10, 10 + k), start=1)}
            if prompt[r] not in d:
                d[prompt[r]] = Logprob(-50.0, rank=200)
            rows.append(d)
        return rows

    async def add_lora(self, lora_request):
        AsyncLLM.added.append(lora_request)
        if "bad" in lora_request.lora_path:
            raise Exception("Call to add_lora method failed: shapes do not match")
        return True

    async def generate(self, prompt, sampling_params, request_id, *, lora_request=None):
        assert isinstance(prompt, dict) and set(prompt) == {"prompt_token_ids", "cache_salt"}
        assert isinstance(request_id, str) and isinstance(prompt["cache_salt"], str)
        sp = sampling_params
        AsyncLLM.calls.append((sp, lora_request))
        ids = prompt["prompt_token_ids"]
        # vLLM's prefix cache: whole blocks of 16 whose hash chain (salt, LoRA, tokens) it
        # holds, at most up to the prompt's last token
        key, cached = (prompt["cache_salt"], lora_request.lora_name if lora_request else None), 0
        for b in range((len(ids) - 1) // 16):
            if key + (tuple(ids[:(b + 1) * 16]),) not in self.blocks:
                break
            cached = (b + 1) * 16
        for b in range(len(ids) // 16):
            self.blocks.add(key + (tuple(ids[:(b + 1) * 16]),))
        if 299 in ids:  # the test's way to kill the engine core
            raise EngineDeadError("EngineCore encountered an issue.")
        plp = self._prompt_logprobs(ids, sp.prompt_logprobs) if sp.prompt_logprobs is not None else None
        children = [self._child(ids, sp, i) for i in range(sp.n)]
        if sp.output_kind == RequestOutputKind.FINAL_ONLY:
            yield types.SimpleNamespace(outputs=children, prompt_logprobs=plp, finished=True, num_cached_tokens=cached)
            return
        for i, c in enumerate(children):  # vLLM: one child per streamed output when n > 1
            await asyncio.sleep(0)
            yield types.SimpleNamespace(outputs=[c], prompt_logprobs=plp, finished=i == len(children) - 1)


@pytest.fixture
def fake_vllm(monkeypatch):
    mods = {
        "vllm": types.ModuleType("vllm"),
        "vllm.engine": types.ModuleType("vllm.engine"),
        "vllm.engine.arg_utils": types.ModuleType("vllm.engine.arg_utils"),
        "vllm.v1": types.ModuleType("vllm.v1"),
        "vllm.v1.engine": types.ModuleType("vllm.v1.engine"),
        "vllm.v1.engine.async_llm": types.ModuleType("vllm.v1.engine.async_llm"),
        "vllm.v1.engine.exceptions": types.ModuleType("vllm.v1.engine.exceptions"),
        "vllm.lora": types.ModuleType("vllm.lora"),
        "vllm.lora.request": types.ModuleType("vllm.lora.request"),
        "vllm.exceptions": types.ModuleType("vllm.exceptions"),
        "vllm.sampling_params": types.ModuleType("vllm.sampling_params"),
    }
    mods["vllm"].SamplingParams = SamplingParams
    mods["vllm.engine.arg_utils"].AsyncEngineArgs = AsyncEngineArgs
    mods["vllm.v1.engine.async_llm"].AsyncLLM = AsyncLLM
    mods["vllm.lora.request"].LoRARequest = LoRARequest
    mods["vllm.exceptions"].VLLMValidationError = VLLMValidationError
    mods["vllm.v1.engine.exceptions"].EngineDeadError = EngineDeadError
    mods["vllm.sampling_params"].RequestOutputKind = RequestOutputKind
    mods["vllm.sampling_params"].SamplingParams = SamplingParams
    for k, v in mods.items():
        monkeypatch.setitem(sys.modules, k, v)
    AsyncLLM.calls = []
    AsyncLLM.added = []
    return mods


def _req(prompt, n=1, **params):
    topk = params.pop("topk", 0)
    plp = params.pop("prompt_logprobs", False)
    adapter = params.pop("adapter_dir", "")
    return bpb.SampleRequest(base_model="tiny", prompt=prompt, num_samples=n, adapter_dir=adapter,
                             prompt_logprobs=plp, topk_prompt_logprobs=topk, params=tpb.SamplingParams(**params))


def test_vllm_sampler_against_the_033_api(fake_vllm, engine, tmp_path):
    from loops_worker import checkpoint as ckpt
    from loops_worker.vllm_sampler import VLLMSampler

    vs = VLLMSampler(engine, max_loras=100)
    try:
        assert AsyncLLM.calls == []
        args = vs.llms["tiny"].args.kw
        assert args["max_cpu_loras"] == 100 and args["max_lora_rank"] == 64 and args["logprobs_mode"] == "processed_logprobs"

        # n > 1: every sequence comes back (FINAL_ONLY), in index order, log-probs per token.
        r = vs.sample(_req([5, 6, 7], n=4, max_tokens=5, temperature=1.0, seed=3)).result
        assert len(r.sequences) == 4
        assert all(len(s.tokens) == 5 and len(s.logprobs) == 5 for s in r.sequences)
        assert len({tuple(s.tokens) for s in r.sequences}) == 4
        sp, lora = AsyncLLM.calls[-1]
        assert sp.output_kind == RequestOutputKind.FINAL_ONLY and sp.n == 4 and sp.logprobs == 0 and lora is None

        # Greedy with n > 1: run once, repeated.
        r = vs.sample(_req([5, 6, 7], n=3, max_tokens=4, temperature=0.0)).result
        assert len(r.sequences) == 3 and len({tuple(s.tokens) for s in r.sequences}) == 1
        assert AsyncLLM.calls[-1][0].n == 1

        # Stop tokens end a sequence with STOP; the stop token is included.
        stop_at = (3 * 7 + 2 * 13 + 3) % AsyncLLM.V
        r = vs.sample(_req([5, 6, 7], max_tokens=8, temperature=1.0, seed=3, stop_tokens=[stop_at])).result
        assert r.sequences[0].tokens[-1] == stop_at and r.sequences[0].stop_reason == tpb.STOP_REASON_STOP

        # Prompt log-probs (first NaN) and top-k prompt log-probs (ranks 1..k only).
        r = vs.sample(_req([5, 6, 7, 8], max_tokens=1, prompt_logprobs=True, topk=2)).result
        assert math.isnan(r.prompt_logprobs[0]) and list(r.prompt_logprobs[1:]) == [-50.0, -50.0, -50.0]
        assert r.topk_prompt_logprobs.k == 2 and list(r.topk_prompt_logprobs.token_ids[2:4]) == [10, 11]
        assert AsyncLLM.calls[-1][0].prompt_logprobs == 2

        # Target prompt log-probs and prompt draws are the transformers sampler's: refused,
        # before vLLM runs anything, rather than answered without them.
        calls = len(AsyncLLM.calls)
        for extra in ({"target_prompt_tokens": tpb.TargetPromptTokens(k=1, token_ids=[3, -1, 4])}, {"prompt_alt_tokens_k": 2}):
            req = _req([5, 6, 7, 8], max_tokens=1)
            for f, v in extra.items():
                if isinstance(v, int):
                    setattr(req, f, v)
                else:
                    getattr(req, f).CopyFrom(v)
            with pytest.raises(WorkerError) as e:
                vs.sample(req)
            assert e.value.code == FAILED_PRECONDITION and "transformers sampler" in e.value.message
        assert len(AsyncLLM.calls) == calls

        # Seeds near 2**64 stay valid for every child.
        vs.sample(_req([5], n=3, max_tokens=1, temperature=1.0, seed=(1 << 64) - 1))

        # Parameters vLLM refuses are the caller's error.
        with pytest.raises(WorkerError) as e:
            vs.sample(_req([5], max_tokens=1, temperature=2.5))
        assert e.value.code == INVALID_ARGUMENT

        # Adapters: one LoRA id per folder snapshot.
        engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="vllm-ad", base_model="tiny",
                                                       lora=tpb.LoraConfig(rank=8, seed=1, train_attn=True)))
        d = str(tmp_path / "ad")
        engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="vllm-ad", dir=d))
        vs.sample(_req([5], max_tokens=1, adapter_dir=d))
        vs.sample(_req([5], max_tokens=1, adapter_dir=d))
        a, b = AsyncLLM.calls[-2][1], AsyncLLM.calls[-1][1]
        assert a.lora_int_id == b.lora_int_id >= 1 and a.lora_path == d
        assert [x.lora_int_id for x in AsyncLLM.added] == [a.lora_int_id]  # add_lora once per folder

        # A folder vLLM cannot load fails that request only, as the caller's error.
        bad = str(tmp_path / "bad")
        engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="vllm-ad", dir=bad))
        with pytest.raises(WorkerError) as e:
            vs.sample(_req([5], max_tokens=1, adapter_dir=bad))
        assert e.value.code == INVALID_ARGUMENT and "cannot load the adapter" in e.value.message

        # A crafted folder is refused before vLLM sees it (issue 8, item 5).
        crafted = str(tmp_path / "crafted")
        engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="vllm-ad", dir=crafted))
        cfg = ckpt.read_config(crafted)
        cfg["r"] = 99999999
        with open(os.path.join(crafted, ckpt.ADAPTER_CONFIG), "w") as f:
            json.dump(cfg, f)
        added = len(AsyncLLM.added)
        with pytest.raises(WorkerError) as e:
            vs.sample(_req([5], max_tokens=1, adapter_dir=crafted))
        assert e.value.code == INVALID_ARGUMENT and "rank limit" in e.value.message
        assert len(AsyncLLM.added) == added
        engine.delete_adapter("vllm-ad")
    finally:
        vs.loop.call_soon_threadsafe(vs.loop.stop)


def test_dead_engine_fails_unavailable_and_exits(fake_vllm, engine, monkeypatch):
    """A dead vLLM engine core cannot recover: the request fails as Unavailable and the
    worker process exits, so the gateway restarts it instead of health-checking a zombie."""
    import os
    import time

    from loops_worker.errors import UNAVAILABLE
    from loops_worker.vllm_sampler import VLLMSampler

    exits = []
    monkeypatch.setattr(os, "_exit", lambda code: exits.append(code))
    vs = VLLMSampler(engine, max_loras=4)
    try:
        with pytest.raises(WorkerError) as e:
            vs.sample(_req([5, 299, 7], max_tokens=2, temperature=1.0, seed=1))
        assert e.value.code == UNAVAILABLE and "restarting" in e.value.message
        deadline = time.time() + 5
        while not exits and time.time() < deadline:
            time.sleep(0.05)
        assert exits == [3]
    finally:
        vs.loop.call_soon_threadsafe(vs.loop.stop)


def test_tied_unembed_adapter_is_refused(fake_vllm, engine, tmp_path, monkeypatch):
    """vLLM's LoRA adapts the head's logits only: an adapter whose unembedding LoRA adapts the
    shared matrix of a model with tied embeddings (ensure_weight_tying) is refused before vLLM
    loads it, rather than sampled without its embedding update. The same adapter without
    the marker (the head-only rule of older checkpoints) is served."""
    from loops_worker.vllm_sampler import VLLMSampler

    # the fixture model is untied; what the refusal reads is the model's tiedness and the folder's marker
    monkeypatch.setattr(engine.model("tiny"), "tied", True)
    vs = VLLMSampler(engine, max_loras=4)
    try:
        engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="vllm-tied", base_model="tiny",
                                                       lora=tpb.LoraConfig(rank=4, seed=1, train_attn=True, train_unembed=True)))
        assert engine.adapter("vllm-tied").tied_embed
        d = str(tmp_path / "tied")
        engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="vllm-tied", dir=d))
        added = len(AsyncLLM.added)
        with pytest.raises(WorkerError) as e:
            vs.sample(_req([5], max_tokens=1, adapter_dir=d))
        assert e.value.code == FAILED_PRECONDITION and "tied embeddings" in e.value.message
        assert len(AsyncLLM.added) == added
        with open(os.path.join(d, "adapter_config.json")) as f:
            cfg = json.load(f)
        del cfg["ensure_weight_tying"]
        old = str(tmp_path / "old")
        os.makedirs(old)
        with open(os.path.join(old, "adapter_config.json"), "w") as f:
            json.dump(cfg, f)
        os.link(os.path.join(d, "adapter_model.safetensors"), os.path.join(old, "adapter_model.safetensors"))
        vs.sample(_req([5], max_tokens=1, adapter_dir=old))
        assert len(AsyncLLM.added) == added + 1
        engine.delete_adapter("vllm-tied")
    finally:
        vs.loop.call_soon_threadsafe(vs.loop.stop)


def test_vllm_prefix_cache_hits_reported_per_workspace(fake_vllm, engine):
    """vLLM's prefix-cache hits (RequestOutput.num_cached_tokens) come back as
    prompt_cached_tokens; prompts are salted with their workspace, so another workspace's
    same prompt is not a hit."""
    from loops_worker.vllm_sampler import VLLMSampler

    vs = VLLMSampler(engine, max_loras=4)
    try:
        prompt = [(i * 7 + 3) % 300 for i in range(40)]

        def sample(ws):
            req = _req(prompt, max_tokens=2, temperature=1.0, seed=1)
            req.workspace = ws
            return vs.sample(req).result.prompt_cached_tokens

        assert sample("ws-a") == 0
        assert sample("ws-a") == 32  # two whole blocks of 16 before the last token
        assert sample("ws-b") == 0
    finally:
        vs.loop.call_soon_threadsafe(vs.loop.stop)


def test_tensor_parallel_sampler_replica(fake_vllm, engine, tiny_dir, tmp_path):
    """A sampler replica of 4 GPUs (--vllm-tensor-parallel-size 4, as the local provider and
    the Ray driver start it): vLLM gets tensor_parallel_size 4 and its mp executor; the torch
    side holds the model's shapes only (meta), checks adapter folders against them, samples
    through vLLM and refuses to train. One GPU: vLLM's defaults (no such arguments)."""
    from loops_worker import __main__ as wm
    from loops_worker.errors import FAILED_PRECONDITION

    args = wm.parser().parse_args(["--model", f"tiny={tiny_dir}", "--device", "cpu", "--sampler", "vllm",
                                   "--vllm-tensor-parallel-size", "4"])
    eng, sampler, _, _ = wm.build(args)
    kw = sampler.llms["tiny"].args.kw
    assert (kw["tensor_parallel_size"], kw["distributed_executor_backend"]) == (4, "mp")
    bm = eng.models["tiny"]
    assert bm.device.type == "meta" and all(p.device.type == "meta" for p in bm.model.parameters())
    # an adapter trained on a 1-GPU worker is checked against the shapes and sampled
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="tp", base_model="tiny", lora=tpb.LoraConfig(rank=4, train_attn=True)))
    d = str(tmp_path / "tp")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="tp", dir=d))
    engine.delete_adapter("tp")
    res = sampler.sample(_req([5, 6, 7], max_tokens=3, seed=1, adapter_dir=d))
    assert len(res.result.sequences[0].tokens) == 3 and AsyncLLM.added[-1].lora_path == d
    # a folder whose first LoRA matrix has another model's width: refused from the shapes
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad"
    bad.mkdir()
    for n in os.listdir(d):
        with open(os.path.join(d, n), "rb") as src, open(bad / n, "wb") as dst:
            dst.write(src.read())
    ws = load_file(str(bad / "adapter_model.safetensors"))
    k = sorted(k for k in ws if "lora_A" in k)[0]
    ws[k] = ws[k].new_zeros((ws[k].shape[0], ws[k].shape[1] + 8))
    save_file(ws, str(bad / "adapter_model.safetensors"))
    with pytest.raises(WorkerError) as e:
        sampler.sample(_req([5, 6, 7], max_tokens=3, seed=1, adapter_dir=str(bad)))
    assert e.value.code == INVALID_ARGUMENT and "shape" in e.value.message, e.value.message
    with pytest.raises(WorkerError) as e:
        eng.create_adapter(bpb.CreateAdapterRequest(adapter_id="x", base_model="tiny", lora=tpb.LoraConfig(rank=2, train_attn=True)))
    assert e.value.code == FAILED_PRECONDITION and "does not train" in e.value.message
    with pytest.raises(WorkerError) as e:
        eng.load_adapter(bpb.LoadAdapterRequest(adapter_id="x", dir=d))
    assert e.value.code == FAILED_PRECONDITION
    one = wm.build(wm.parser().parse_args(["--model", f"tiny={tiny_dir}", "--device", "cpu", "--sampler", "vllm"]))[1]
    kw1 = one.llms["tiny"].args.kw
    assert "tensor_parallel_size" not in kw1 and "distributed_executor_backend" not in kw1
    with pytest.raises(ValueError, match="sampler replica"):
        wm.build(wm.parser().parse_args(["--model", "m", "--world-size", "2", "--vllm-tensor-parallel-size", "2"]))


def test_ray_sampler_replica_layout():
    """The Ray driver's sampler replica of N GPUs: one actor, one bundle holding the N GPUs
    (placed STRICT_PACK on one node), started with --vllm-tensor-parallel-size N; a trainer
    pool's replica gets no such argument (its N ranks are the sharded replica)."""
    from loops_worker import ray_pool

    def spec(role, g):
        return {"pool": {"id": "p", "role": role, "base_model": "m", "gpus_per_replica": g, "args": ["--threads", "1"]},
                "registry_url": "https://127.0.0.1:1"}

    s = spec("sampler", 4)
    assert ray_pool.bundle(s) == {"CPU": 1.0, "GPU": 4.0}
    assert (ray_pool.tensor_parallel(s), ray_pool.world_size(s)) == (4, 1)
    argv = ray_pool._argv(s, 0, "/tok", "127.0.0.1")
    assert argv[argv.index("--vllm-tensor-parallel-size") + 1] == "4"
    from loops_worker import __main__ as wm

    assert wm.parser().parse_args(argv).vllm_tensor_parallel_size == 4
    t = spec("trainer", 4)
    assert (ray_pool.tensor_parallel(t), ray_pool.world_size(t)) == (1, 4)
    assert "--vllm-tensor-parallel-size" not in ray_pool._argv(t, 0, "/tok", "127.0.0.1")
    assert "--vllm-tensor-parallel-size" not in ray_pool._argv(spec("sampler", 1), 0, "/tok", "127.0.0.1")
    assert ray_pool.bundle(spec("sampler", 0)) == {"CPU": 1.0}
