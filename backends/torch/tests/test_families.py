"""Parity of every model family (loops_worker/families/) against transformers + PEFT.

For each family a tiny random model is written from a fixed seed and loaded in float64 by
the worker and by transformers. Checked: log-probs of the base model; log-probs with a
non-zero adapter against PEFT loaded from the worker's saved folder (rows of two adapters
and the base model in one pass); every LoRA gradient against PEFT's; after optimizer steps
through the engine's API the saved adapter loaded in PEFT reproduces the worker's
log-probs; seeded sampling repeats and its log-probs are PEFT's. The max |Δ| figures are
printed (pytest -s) as PARITY lines.
"""

import json
import os

import pytest
import torch

from family_models import COMMON, CONFIGS, FAMILY_OF, REMOTE_CODE, VISION_OF, VL_CONFIGS, build
from loops_worker.proto import bpb, tpb

SEQ = [5, 9, 33, 70, 11, 2, 17, 18, 200, 7, 41, 12]
SEQ2 = [8, 1, 300, 4, 19, 64, 3, 250, 6, 77, 90, 15]


# MiniMax-M2's router computes in float32 (sigmoid(logits.float())), so transformers' own
# log-probs of a row depend on what it is batched with by ~6e-8 (PEFT on [SEQ, SEQ2] against
# PEFT on [SEQ]); a batched row is held to that, a row alone to 1e-10 like every family.
# DeepSeek-V3's router also computes in float32 (F.linear on float32 copies): on the Kimi K2.5
# miniature a batched row differs from PEFT's row alone by ~1.2e-8 (its other miniatures' routing
# margins happen to absorb that rounding).
# DeepSeek-V4's transformers code keeps its q/kv norms, sinks, compressor position biases and
# router in float32 (and rotates in float32): a batched row differs by ~2e-7, a row alone by 1e-15.
BATCH_TOL = {"minimax_m2": 1e-6, "nemotron_h": 1e-6, "kimi_k25": 1e-6, "deepseek_v4": 1e-6}
# Nemotron-H's transformers code runs its Mamba-2 scan and router in float32 and returns
# float32 logits, so its own log-probs carry float32 rounding (~1e-8) even in a float64 model.
LP_TOL = {"nemotron_h": 1e-6}


def hf(d):
    """transformers' model of folder d in float64; a VL checkpoint's full VL model."""
    from transformers import AutoModelForCausalLM, AutoModelForImageTextToText

    from loops_worker.families import BY_MODEL_TYPE, VISION_TYPES, load_config

    mt = json.load(open(os.path.join(d, "config.json")))["model_type"]
    kw = {"experts_implementation": "eager"} if BY_MODEL_TYPE[mt].experts else {}  # no float64 grouped_mm
    if BY_MODEL_TYPE[mt].loads_as:  # remote code in the checkpoint: transformers' own model of it
        kw["config"] = load_config(d)[0]
    auto = AutoModelForImageTextToText if mt in VISION_TYPES else AutoModelForCausalLM
    m = auto.from_pretrained(d, dtype=torch.float64, attn_implementation="eager", **kw)
    m.eval()
    return m


def hf_logprobs(model, seq):
    out = model(input_ids=torch.tensor([seq]))
    lp = torch.log_softmax(out.logits[0].double(), -1)
    return lp[torch.arange(len(seq) - 1), torch.tensor(seq[1:])]


def targets(seq):
    """The next-token targets of seq as the engine takes them ([n, 1], the last one unused)."""
    return torch.tensor(seq[1:] + [0], dtype=torch.long).reshape(-1, 1)


def _datum(toks):
    d = tpb.Datum(tokens=toks)
    n = len(toks)
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=toks[1:] + [0]))
    d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=[1.0] * (n - 1) + [0.0]))
    return d


