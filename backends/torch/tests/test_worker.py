import math
import os

import pytest
import torch

from loops_worker import pcg
from loops_worker.errors import INVALID_ARGUMENT, NOT_FOUND, WorkerError
from loops_worker.proto import bpb, tpb


def test_pcg_matches_go():
    # values printed by Go: rand.New(rand.NewPCG(12345, 12345^0x9e3779b97f4a7c15)).Float64()
    r = pcg.new_rng(12345)
    assert [r.float64() for _ in range(3)] == [0.6030194998190209, 0.37500521765242567, 0.7696459404979872]
    a, b = pcg.new_rng(99), pcg.new_rng(99)
    assert list(pcg.float64_block(a, 5000, lanes=77)) == [b.float64() for _ in range(5000)]


def _datum(toks, loss="cross_entropy", weights=None):
    d = tpb.Datum(tokens=toks)
    n = len(toks)
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=toks[1:] + [0]))
    if loss == "cross_entropy":
        w = weights or [1.0] * n
        d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=w))
    else:
        d.loss_fn_inputs["logprobs"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[-5.0] * n))
        d.loss_fn_inputs["advantages"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[1.0, -1.0] * (n // 2) + [0.5] * (n % 2)))
    return d


def _train(engine, aid, steps=2, lora=None):
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="tiny",
                                                   lora=lora or tpb.LoraConfig(rank=4, seed=7, train_attn=True, train_mlp=True, train_unembed=True)))
    for s in range(steps):
        res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id=aid, loss_fn="cross_entropy", data=[_datum([5 + s, 9, 33, 70, 11, 2]), _datum([3, 4, 5])])]))
        assert res.results[0].WhichOneof("outcome") == "result", res.results[0]
        engine.optim_step(bpb.OptimStepRequest(adapter_id=aid, adam=tpb.AdamParams(learning_rate=0.05)))


def test_sampler_checkpoint_loads_in_peft(engine, tiny_dir, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    _train(engine, "peft")
    out = str(tmp_path / "sampler")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="peft", dir=out))
    assert sorted(os.listdir(out)) == ["adapter_config.json", "adapter_model.safetensors"]
    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    pm = PeftModel.from_pretrained(base, out)
    pm.eval()
    ids = [5, 9, 33, 70, 11, 2, 17, 18]
    with torch.no_grad():
        want = torch.log_softmax(pm(input_ids=torch.tensor([ids])).logits[0].double(), -1)
    d = _datum(ids)
    res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="peft", loss_fn="cross_entropy", data=[d], forward_only=True)]))
    got = list(res.results[0].result.outputs[0].outputs["logprobs"].float32_data)
    exp = [float(want[i, t]) for i, t in enumerate(ids[1:] + [0])]
    assert max(abs(a - b) for a, b in zip(got, exp)) < 1e-5
    # and the reverse: PEFT's own save_pretrained output loads back into the worker
    pm.save_pretrained(str(tmp_path / "peft-saved"), save_embedding_layers=False)
    engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="from-peft", dir=str(tmp_path / "peft-saved")))
    res2 = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="from-peft", loss_fn="cross_entropy", data=[d], forward_only=True)]))
    assert list(res2.results[0].result.outputs[0].outputs["logprobs"].float32_data) == got


