"""Tied embeddings with train_unembed: the head LoRA adapts the shared matrix.

On a model whose input embedding and head are one matrix W, an adapter's unembedding LoRA
adds ΔW = scale·B·A wherever W is used (logits and embedding lookup), as PEFT 0.21's
ensure_weight_tying does. Checked in float64 against PEFT: log-probs and the gradients of
A and B (PEFT keeps the head's and the embedding's factors as separate leaves that share
storage, so its gradient of the shared matrix's factors is the sum of the two). A checkpoint
without ensure_weight_tying (written before the rule) keeps the head-only rule.
"""

import json
import os
import warnings

import pytest
import torch

from loops_worker.proto import bpb, tpb

IDS = [5, 9, 33, 70, 11, 2, 17, 18, 5, 300]
WEIGHTS = [1.0, 0.5, 1.0, 2.0, 1.0, 1.0, 0.0, 1.0, 1.0, 1.0]


@pytest.fixture(scope="module")
def tied_dir(tmp_path_factory):
    from transformers import Qwen3Config, Qwen3ForCausalLM

    d = tmp_path_factory.mktemp("tiny-qwen3-tied")
    cfg = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=True, rms_norm_eps=1e-6, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(4321)
    Qwen3ForCausalLM(cfg).save_pretrained(str(d))
    return str(d)


@pytest.fixture(scope="module")
def tied_engine(tied_dir):
    from loops_worker.engine import BaseModel, Engine

    bm = BaseModel("tied", tied_dir, torch.device("cpu"), torch.float64, 64)
    return Engine({"tied": bm}, ["tied"])


def _datum(ids, weights):
    n = len(ids)
    d = tpb.Datum(tokens=ids)
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=ids[1:] + [0]))
    d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=weights))
    return d


def _trained(engine, aid):
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="tied", lora=tpb.LoraConfig(
        rank=4, seed=7, train_attn=True, train_mlp=True, train_unembed=True)))
    for s in range(2):
        res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id=aid, loss_fn="cross_entropy", data=[_datum([5 + s, 9, 33, 70, 11, 2], [1.0] * 6)])]))
        assert res.results[0].WhichOneof("outcome") == "result", res.results[0]
        engine.optim_step(bpb.OptimStepRequest(adapter_id=aid, adam=tpb.AdamParams(learning_rate=0.05)))
    return engine.adapter(aid)


def _worker_pass(engine, aid):
    """The worker's log-probs of IDS and its gradients of every adapter tensor (float64)."""
    ad = engine.adapter(aid)
    ad.zero_grad()
    res = engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id=aid, loss_fn="cross_entropy", data=[_datum(IDS, WEIGHTS)])]))
    lp = torch.tensor(list(res.results[0].result.outputs[0].outputs["logprobs"].float32_data), dtype=torch.float64)
    grads = {k: p.grad.detach().clone() for k, p in ad.params.items()}
    ad.zero_grad()
    return lp, grads


def _peft_pass(tied_dir, adapter_dir):
    """PEFT's float64 log-probs of IDS and its gradient of each adapter tensor as Loops names
    it (the head's factors; for a tied adapter plus the embedding's, transposed)."""
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    base = AutoModelForCausalLM.from_pretrained(tied_dir, dtype=torch.float64)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel.from_pretrained(base, adapter_dir, is_trainable=True)
    logits = pm(input_ids=torch.tensor([IDS])).logits[0]
    lp = torch.log_softmax(logits, -1).gather(-1, torch.tensor(IDS[1:] + [0])[:, None])[:, 0]
    (-(lp * torch.tensor(WEIGHTS, dtype=torch.float64)).sum()).backward()
    named = dict(pm.named_parameters())
    grads = {}
    for n, p in named.items():
        if ".lora_A." in n or ".lora_B." in n:
            grads[n.replace(".default.weight", ".weight")] = p.grad.detach().clone()
    ea = named.get("base_model.model.model.embed_tokens.lora_embedding_A.default")
    eb = named.get("base_model.model.model.embed_tokens.lora_embedding_B.default")
    if ea is not None:
        head_a, head_b = named["base_model.model.lm_head.lora_A.default.weight"], named["base_model.model.lm_head.lora_B.default.weight"]
        # the head's A is the embedding's B transposed (one storage): one matrix, two leaves
        assert head_a.data_ptr() == eb.data_ptr() and head_b.data_ptr() == ea.data_ptr()
        grads["base_model.model.lm_head.lora_A.weight"] += eb.grad.T
        grads["base_model.model.lm_head.lora_B.weight"] += ea.grad.T
    return lp.detach(), grads


def _max_diff(a, b):
    return float((a - b).abs().max())


