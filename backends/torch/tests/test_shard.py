"""Sharded training and sampling (shard.py): an N-rank replica (gloo on CPU, FSDP2-sharded
base) gives the 1-rank replica's losses, log-probs, LoRA gradients, Adam steps and saved
adapter within 1e-5, and its seeded samples (the same tokens, log-probs within 1e-5, with
and without an adapter) and embeddings, on a tiny random Qwen3 and on loops/tiny (tied
embeddings), with every rank holding the same adapter state and 1/N of each decoder layer;
a rank killed mid-sample loses the replica. A rank killed mid-step, and the
replica rebuilt, is backends/worker's TestShardedReplica (through the Go backend)."""

import multiprocessing
import os
import time

import pytest
import torch

from loops_worker.proto import bpb, tpb

TOL = 1e-5


def _datum(toks, loss="cross_entropy"):
    d = tpb.Datum(tokens=toks)
    n = len(toks)
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=toks[1:] + [0]))
    if loss == "cross_entropy":
        d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[1.0 - 0.1 * i for i in range(n)]))
    else:
        d.loss_fn_inputs["logprobs"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[-5.0] * n))
        d.loss_fn_inputs["advantages"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[1.0, -0.5] * (n // 2) + [0.25] * (n % 2)))
    return d


def _outputs(res):
    out = []
    for r in res.results:
        assert r.WhichOneof("outcome") == "result", r
        out.append((r.result.metrics["loss:sum"], [list(o.outputs["logprobs"].float32_data) for o in r.result.outputs],
                    [list(o.outputs["elementwise_loss"].float32_data) for o in r.result.outputs]))
    return out


def _grads(engine, aid):
    return {k: p.grad.detach().clone() for k, p in engine.adapter(aid).params.items() if p.grad is not None}


def _scenario(engine, out_dir):
    """Adapter slots, batches of two adapters and two losses across ranks, accumulation,
    AdamW, save with optimizer and gradients, load; returns what is compared."""
    got = {}
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="a", base_model="m", lora=tpb.LoraConfig(
        rank=4, seed=7, train_attn=True, train_mlp=True, train_unembed=True)))
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="b", base_model="m", lora=tpb.LoraConfig(
        rank=2, seed=3, train_unembed=True)))
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="gone", base_model="m", lora=tpb.LoraConfig(rank=2, train_attn=True)))
    engine.delete_adapter("gone")
    for step in range(2):
        fb = bpb.ForwardBackwardRequest(items=[
            bpb.ForwardBackwardItem(adapter_id="a", loss_fn="cross_entropy", data=[
                _datum([5 + step, 9, 33, 70, 11, 2]), _datum([3, 4, 5]), _datum([7, 8, 9, 10, 11, 12, 13, 14, 15])]),
            bpb.ForwardBackwardItem(adapter_id="b", loss_fn="ppo", data=[_datum([40, 41, 42, 43], "ppo"), _datum([50, 51, 52, 53, 54], "ppo")]),
            bpb.ForwardBackwardItem(adapter_id="missing", loss_fn="cross_entropy", data=[_datum([1, 2])]),
        ])
        res = engine.forward_backward(fb)
        assert res.results[2].error.code == 5  # NOT_FOUND, on every rank alike
        got[f"fb{step}"] = _outputs(bpb.ForwardBackwardResponse(results=res.results[:2]))
        # a second call accumulates onto the first
        res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id="a", loss_fn="cross_entropy", data=[_datum([60, 61, 62])])]))
        got[f"acc{step}"] = _outputs(res)
        got[f"grads_a{step}"], got[f"grads_b{step}"] = _grads(engine, "a"), _grads(engine, "b")
        if step == 1:
            engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="a", dir=os.path.join(out_dir, "with-grads"),
                                                       include_optimizer=True, include_gradients=True))
        for aid in ("a", "b"):
            r = engine.optim_step(bpb.OptimStepRequest(adapter_id=aid, adam=tpb.AdamParams(learning_rate=0.05, grad_clip_norm=1.0)))
            got[f"optim_{aid}{step}"] = dict(r.result.metrics)
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="a", dir=os.path.join(out_dir, "saved"), include_optimizer=True))
    engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="c", dir=os.path.join(out_dir, "with-grads"),
                                               load_optimizer=True, load_gradients=True))
    res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id=aid, loss_fn="cross_entropy", data=[_datum([20, 21, 22, 23])], forward_only=True) for aid in ("a", "b", "c")]))
    got["after"] = _outputs(res)
    # AdamW's per-element normalisation turns float32 rounding in a near-zero gradient
    # element into a visible weight change (a sign-like first step), so c's step from the
    # loaded gradients is compared between the ranks (bit for bit), not with the 1-rank run
    engine.optim_step(bpb.OptimStepRequest(adapter_id="c", adam=tpb.AdamParams(learning_rate=0.05)))
    return got