def test_losses_and_gradients(engine):
    """Each loss equals its formula on the worker's own logprobs (forward_only)."""
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="loss", base_model="tiny", lora=tpb.LoraConfig(rank=2, train_attn=True)))
    toks = [4, 8, 15, 16, 23, 42]
    base = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="loss", loss_fn="cross_entropy", data=[_datum(toks)], forward_only=True)]))
    lp = list(base.results[0].result.outputs[0].outputs["logprobs"].float32_data)
    q = [-5.0] * 6
    A = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0]
    clip = lambda x, lo, hi: min(max(x, lo), hi)
    formulas = {
        "importance_sampling": lambda l, q, a: -math.exp(l - q) * a,
        "ppo": lambda l, q, a: -min(math.exp(l - q) * a, clip(math.exp(l - q), 0.8, 1.2) * a),
        "cispo": lambda l, q, a: -clip(math.exp(l - q), 0.8, 1.2) * a * l,
        "dro": lambda l, q, a: -(l * a - 0.5 * 0.05 * (l - q) ** 2),
    }
    for name, f in formulas.items():
        res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id="loss", loss_fn=name, data=[_datum(toks, name)], forward_only=True)]))
        r = res.results[0].result
        el = list(r.outputs[0].outputs["elementwise_loss"].float32_data)
        want = [f(l, qq, a) for l, qq, a in zip(lp, q, A)]
        assert max(abs(x - y) / max(1, abs(y)) for x, y in zip(el, want)) < 1e-5, name
        assert abs(r.metrics["loss:sum"] - sum(want)) < 1e-3 * max(1, abs(sum(want)))


def test_gspo(engine):
    """gspo equals its formula on the worker's own logprobs: every position carries the
    sequence ratio s = exp(mean over the marked positions of lp − q), clipped as a whole."""
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="gspo", base_model="tiny", lora=tpb.LoraConfig(rank=2, train_attn=True)))
    toks = [4, 8, 15, 16, 23, 42]
    base = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="gspo", loss_fn="cross_entropy", data=[_datum(toks)], forward_only=True)]))
    lp = list(base.results[0].result.outputs[0].outputs["logprobs"].float32_data)
    mask = [0.0, 0.0, 1.0, 1.0, 1.0, 1.0]
    A = [1.0, -1.0, 1.0, -1.0, 1.0, -1.0]
    d = _datum(toks, "gspo")
    q = [l - math.log(r) for l, r in zip(lp, [9.0, 0.1, 1.2, 1.5, 1.1, 1.3])]  # s ≈ 1.27
    d.loss_fn_inputs["logprobs"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[6], float32_data=q))
    d.loss_fn_inputs["sequence_ratio_mask"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[6], float32_data=mask))
    qf = list(d.loss_fn_inputs["logprobs"].float32_data)
    s = math.exp(sum(l - qq for l, qq, m in zip(lp, qf, mask) if m) / 4)
    assert 1.2 < s < 1.35
    for cfg, (lo, hi) in [({}, (0.9997, 1.0004)), ({"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}, (0.5, 2.0))]:
        res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id="gspo", loss_fn="gspo", loss_fn_config=cfg, data=[d], forward_only=True)]))
        r = res.results[0].result
        el = list(r.outputs[0].outputs["elementwise_loss"].float32_data)
        want = [-min(s * a, min(max(s, lo), hi) * a) for a in A]
        assert max(abs(x - y) for x, y in zip(el, want)) < 1e-4, (cfg, el, want)
    # bad masks and configs are refused
    zero = _datum(toks, "gspo")
    zero.loss_fn_inputs["sequence_ratio_mask"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[6], float32_data=[0.0] * 6))
    for it in [bpb.ForwardBackwardItem(adapter_id="gspo", loss_fn="gspo", data=[zero]),
               bpb.ForwardBackwardItem(adapter_id="gspo", loss_fn="gspo", data=[_datum(toks, "ppo")]),
               bpb.ForwardBackwardItem(adapter_id="gspo", loss_fn="gspo", loss_fn_config={"clip_high_threshold": 0.5}, data=[d])]:
        res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[it]))
        assert res.results[0].error.code == INVALID_ARGUMENT, it
    assert "marks no position" in engine.forward_backward(bpb.ForwardBackwardRequest(items=[
        bpb.ForwardBackwardItem(adapter_id="gspo", loss_fn="gspo", data=[zero])])).results[0].error.message


def test_errors(engine):
    res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[
        bpb.ForwardBackwardItem(adapter_id="nope", loss_fn="cross_entropy", data=[_datum([1, 2])]),
        bpb.ForwardBackwardItem(adapter_id="loss", loss_fn="bogus", data=[_datum([1, 2])]),
    ]))
    assert res.results[0].error.code == NOT_FOUND
    assert res.results[1].error.code == INVALID_ARGUMENT and "unknown loss_fn" in res.results[1].error.message
    with pytest.raises(WorkerError) as e:
        engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="x", base_model="Qwen/Qwen3-8B", lora=tpb.LoraConfig(rank=4, train_attn=True)))
    assert e.value.code == INVALID_ARGUMENT and "--model Qwen/Qwen3-8B" in e.value.message


