"""Full fine-tuning (LoRA rank 0, loops_worker/full.py): N steps through the worker equal a
plain PyTorch float64 loop with torch.optim.AdamW on the same model and batches; the sampler
checkpoint is a sharded Hugging Face folder that transformers loads unchanged and that the
worker's sampler serves with the server's log-probs; a state save/load (with Adam state and a
pending gradient) resumes bit-identically, with float32 masters under a bf16 model; the
shared base stays frozen; refusals."""

import json
import math
import os

import pytest
import torch

from loops_worker.errors import INVALID_ARGUMENT, RESOURCE_EXHAUSTED, WorkerError
from loops_worker.proto import bpb, tpb

TOL = 1e-5
LR, WD, B1, B2, EPS = 1e-3, 0.01, 0.9, 0.95, 1e-12
# (rows, grad_clip_norm) of each step: the last step's norm is over the clip
STEPS = [([[5, 9, 33, 70, 11, 2], [3, 4, 5]], 0.0),
         ([[7, 8, 9, 10, 11, 12, 13, 14, 15], [40, 41, 42, 43]], 0.0),
         ([[100, 200, 300, 17], [6, 6, 6, 6, 6, 6]], 0.5)]


def _weights(n):
    return [1.0 - 0.1 * i for i in range(n)]


def _datum(toks):
    d = tpb.Datum(tokens=toks)
    n = len(toks)
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=toks[1:] + [0]))
    d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=_weights(n)))
    return d


def _engine(model_dir, dtype, **kw):
    from loops_worker.engine import BaseModel, Engine

    bm = BaseModel("m", model_dir, torch.device("cpu"), dtype, 64)
    return Engine({"m": bm}, ["m"], **kw)


def _create(engine, aid, rank=0, **flags):
    lc = dict(rank=rank, seed=1, train_attn=True, train_mlp=True, train_unembed=True)
    lc.update(flags)
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="m", lora=tpb.LoraConfig(**lc)))


def _fb(engine, aid, rows, forward_only=False):
    res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id=aid, loss_fn="cross_entropy", forward_only=forward_only, data=[_datum(r) for r in rows])]))
    r = res.results[0]
    assert r.WhichOneof("outcome") == "result", r
    return r.result


def _step(engine, aid, clip):
    return engine.optim_step(bpb.OptimStepRequest(adapter_id=aid, adam=tpb.AdamParams(
        learning_rate=LR, beta1=B1, beta2=B2, eps=EPS, weight_decay=WD, grad_clip_norm=clip))).result


def _rel(a, b):
    return float((a.double() - b.double()).abs().max()) / max(1.0, float(b.double().abs().max()))


def test_full_finetune_equals_float64_adamw(tiny_dir):
    from transformers import AutoModelForCausalLM

    engine = _engine(tiny_dir, torch.float64)
    shared = {k: v.clone() for k, v in engine.models["m"].model.state_dict().items()}
    _create(engine, "full")
    run = engine.adapter("full")
    ref = AutoModelForCausalLM.from_pretrained(tiny_dir, dtype=torch.float64)
    # every weight of the model is trained: embedding, layers, norms, head
    assert sorted(run.params) == sorted(n for n, _ in ref.named_parameters())
    opt = torch.optim.AdamW(ref.parameters(), lr=LR, betas=(B1, B2), eps=EPS, weight_decay=WD)
    for rows, clip in STEPS:
        got = _fb(engine, "full", rows)
        want = 0.0
        for r in rows:
            ids = torch.tensor([r])
            lp = torch.log_softmax(ref(input_ids=ids).logits[0], dim=-1)
            # (the weights travel as float32 on the wire)
            tl = -(torch.tensor(_weights(len(r)), dtype=torch.float32).double() * lp[torch.arange(len(r)), torch.tensor(r[1:] + [0])]).sum()
            tl.backward()
            want += float(tl)
        assert abs(got.metrics["loss:sum"] - want) <= TOL * max(1.0, abs(want))
        norm = float(torch.nn.utils.clip_grad_norm_(ref.parameters(), clip if clip > 0 else float("inf")))
        opt.step()
        opt.zero_grad()
        m = _step(engine, "full", clip)
        assert abs(m.metrics["grad_norm:mean"] - norm) <= TOL * max(1.0, norm)
    if STEPS[-1][1] > 0:
        assert norm > STEPS[-1][1]  # the clip was exercised
    for n, p in ref.named_parameters():
        assert _rel(run.params[n], p.detach()) <= TOL, n
        # the run moved every matrix it saw a gradient for
    assert _rel(run.params["model.layers.0.mlp.down_proj.weight"], shared["model.layers.0.mlp.down_proj.base.weight"]) > 1e-6
    # the shared base (LoRA runs and samplers) is untouched
    for k, v in engine.models["m"].model.state_dict().items():
        assert torch.equal(v, shared[k]), k