@pytest.mark.parametrize("family", list(CONFIGS) + list(VL_CONFIGS))
def test_family_parity(family, tmp_path):
    from peft import PeftModel

    from loops_worker.engine import BaseModel, Engine
    from loops_worker.sampler import HFSampler

    d = build(family, tmp_path / "model")
    bm = BaseModel("m", d, torch.device("cpu"), torch.float64, 64, attn_impl="eager")
    case, family = family, FAMILY_OF[family]
    assert bm.family.name == family
    # the catalog entry (ModelInfo) names the family, its publisher, renderer and targets
    info = bm.info
    assert (info.family, info.publisher, info.renderer) == (family, bm.family.publisher, bm.family.renderer)
    if case in VL_CONFIGS:  # keys are the VL model's (PEFT on it)
        if bm.family.images:  # the full model: the vision tower loaded, frozen, not adapted (tests/test_vision.py)
            assert bm.full_vl and any("visual" in n for n, _ in bm.model.named_modules())
        else:  # the vision tower is not loaded
            assert not any("visual" in n for n, _ in bm.model.named_modules())
        assert all(k.startswith(("base_model.model.model.language_model.", "base_model.model.lm_head")) for k in bm.layers)
    assert set(info.lora_targets) <= set(bm.family.targets()) and "lm_head" in info.lora_targets
    assert set(bm.family.experts) <= set(info.lora_targets) and set(bm.family.attn) & set(info.lora_targets)
    # image chunks are refused: no vision tower served, or (qwen3_5) no preprocessor_config.json
    assert list(info.modalities) == ["text"]
    # what converting its adapters to Tinker's layout needs (docs/export-import.md)
    assert info.language_model_prefix == ("model.language_model." if case in VL_CONFIGS else "")
    assert info.tied_embeddings == bool(json.load(open(os.path.join(d, "config.json"))).get("tie_word_embeddings"))
    eng = Engine({"m": bm}, ["m"])
    ref = hf(d)
    stats = {}

    # 1. the base model
    with torch.no_grad():
        got = bm.token_logprobs([SEQ], [None], [targets(SEQ)], False)[0][:, 0]
        want = hf_logprobs(ref, SEQ)
    stats["base"] = float((got[:-1] - want).abs().max())
    assert stats["base"] < LP_TOL.get(family, 1e-10), stats

    # 2. a non-zero adapter (B random), saved and loaded in PEFT; two adapters and the base in one pass
    lora = tpb.LoraConfig(rank=4, seed=7, train_attn=True, train_mlp=True, train_unembed=True)
    for aid in ("a", "b"):
        eng.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="m", lora=lora))
    g = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for aid in ("a", "b"):
            for name, p in eng.adapter(aid).params.items():
                if ".lora_B." in name:
                    p.copy_(torch.randn(p.shape, generator=g, dtype=torch.float32) * 0.1)
    a, b = eng.adapter("a"), eng.adapter("b")
    if bm.family.experts:  # every fused expert parameter is adapted, per expert at rank r
        from loops_worker.lora import MultiLoraExperts

        ek = [k for k, t in bm.layers.items() if t.experts > 1]
        moe_layers = sum(isinstance(m, MultiLoraExperts) for m in bm.model.modules())
        assert moe_layers >= 1 and len(ek) == 2 * moe_layers and all(a.pairs[k][0].shape[0] == 4 * bm.layers[k].experts for k in ek)
    sa = str(tmp_path / "a")
    eng.save_adapter(bpb.SaveAdapterRequest(adapter_id="a", dir=sa))
    cfg = json.load(open(os.path.join(sa, "adapter_config.json")))
    assert cfg.get("target_parameters", []) == list(bm.family.experts)
    pm = PeftModel.from_pretrained(ref, sa)
    pm.eval()
    with torch.no_grad():
        seqs = [SEQ, SEQ2, SEQ, SEQ2]
        rows = bm.token_logprobs(seqs, [a, a, b, None], [targets(s) for s in seqs], False)
        want_a = hf_logprobs(pm, SEQ)
        want_a2 = hf_logprobs(pm, SEQ2)
        with pm.disable_adapter():
            want_base2 = hf_logprobs(pm, SEQ2)
        single = bm.token_logprobs([SEQ], [a], [targets(SEQ)], False)[0]
    stats["lora"] = float((single[:-1, 0] - want_a).abs().max())
    assert stats["lora"] < LP_TOL.get(family, 1e-10), stats
    # the rows of the mixed pass (adapter a, a, b and the base model)
    stats["mixed"] = max(float((rows[0][:-1, 0] - want_a).abs().max()), float((rows[1][:-1, 0] - want_a2).abs().max()),
                         float((rows[3][:-1, 0] - want_base2).abs().max()))
    assert stats["mixed"] < BATCH_TOL.get(family, 1e-10), stats
    assert float((rows[2][:-1, 0] - rows[0][:-1, 0]).abs().max()) > 1e-6, "adapter b differs from a"

    # 3. LoRA gradients of a summed cross-entropy against PEFT's
    lp = bm.token_logprobs([SEQ], [a], [targets(SEQ)], True)[0]
    (-lp[:-1, 0].sum()).backward()
    bm.end_pass()
    pm.zero_grad()
    for n, p in pm.named_parameters():
        p.requires_grad_("lora_" in n)
    (-hf_logprobs(pm, SEQ).sum()).backward()
    peft_grads = {n.replace(".default.", "."): p.grad for n, p in pm.named_parameters() if "lora_" in n}
    # a tied model (ensure_weight_tying): PEFT's embedding factors are the head's, transposed
    # (lora_embedding_A = Bᵀ, lora_embedding_B = Aᵀ), and the worker's gradient is the sum
    emb = "base_model.model.model.language_model.embed_tokens" if case in VL_CONFIGS else "base_model.model.model.embed_tokens"
    ea = peft_grads.pop(emb + ".lora_embedding_A.default", None)
    eb = peft_grads.pop(emb + ".lora_embedding_B.default", None)
    if ea is not None and eb is not None:
        peft_grads["base_model.model.lm_head.lora_A.weight"] = peft_grads["base_model.model.lm_head.lora_A.weight"] + eb.T
        peft_grads["base_model.model.lm_head.lora_B.weight"] = peft_grads["base_model.model.lm_head.lora_B.weight"] + ea.T
    assert set(peft_grads) == set(a.params), sorted(set(peft_grads) ^ set(a.params))
    gd, gmax = 0.0, 0.0
    for n, p in a.params.items():
        assert p.grad is not None, n
        gd = max(gd, float((p.grad.double() - peft_grads[n].double()).abs().max()))
        gmax = max(gmax, float(peft_grads[n].abs().max()))
    stats["grad"], stats["grad_rel"] = gd, gd / gmax
    assert gd / gmax < 1e-6, stats  # the adapter's tensors (and so their .grad) are float32
    a.zero_grad()

    # 4. train through the engine's API, save, load in PEFT: the same log-probs
    for s in range(3):
        res = eng.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id="a", loss_fn="cross_entropy", data=[_datum(SEQ), _datum(SEQ2[: 8 + s])])]))
        assert res.results[0].WhichOneof("outcome") == "result", res.results[0]
        eng.optim_step(bpb.OptimStepRequest(adapter_id="a", adam=tpb.AdamParams(learning_rate=0.02)))
    st = str(tmp_path / "trained")
    eng.save_adapter(bpb.SaveAdapterRequest(adapter_id="a", dir=st))
    res = eng.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="a", loss_fn="cross_entropy", data=[_datum(SEQ)], forward_only=True)]))
    served = torch.tensor(list(res.results[0].result.outputs[0].outputs["logprobs"].float32_data), dtype=torch.float64)
    pt = PeftModel.from_pretrained(hf(d), st)
    pt.eval()
    with torch.no_grad():
        want_t = hf_logprobs(pt, SEQ)
    stats["trained"] = float((served[:-1] - want_t).abs().max())
    assert stats["trained"] < 1e-5, stats  # the wire carries float32
    assert float((want_t - want_a).abs().max()) > 1e-4, "training changed the adapter"
    # and PEFT's own save of it loads back into the worker with the same log-probs
    pt.save_pretrained(str(tmp_path / "peft-saved"), save_embedding_layers=False)
    eng.load_adapter(bpb.LoadAdapterRequest(adapter_id="back", dir=str(tmp_path / "peft-saved")))
    res2 = eng.forward_backward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
        adapter_id="back", loss_fn="cross_entropy", data=[_datum(SEQ)], forward_only=True)]))
    assert list(res2.results[0].result.outputs[0].outputs["logprobs"].float32_data) == served.float().tolist()

    # 5. seeded sampling from the saved adapter repeats, and its log-probs are PEFT's
    samp = HFSampler(eng)
    req = bpb.SampleRequest(base_model="m", adapter_dir=st, prompt=SEQ[:5], num_samples=2,
                            params=tpb.SamplingParams(max_tokens=6, temperature=1.0, seed=11))
    r1, r2 = samp.sample(req).result, samp.sample(req).result
    assert [list(s.tokens) for s in r1.sequences] == [list(s.tokens) for s in r2.sequences]
    sd = 0.0
    for s in r1.sequences:
        full = SEQ[:5] + list(s.tokens)
        with torch.no_grad():
            w = hf_logprobs(pt, full)[4:]
        sd = max(sd, max(abs(x - float(y)) for x, y in zip(s.logprobs, w)))
    stats["sample"] = sd
    assert sd < 1e-5, stats
    print(f"PARITY {case}: " + " ".join(f"{k}={v:.2e}" for k, v in stats.items()))