def test_grpc_server_and_sampling(engine, tmp_path, certs, worker_creds):
    import grpc

    from conftest import channel
    from loops_worker.confine import Confinement
    from loops_worker.proto import bgrpc
    from loops_worker.sampler import HFSampler
    from loops_worker.server import serve

    server = serve(engine, HFSampler(engine), "127.0.0.1:0", worker_creds, Confinement([str(tmp_path)]), threads=4)
    try:
        ch = channel(certs, server.bound_port)
        tr, sa = bgrpc.TrainerServiceStub(ch), bgrpc.SamplerServiceStub(ch)
        caps = tr.GetCapabilities(bpb.GetCapabilitiesRequest())
        assert caps.implementation == "torch" and caps.models[0].name == "tiny"
        _train(engine, "samp", steps=1)
        d = str(tmp_path / "s1")
        tr.SaveAdapter(bpb.SaveAdapterRequest(adapter_id="samp", dir=d))
        req = bpb.SampleRequest(base_model="tiny", adapter_dir=d, prompt=[5, 9, 33], num_samples=3,
                                prompt_logprobs=True, topk_prompt_logprobs=2,
                                params=tpb.SamplingParams(max_tokens=5, temperature=0.7, top_p=0.9, seed=3))
        a = sa.Sample(req).result
        b = sa.Sample(req).result
        assert [list(s.tokens) for s in a.sequences] == [list(s.tokens) for s in b.sequences]
        assert all(len(s.tokens) == len(s.logprobs) for s in a.sequences)
        assert math.isnan(a.prompt_logprobs[0]) and len(a.prompt_logprobs) == 3
        assert a.topk_prompt_logprobs.k == 2 and len(a.topk_prompt_logprobs.token_ids) == 6
        # training after the save does not change what the saved folder samples (snapshot)
        _ = engine.optim_step(bpb.OptimStepRequest(adapter_id="samp", adam=tpb.AdamParams(learning_rate=1.0)))
        c = sa.Sample(req).result
        assert [list(s.tokens) for s in a.sequences] == [list(s.tokens) for s in c.sequences]
        with pytest.raises(grpc.RpcError) as e:
            sa.Sample(bpb.SampleRequest(base_model="tiny", prompt=[]))
        assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    finally:
        server.stop(0)


def test_gradient_checkpointing_keeps_lora_gradients(tiny_dir, tmp_path):
    """With activation checkpointing (on by default on GPU) the backward pass recomputes
    layers; the LoRA segments must still be in place then, or the adapter gets wrong (or no)
    gradients. Two engines, with and without checkpointing, must take the same step."""
    import torch

    from loops_worker.engine import BaseModel, Engine

    weights = {}
    for gc in (False, True):
        bm = BaseModel("tiny", tiny_dir, torch.device("cpu"), torch.float32, 64, grad_checkpointing=gc)
        eng = Engine({"tiny": bm}, ["tiny"])
        eng.create_adapter(bpb.CreateAdapterRequest(adapter_id="gc", base_model="tiny",
                                                    lora=tpb.LoraConfig(rank=2, seed=5, train_attn=True, train_mlp=True)))
        # A first step makes B non-zero, so the second step's A gradients depend on the LoRA path.
        for _ in range(2):
            res = eng.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
                adapter_id="gc", loss_fn="cross_entropy", data=[_datum([4, 8, 15, 16, 23, 42])])]))
            assert not res.results[0].HasField("error"), res.results[0].error
            eng.optim_step(bpb.OptimStepRequest(adapter_id="gc", adam=tpb.AdamParams(
                learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-12)))
        out = tmp_path / f"gc-{gc}"
        eng.save_adapter(bpb.SaveAdapterRequest(adapter_id="gc", dir=str(out)))
        from safetensors.torch import load_file
        weights[gc] = load_file(str(out / "adapter_model.safetensors"))
    assert weights[False].keys() == weights[True].keys()
    for k in weights[False]:
        assert torch.allclose(torch.as_tensor(weights[False][k]), torch.as_tensor(weights[True][k]), atol=1e-6), k