def test_sampler_checkpoint_is_a_hf_folder(tiny_dir, tmp_path):
    from transformers import AutoModelForCausalLM

    from loops_worker.sampler import HFSampler

    engine = _engine(tiny_dir, torch.float64)
    engine.full_shard_bytes = 256 << 10  # several files for the tiny model
    _create(engine, "full")
    for rows, clip in STEPS[:2]:
        _fb(engine, "full", rows)
        _step(engine, "full", clip)
    d = str(tmp_path / "sampler")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="full", dir=d))
    files = sorted(os.listdir(d))
    shards = [f for f in files if f.startswith("model-") and f.endswith(".safetensors")]
    assert len(shards) >= 2 and "model.safetensors.index.json" in files and "config.json" in files, files
    assert not any(f.startswith("optimizer") for f in files)
    idx = json.load(open(os.path.join(d, "model.safetensors.index.json")))
    assert sorted(set(idx["weight_map"].values())) == shards
    run = engine.adapter("full")
    hf = AutoModelForCausalLM.from_pretrained(d, dtype=torch.float64)
    for n, p in hf.named_parameters():
        assert torch.equal(p.detach(), run.params[n].detach()), n
    prompt = [5, 9, 33, 70, 11, 2, 8]
    server = _fb(engine, "full", [prompt], forward_only=True)
    got = list(server.outputs[0].outputs["logprobs"].float32_data)
    lp = torch.log_softmax(hf(input_ids=torch.tensor([prompt])).logits[0], dim=-1)
    want = [float(lp[i, prompt[i + 1]]) for i in range(len(prompt) - 1)]
    assert max(abs(a - b) for a, b in zip(got, want)) <= 1e-6
    # the worker's sampler serves the folder as that checkpoint's model
    samp = HFSampler(engine)
    res = samp.sample(bpb.SampleRequest(base_model="m", adapter_dir=d, prompt=prompt, num_samples=1, prompt_logprobs=True,
                                        params=tpb.SamplingParams(max_tokens=3, temperature=1.0, seed=5))).result
    assert math.isnan(res.prompt_logprobs[0])
    assert max(abs(a - b) for a, b in zip(list(res.prompt_logprobs)[1:], want)) <= 1e-6
    base = samp.sample(bpb.SampleRequest(base_model="m", prompt=prompt, num_samples=1, prompt_logprobs=True,
                                         params=tpb.SamplingParams(max_tokens=1, seed=5))).result
    assert max(abs(a - b) for a, b in zip(list(base.prompt_logprobs)[1:], want)) > 1e-4  # not the base model


def _snapshot(run):
    return ({k: p.detach().clone() for k, p in run.params.items()},
            {k: p.detach().clone() for k, p in run.model_params.items()},
            {k: v.clone() for k, v in run.exp_avg.items()}, {k: v.clone() for k, v in run.exp_avg_sq.items()}, run.step)