def test_unknown_family_is_refused(tmp_path):
    from transformers import AutoConfig

    from loops_worker import families
    from loops_worker.engine import BaseModel

    d = tmp_path / "mamba"
    d.mkdir()
    AutoConfig.for_model("mamba", vocab_size=64, hidden_size=16, num_hidden_layers=1).save_pretrained(str(d))
    with pytest.raises(ValueError) as e:
        BaseModel("m", str(d), torch.device("cpu"), torch.float32, 8)
    msg = str(e.value)
    assert "'mamba'" in msg and "qwen3_moe" in msg and "docs/models.md" in msg
    # a model_type transformers implements but the worker cannot serve says why
    AutoConfig.for_model("glm5_next", text_config=dict(vocab_size=64, hidden_size=16, num_hidden_layers=1)).save_pretrained(str(d))
    with pytest.raises(ValueError) as e:
        BaseModel("m", str(d), torch.device("cpu"), torch.float32, 8)
    assert "'glm5_next'" in str(e.value) and "no causal LM" in str(e.value), str(e.value)
    # a Kimi K2 checkpoint transformers' DeepSeek-V3 does not compute, or a quantized one, is refused by name
    for extra, want in ((dict(scoring_func="softmax"), "scoring_func"), (dict(quantization_config={"quant_method": "fp8"}), "bf16")):
        raw = {**COMMON, **CONFIGS["kimi_k2"][1], **REMOTE_CODE["kimi_k2"], **extra}
        with open(d / "config.json", "w") as f:
            json.dump(raw, f)
        with pytest.raises(ValueError) as e:
            BaseModel("m", str(d), torch.device("cpu"), torch.float32, 8)
        assert "kimi_k2 model refused" in str(e.value) and want in str(e.value), str(e.value)
    # a MoE config whose router loss transformers would add to the training loss is refused,
    # as on the reference engine; off (the released checkpoints) or at coefficient 0 it loads
    moe = AutoConfig.for_model("qwen3_moe", vocab_size=64, hidden_size=16, num_hidden_layers=1, num_experts=4,
                               output_router_logits=True, router_aux_loss_coef=0.01)
    with pytest.raises(ValueError) as e:
        families.for_config(moe)
    assert "qwen3_moe model refused" in str(e.value) and "output_router_logits" in str(e.value), str(e.value)
    for off in (dict(output_router_logits=False), dict(router_aux_loss_coef=0.0)):
        assert families.for_config(AutoConfig.for_model("qwen3_moe", vocab_size=64, hidden_size=16, num_hidden_layers=1,
                                                        num_experts=4, **{"output_router_logits": True, **off})).name == "qwen3_moe"
    # every family file names its publisher and renderer, and no model_type twice
    for f in families.FAMILIES:
        assert f.publisher and f.renderer and (f.model_types or f.vision)