def test_gpu_configuration_on_cpu(tiny_dir):
    """The GPU code path (bf16 weights, right-padded batches of unequal rows, activation
    checkpointing), run on the CPU: two adapters in one request train without error and give
    logprobs close to the fp32 path's."""
    import torch

    from loops_worker.engine import BaseModel, Engine

    lps = {}
    for gpu_like in (False, True):
        if gpu_like:
            bm = BaseModel("tiny", tiny_dir, torch.device("cpu"), torch.bfloat16, 64, grad_checkpointing=True, pad=True)
            bm.ctx.lora_dtype = None  # as on GPU: the LoRA branch in the activations' dtype
        else:
            bm = BaseModel("tiny", tiny_dir, torch.device("cpu"), torch.float32, 64)
        eng = Engine({"tiny": bm}, ["tiny"])
        for aid in ("a", "b"):
            eng.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="tiny",
                                                        lora=tpb.LoraConfig(rank=4, seed=3, train_attn=True, train_mlp=True)))
        req = bpb.ForwardBackwardRequest(items=[
            bpb.ForwardBackwardItem(adapter_id="a", loss_fn="cross_entropy", data=[_datum([4, 8, 15, 16, 23, 42])]),
            bpb.ForwardBackwardItem(adapter_id="b", loss_fn="cross_entropy", data=[_datum([7, 9, 11])]),
        ])
        res = eng.forward_backward(req)
        for r in res.results:
            assert not r.HasField("error"), r.error
        eng.optim_step(bpb.OptimStepRequest(adapter_id="a", adam=tpb.AdamParams(learning_rate=1e-2, beta1=0.9, beta2=0.95, eps=1e-12)))
        res = eng.forward_backward(req)
        lps[gpu_like] = [list(r.result.outputs[0].outputs["logprobs"].float32_data) for r in res.results]
    for want, got in zip(lps[False], lps[True]):
        assert len(want) == len(got)
        assert max(abs(x - y) for x, y in zip(want, got)) < 0.1, (want, got)


def test_optim_step_reports_update_norm(engine):
    """update_norm:mean is |W_after - W_before| over the adapter's weights as stored (as the
    reference engine reports it), next to the gradient norm."""
    aid = "updnorm"
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="tiny", lora=tpb.LoraConfig(rank=4, seed=3, train_attn=True)))
    res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id=aid, loss_fn="cross_entropy", data=[_datum([5, 9, 33, 70, 11, 2])])]))
    assert res.results[0].WhichOneof("outcome") == "result", res.results[0]
    before = {k: p.detach().double().clone() for k, p in engine.adapter(aid).params.items()}
    out = engine.optim_step(bpb.OptimStepRequest(adapter_id=aid, adam=tpb.AdamParams(learning_rate=0.01)))
    after = engine.adapter(aid).params
    want = math.sqrt(sum(float((after[k].detach().double() - before[k]).pow(2).sum()) for k in before))
    assert want > 0
    got = out.result.metrics["update_norm:mean"]
    assert abs(got - want) <= 1e-9 * want, (got, want)
    assert out.result.metrics["grad_norm:mean"] > 0