def _state(engine):
    """Every adapter's weights, gradients and Adam moments on this rank."""
    out = {}
    for aid in sorted(engine.adapters):
        ad = engine.adapters[aid]
        for k, p in ad.params.items():
            out[f"{aid}/{k}"] = (p.detach().clone(), None if p.grad is None else p.grad.clone(),
                                 ad.exp_avg[k].clone(), ad.exp_avg_sq[k].clone(), ad.step)
    return out


def _engine(model_dir):
    from loops_worker.engine import BaseModel, Engine

    bm = BaseModel("m", model_dir, torch.device("cpu"), torch.float32, 64)
    return Engine({"m": bm}, ["m"])


def _nan(v):
    return "nan" if isinstance(v, float) and v != v else v


def _seen(res, streamed=None):
    """A SampleResponse as compared: tokens, stop reasons, log-probs (NaN as "nan"), top
    log-probs, prompt log-probs and their extras, the embedding."""
    r = res.result
    out = {"seqs": [(list(q.tokens), [_nan(v) for v in q.logprobs], q.stop_reason,
                     list(q.top_logprobs.token_ids), list(q.top_logprobs.logprobs)) for q in r.sequences],
           "prompt": [_nan(v) for v in r.prompt_logprobs],
           "topk": (list(r.topk_prompt_logprobs.token_ids), list(r.topk_prompt_logprobs.logprobs)),
           "targets": [_nan(v) for v in r.target_prompt_logprobs.logprobs],
           "alts": (list(r.prompt_alt_tokens.token_ids), list(r.prompt_alt_tokens.logprobs)),
           "embedding": list(r.embedding)}
    if streamed is not None:
        out["streamed"] = streamed
    return out


def _sampling(sampler, adapter_dir, tokenizer):
    """Seeded samples (stop tokens and strings, top-k/top-p, top log-probs, prompt log-probs
    and their extras, greedy, streamed), with and without a trained adapter, and
    embeddings: what an N-rank replica must answer as one rank does."""
    got = {}
    prompt = [5, 9, 33, 70, 11, 2, 8, 19]
    for name, ad in (("base", ""), ("lora", adapter_dir)):
        params = tpb.SamplingParams(max_tokens=10, temperature=0.9, top_k=40, top_p=0.95, seed=11,
                                    stop_tokens=[17, 23], top_logprobs=3)
        if tokenizer:
            params.stop_strings.append("e")
        req = bpb.SampleRequest(base_model="m", prompt=prompt, num_samples=3, adapter_dir=ad, params=params,
                                prompt_logprobs=True, topk_prompt_logprobs=4, prompt_alt_tokens_k=2,
                                target_prompt_tokens=tpb.TargetPromptTokens(k=2, token_ids=[3, -1] * (len(prompt) - 1)))
        got[f"{name}/sample"] = _seen(sampler.sample(req))
        streamed = []
        greedy = bpb.SampleRequest(base_model="m", prompt=prompt[:3], num_samples=2, adapter_dir=ad,
                                   params=tpb.SamplingParams(max_tokens=6, temperature=0.0, seed=3, top_logprobs=2))
        got[f"{name}/greedy"] = _seen(sampler.sample(greedy, lambda i, t, lp, top: streamed.append((i, t, lp))), streamed)
        got[f"{name}/embed"] = _seen(sampler.sample(bpb.SampleRequest(base_model="m", prompt=prompt, adapter_dir=ad, embed=True)))
    return got