def test_default_attention_is_the_familys(tmp_path):
    """--attn-implementation auto (the default) asks transformers for sdpa, or for eager where
    the family offers no sdpa (gpt-oss, whose attention sinks sdpa cannot compute): before, the
    worker asked every family for sdpa and a gpt-oss worker exited at start."""
    from loops_worker.engine import BaseModel

    for family, want in (("gpt_oss", "eager"), ("qwen3", "sdpa")):
        bm = BaseModel("m", build(family, tmp_path / family), torch.device("cpu"), torch.float32, 8)
        assert bm.model.config._attn_implementation == want, family


def test_vision_checkpoint_refusals(tmp_path):
    """A multimodal Gemma 3 config with final_logit_softcapping (applied by Gemma3ForCausalLM,
    not by Gemma3ForConditionalGeneration) is refused at load, naming the field."""
    from transformers import AutoConfig

    from loops_worker.engine import BaseModel

    d = tmp_path / "g3"
    d.mkdir()
    text = {**COMMON, **CONFIGS["gemma3"][1]}
    AutoConfig.for_model("gemma3", text_config=text, vision_config=VISION_OF["gemma3"]).save_pretrained(str(d))
    with pytest.raises(ValueError) as e:
        BaseModel("m", str(d), torch.device("cpu"), torch.float32, 8)
    assert "gemma3 model refused" in str(e.value) and "final_logit_softcapping" in str(e.value)