def test_grpc_server_answers_only_the_gateway(engine, tmp_path, certs, worker_creds):
    """Mutual TLS: the gateway is served; a client without a certificate, with another
    gateway's, with the worker's own, with one of the gateway CA that is not the gateway's,
    or in plaintext, reads, saves and deletes nothing."""
    import grpc

    from conftest import channel
    from loops_worker.confine import Confinement
    from loops_worker.proto import bgrpc
    from loops_worker.sampler import HFSampler
    from loops_worker.server import serve

    server = serve(engine, HFSampler(engine), "127.0.0.1:0", worker_creds, Confinement([str(tmp_path)]), threads=4)
    try:
        gw = bgrpc.TrainerServiceStub(channel(certs, server.bound_port))
        assert gw.GetCapabilities(bpb.GetCapabilitiesRequest()).models[0].name == "tiny"
        _train(engine, "victim", steps=1)
        strangers = {
            "no certificate": channel(certs, server.bound_port, client=None),
            "another gateway": channel(certs, server.bound_port, client="other"),
            "the worker's own": channel(certs, server.bound_port, client="wk"),
            "not the gateway": channel(certs, server.bound_port, client="notgw"),
            "plaintext": grpc.insecure_channel(f"127.0.0.1:{server.bound_port}"),
        }
        stolen = tmp_path / "stolen"
        for name, ch in strangers.items():
            tr = bgrpc.TrainerServiceStub(ch)
            for call in (lambda: tr.GetCapabilities(bpb.GetCapabilitiesRequest(), timeout=10),
                         lambda: tr.SaveAdapter(bpb.SaveAdapterRequest(adapter_id="victim", dir=str(stolen), include_optimizer=True), timeout=10),
                         lambda: tr.DeleteAdapter(bpb.DeleteAdapterRequest(adapter_id="victim"), timeout=10)):
                with pytest.raises(grpc.RpcError) as e:
                    call()
                assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED), (name, e.value)
            assert not stolen.exists(), name
        with pytest.raises(grpc.RpcError) as e:
            bgrpc.TrainerServiceStub(strangers["not the gateway"]).GetCapabilities(bpb.GetCapabilitiesRequest(), timeout=10)
        assert e.value.code() == grpc.StatusCode.UNAUTHENTICATED, "a certificate of the gateway CA that is not the gateway's"
        assert "victim" in engine.adapters, "the adapter survived"
    finally:
        server.stop(0)


def test_embed_matches_transformers_and_peft(engine, tiny_dir, tmp_path):
    """SampleRequest.embed: the mean over the prompt of transformers' last hidden state (after
    the final norm), of the base model and with a sampler checkpoint's adapter (PEFT's)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from loops_worker.sampler import HFSampler

    s = HFSampler(engine)
    ids = [5, 9, 33, 70, 11, 2, 17, 18]

    def mean_hidden(m):
        with torch.no_grad():
            out = m(input_ids=torch.tensor([ids]), output_hidden_states=True)
        return out.hidden_states[-1][0].double().mean(0)

    base = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float32)
    base.eval()
    got = s.sample(bpb.SampleRequest(base_model="tiny", prompt=ids, embed=True)).result
    assert len(got.sequences) == 0 and len(got.embedding) == 64
    assert (torch.tensor(list(got.embedding), dtype=torch.float64) - mean_hidden(base)).abs().max() < 1e-5

    _train(engine, "embed")
    out = str(tmp_path / "sampler")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="embed", dir=out))
    tuned = s.sample(bpb.SampleRequest(base_model="tiny", prompt=ids, embed=True, adapter_dir=out)).result
    pm = PeftModel.from_pretrained(base, out)
    pm.eval()
    want = mean_hidden(pm)
    assert (torch.tensor(list(tuned.embedding), dtype=torch.float64) - want).abs().max() < 1e-5
    assert (want - torch.tensor(list(got.embedding), dtype=torch.float64)).abs().max() > 1e-4  # the adapter applies

    for bad in (dict(params=tpb.SamplingParams(max_tokens=1)), dict(prompt_logprobs=True), dict(num_samples=2),
                dict(prompt=[]), dict(prompt=[320])):
        req = bpb.SampleRequest(base_model="tiny", prompt=ids, embed=True)
        for k, v in bad.items():
            if k == "params":
                req.params.CopyFrom(v)
            elif k == "prompt":
                del req.prompt[:]
                req.prompt.extend(v)
            else:
                setattr(req, k, v)
        with pytest.raises(WorkerError) as e:
            s.sample(req)
        assert e.value.code == INVALID_ARGUMENT, bad