def _rank(rank, world, init, model_dir, out_dir, sample_dir=""):
    from loops_worker import shard

    torch.set_num_threads(1)
    engine = _engine(model_dir)
    d = shard.init(rank, world, init, torch.device("cpu"), timeout_s=300)
    shard.setup(engine, d)
    if rank > 0:
        rc = shard.follow(engine, d)
        d.gather(_state(engine))
        os._exit(rc)
    # the base is sharded: each rank holds 1/world of every decoder layer (FSDP2 DTensors)
    from torch.distributed.tensor import DTensor

    layer_params = [p for layer in engine.models["m"].model.model.layers for p in layer.parameters()]
    local = sum(p.to_local().numel() for p in layer_params if isinstance(p, DTensor))
    leader = shard.Leader(engine, d)
    got = _scenario(leader, out_dir)
    got["sampling"] = _sampling(shard.sampler(leader), sample_dir, engine.models["m"].tokenizer is not None)
    leader.stop()
    states = d.gather(_state(engine))
    got["ranks_agree"] = all(_same(states[0], st) for st in states[1:])
    got["layer_share"] = local / sum(p.numel() for p in layer_params)
    torch.save(got, os.path.join(out_dir, "got.pt"))
    os._exit(0)


def _same(a, b):
    if isinstance(a, dict):
        return sorted(a) == sorted(b) and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and torch.equal(a, b)
    return a == b