def _same(a, b):
    for x, y in zip(a[:4], b[:4]):
        assert x.keys() == y.keys()
        for k in x:
            assert x[k].dtype == y[k].dtype and torch.equal(x[k], y[k]), k
    assert a[4] == b[4]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_state_round_trip_is_bit_identical(tiny_dir, tmp_path, dtype):
    engine = _engine(tiny_dir, dtype)
    engine.full_shard_bytes = 512 << 10
    _create(engine, "full")
    run = engine.adapter("full")
    if dtype == torch.bfloat16:  # float32 masters; the model computes with them rounded
        assert all(p.dtype == torch.float32 for p in run.params.values())
        assert all(p.dtype == torch.bfloat16 for p in run.model_params.values())
    for rows, clip in STEPS[:2]:
        _fb(engine, "full", rows)
        _step(engine, "full", clip)
    _fb(engine, "full", STEPS[2][0])  # a pending gradient (a slot move between fb and step)
    d = str(tmp_path / "state")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="full", dir=d, include_optimizer=True, include_gradients=True))
    _step(engine, "full", STEPS[2][1])
    after = _fb(engine, "full", STEPS[0][0], forward_only=True)
    want = _snapshot(run)
    engine.delete_adapter("full")
    engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="back", dir=d, load_optimizer=True, load_gradients=True))
    back = engine.adapter("back")
    assert back.step == 2
    _step(engine, "back", STEPS[2][1])
    _same(_snapshot(back), want)
    again = _fb(engine, "back", STEPS[0][0], forward_only=True)
    assert list(again.outputs[0].outputs["logprobs"].float32_data) == list(after.outputs[0].outputs["logprobs"].float32_data)
    if dtype == torch.bfloat16:
        for k, p in back.model_params.items():
            assert torch.equal(p.detach(), back.params[k].detach().to(torch.bfloat16)), k


def test_refusals(tiny_dir, tmp_path):
    engine = _engine(tiny_dir, torch.float32)
    with pytest.raises(WorkerError) as e:
        _create(engine, "x", train_mlp=False)
    assert e.value.code == INVALID_ARGUMENT and "every weight" in e.value.message
    _create(engine, "full")
    with pytest.raises(WorkerError) as e:
        _create(engine, "second")
    assert e.value.code == RESOURCE_EXHAUSTED and "limit of 1" in e.value.message
    # LoRA runs keep sharing the frozen base beside it
    _create(engine, "lora", rank=4)
    d = str(tmp_path / "full")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="full", dir=d, include_optimizer=True))
    with pytest.raises(WorkerError) as e:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="lora", dir=d))
    assert e.value.code == INVALID_ARGUMENT and "rank 0" in e.value.message
    s = str(tmp_path / "sampler")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="full", dir=s))
    with pytest.raises(WorkerError) as e:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="full", dir=s, load_optimizer=True))
    assert e.value.code == INVALID_ARGUMENT and "no optimizer state" in e.value.message
    # a folder whose tensor does not match the model changes nothing
    from safetensors.torch import load_file, save_file

    f = os.path.join(d, "model.safetensors")
    ws = load_file(f)
    k = "model.norm.weight"
    ws[k] = torch.ones(3)
    save_file(ws, f)
    before = engine.adapter("full").params[k].clone()
    with pytest.raises(WorkerError) as e:
        engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="full", dir=d))
    assert e.value.code == INVALID_ARGUMENT and "model.norm.weight" in e.value.message and "shape" in e.value.message
    assert torch.equal(engine.adapter("full").params[k], before)
    # the catalog says which worker serves it
    assert engine.capabilities().models[0].full_finetune
    off = _engine(tiny_dir, torch.float32, full_runs=0)
    assert not off.capabilities().models[0].full_finetune
    with pytest.raises(WorkerError) as e:
        _create(off, "full")
    assert e.value.code == RESOURCE_EXHAUSTED