def test_tied_unembed_matches_peft_ensure_weight_tying(tied_engine, tied_dir, tmp_path):
    bm = tied_engine.model("tied")
    assert bm.tied
    ad = _trained(tied_engine, "tied")
    assert ad.tied_embed
    out = str(tmp_path / "new")
    tied_engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="tied", dir=out))
    with open(os.path.join(out, "adapter_config.json")) as f:
        assert json.load(f)["ensure_weight_tying"] is True
    lp, grads = _worker_pass(tied_engine, "tied")
    want_lp, want_grads = _peft_pass(tied_dir, out)
    # the worker's log-probs leave it as float32
    assert _max_diff(lp, want_lp) < 1e-6
    head = "base_model.model.lm_head"
    assert set(grads) == set(want_grads)
    worst = 0.0
    for k, g in grads.items():
        scale = float(want_grads[k].abs().max())
        worst = max(worst, _max_diff(g, want_grads[k]) / max(scale, 1e-12))
    # logits are float32 in the worker's head (the rest is float64)
    assert worst < 1e-5, worst
    # the embedding's share is there: the head's alone differs by far more
    lp_head, grads_head = _peft_pass_head_only(tied_dir, out, tmp_path)
    assert _max_diff(want_lp, lp_head) > 1e-3
    assert _max_diff(grads[head + ".lora_A.weight"], grads_head[head + ".lora_A.weight"]) > 1e3 * worst * float(
        want_grads[head + ".lora_A.weight"].abs().max())

    # sampling (the KV-cache prefill and decoding) uses the adapted embedding too
    with torch.no_grad():
        bm.ctx.segments = [(0, 1 << 30, ad)]
        try:
            cached = bm.model(input_ids=torch.tensor([IDS]), use_cache=True).logits[0]
        finally:
            bm.ctx.segments = []
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        pm = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tied_dir, dtype=torch.float64), out)
    with torch.no_grad():
        assert _max_diff(cached, pm(input_ids=torch.tensor([IDS])).logits[0]) < 1e-9


def _without_marker(src, dst):
    os.makedirs(dst, exist_ok=True)
    for name in os.listdir(src):
        with open(os.path.join(src, name), "rb") as f:
            b = f.read()
        if name == "adapter_config.json":
            c = json.loads(b)
            c.pop("ensure_weight_tying", None)
            b = json.dumps(c).encode()
        with open(os.path.join(dst, name), "wb") as f:
            f.write(b)


def _peft_pass_head_only(tied_dir, adapter_dir, tmp_path):
    old = str(tmp_path / "head-only")
    _without_marker(adapter_dir, old)
    return _peft_pass(tied_dir, old)


def test_old_checkpoint_keeps_head_only(tied_engine, tied_dir, tmp_path):
    """A checkpoint without ensure_weight_tying (as written before the rule) loads, computes
    and resumes with the head-only rule: PEFT's lm_head LoRA without weight tying."""
    _trained(tied_engine, "src")
    new = str(tmp_path / "new")
    tied_engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="src", dir=new, include_optimizer=True))
    old = str(tmp_path / "old")
    _without_marker(new, old)
    tied_engine.load_adapter(bpb.LoadAdapterRequest(adapter_id="old", dir=old, load_optimizer=True))
    assert not tied_engine.adapter("old").tied_embed
    lp, grads = _worker_pass(tied_engine, "old")
    want_lp, want_grads = _peft_pass(tied_dir, old)
    assert _max_diff(lp, want_lp) < 1e-6
    for k, g in grads.items():
        assert _max_diff(g, want_grads[k]) / max(float(want_grads[k].abs().max()), 1e-12) < 1e-5, k
    # resumed and saved again: still the old rule
    tied_engine.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="old", loss_fn="cross_entropy", data=[_datum(IDS, WEIGHTS)])]))
    tied_engine.optim_step(bpb.OptimStepRequest(adapter_id="old", adam=tpb.AdamParams(learning_rate=0.05)))
    again = str(tmp_path / "again")
    tied_engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="old", dir=again))
    with open(os.path.join(again, "adapter_config.json")) as f:
        assert "ensure_weight_tying" not in json.load(f)


def test_untied_model_is_unchanged(engine, tmp_path):
    """On an untied model the head LoRA stays the head's, and no marker is written."""
    assert not engine.model("tiny").tied
    engine.create_adapter(bpb.CreateAdapterRequest(adapter_id="untied-head", base_model="tiny", lora=tpb.LoraConfig(
        rank=2, train_unembed=True)))
    assert not engine.adapter("untied-head").tied_embed
    out = str(tmp_path / "u")
    engine.save_adapter(bpb.SaveAdapterRequest(adapter_id="untied-head", dir=out))
    with open(os.path.join(out, "adapter_config.json")) as f:
        assert "ensure_weight_tying" not in json.load(f)