def _sharded(model_dir, world, out_dir, sample_dir):
    from loops_worker import shard

    init = f"tcp://127.0.0.1:{shard.free_port()}"
    ctx = multiprocessing.get_context("fork")
    ps = [ctx.Process(target=_rank, args=(r, world, init, model_dir, out_dir, sample_dir)) for r in range(world)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(240)
    assert [p.exitcode for p in ps] == [0] * world
    return torch.load(os.path.join(out_dir, "got.pt"))


def _close(a, b, where):
    if isinstance(a, dict):
        assert sorted(a) == sorted(b), where
        for k in a:
            _close(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, (list, tuple)):
        assert len(a) == len(b), where
        for i, (x, y) in enumerate(zip(a, b)):
            _close(x, y, f"{where}[{i}]")
    elif isinstance(a, torch.Tensor):
        assert a.shape == b.shape, where
        diff = float((a.double() - b.double()).abs().max()) if a.numel() else 0.0
        assert diff <= TOL * max(1.0, float(b.double().abs().max())), f"{where}: max |diff| {diff:g}"
    elif isinstance(a, (str, int)) and not isinstance(a, bool) and not isinstance(b, float):
        assert a == b, f"{where}: {a!r} vs {b!r}"
    else:
        assert abs(a - b) <= TOL * max(1.0, abs(b)), f"{where}: {a} vs {b}"


def _files(d):
    from safetensors.torch import load_file

    out = {}
    for name in sorted(os.listdir(d)):
        p = os.path.join(d, name)
        out[name] = load_file(p) if name.endswith(".safetensors") else open(p).read()
    return out


def _compare(model_dir, tmp_path, worlds):
    from loops_worker.sampler import HFSampler

    one = tmp_path / "one"
    one.mkdir()
    engine = _engine(model_dir)
    want = _scenario(engine, str(one))
    # samples with the 1-rank replica's trained adapter, on every replica alike
    sample_dir = str(one / "saved")
    want["sampling"] = _sampling(HFSampler(engine), sample_dir, engine.models["m"].tokenizer is not None)
    seqs = [q for k, v in want["sampling"].items() if not k.endswith("embed") for q in v["seqs"]]
    assert any(q[2] == tpb.STOP_REASON_STOP for q in seqs) and any(q[2] == tpb.STOP_REASON_LENGTH for q in seqs)
    assert want["sampling"]["base/sample"]["seqs"] != want["sampling"]["lora/sample"]["seqs"], "the adapter changes the samples"
    for w in worlds:
        out = tmp_path / f"n{w}"
        out.mkdir()
        got = _sharded(model_dir, w, str(out), sample_dir)
        assert got.pop("ranks_agree"), f"{w} ranks hold different adapter state"
        assert abs(got.pop("layer_share") - 1 / w) < 0.02, f"rank 0 of {w} does not hold 1/{w} of the layers"
        assert any(float(g.abs().max()) > 0 for g in want["grads_a1"].values())
        _close(got, want, f"{w} ranks")
        for folder in ("saved", "with-grads"):
            _close(_files(out / folder), _files(one / folder), f"{w} ranks {folder}")


def test_sharded_equals_one_rank_qwen3(tiny_dir, tmp_path):
    _compare(tiny_dir, tmp_path, (2, 4))


def _loops_tiny():
    d = os.environ.get("LOOPS_TINY_DIR", "")
    if d and os.path.isfile(os.path.join(d, "config.json")):
        return d
    if os.environ.get("CI") == "true":
        pytest.fail("LOOPS_TINY_DIR (loops/tiny, written by run-tests.sh) is needed")
    pytest.skip("no LOOPS_TINY_DIR: run through backends/torch/run-tests.sh, which writes loops/tiny")


def test_sharded_equals_one_rank_loops_tiny(tmp_path):
    d = _loops_tiny()
    _compare(d, tmp_path, (2, 4))


def test_sharded_replica_refuses_vllm():
    from loops_worker import __main__ as wm

    args = wm.parser().parse_args(["--model", "m", "--world-size", "2", "--sampler", "vllm"])
    with pytest.raises(ValueError, match="sampler_replicas"):
        wm.build(args)


def _killed_rank(rank, init, model_dir, pid):
    """Rank 0 kills rank 1 (pid) after the third token of a sample; it must not answer."""
    import signal

    from loops_worker import shard

    torch.set_num_threads(1)
    if rank > 0:
        pid.value = os.getpid()
    engine = _engine(model_dir)
    d = shard.init(rank, 2, init, torch.device("cpu"), timeout_s=60)
    shard.setup(engine, d)
    if rank > 0:
        os._exit(shard.follow(engine, d))
    leader = shard.Leader(engine, d)

    def on_token(i, t, lp, top):
        if i == 0 and t >= 0 and len(seen) == 3:
            os.kill(pid.value, signal.SIGKILL)
        seen.append(t)

    seen = []
    shard.sampler(leader).sample(bpb.SampleRequest(base_model="m", prompt=[5, 6, 7], params=tpb.SamplingParams(
        max_tokens=40, temperature=1.0, seed=1)), on_token)
    os._exit(0)  # answered: the test fails


def test_rank_killed_mid_sample_is_a_lost_replica(tiny_dir):
    """A follower killed between two passes of a sample: rank 0 exits 1 instead of answering
    (the replica is lost; backends/worker's TestShardedReplica shows the rebuild)."""
    from loops_worker import shard

    init = f"tcp://127.0.0.1:{shard.free_port()}"
    ctx = multiprocessing.get_context("fork")
    pid = ctx.Value("i", 0)
    ps = [ctx.Process(target=_killed_rank, args=(r, init, tiny_dir, pid)) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
    assert [p.exitcode for p in ps] == [1, -9]


def _idle_rank(rank, init, model_dir, out_dir):
    from loops_worker import shard

    torch.set_num_threads(1)
    engine = _engine(model_dir)
    d = shard.init(rank, 2, init, torch.device("cpu"), timeout_s=3)
    shard.setup(engine, d)
    if rank > 0:
        os._exit(shard.follow(engine, d))
    leader = shard.Leader(engine, d, keepalive_s=0.5)
    time.sleep(6)  # idle for twice the collective timeout
    leader.create_adapter(bpb.CreateAdapterRequest(adapter_id="a", base_model="m", lora=tpb.LoraConfig(rank=2, train_attn=True)))
    res = leader.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="a", loss_fn="cross_entropy", data=[_datum([1, 2, 3]), _datum([4, 5])])]))
    assert res.results[0].WhichOneof("outcome") == "result"
    leader.stop()
    os._exit(0)


def test_idle_replica_stays_up(tiny_dir):
    """The other ranks wait for rank 0's next command inside a collective that has a
    timeout; rank 0's keep-alive commands keep an idle replica up past it."""
    from loops_worker import shard

    init = f"tcp://127.0.0.1:{shard.free_port()}"
    ctx = multiprocessing.get_context("fork")
    ps = [ctx.Process(target=_idle_rank, args=(r, init, tiny_dir, "")) for r in range(2)]
    for p in ps:
        p.start()
    for p in ps:
        p.join(120)
    assert [p.exitcode for p in ps] == [0, 0]
