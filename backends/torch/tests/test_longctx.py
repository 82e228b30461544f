"""Long context in the torch worker: the chunked loss head and activation checkpointing above
a token threshold give the unchunked, un-checkpointed pass's log-probs, losses and LoRA
gradients (float64, within 1e-6), and really chunk and recompute."""

import functools

import pytest
import torch

from loops_worker.engine import BaseModel, Engine
from loops_worker.proto import bpb, tpb


def _datum(toks):
    d = tpb.Datum(tokens=toks)
    n = len(toks)
    d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[n], int64_data=toks[1:] + [0]))
    w = [0.5 + (i % 3) * 0.25 for i in range(n)]
    d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[n], float32_data=w))
    return d


@functools.lru_cache(maxsize=1)
def _plain(tiny_dir):
    return _run(tiny_dir, 0, 1 << 30)


def _run(tiny_dir, checkpoint_tokens, logits_budget):
    """One training pass of two adapters (rows of two lengths) in float64; returns the
    results, each adapter's gradients, and how often the first layer's attention and the
    head ran (a recomputed layer runs twice, a chunked head once per chunk)."""
    bm = BaseModel("tiny", tiny_dir, torch.device("cpu"), torch.float64, 64,
                   checkpoint_tokens=checkpoint_tokens, logits_budget=logits_budget)
    eng = Engine({"tiny": bm}, ["tiny"])
    for aid, seed in (("a", 1), ("b", 2)):
        eng.create_adapter(bpb.CreateAdapterRequest(adapter_id=aid, base_model="tiny", lora=tpb.LoraConfig(
            rank=4, seed=seed, train_attn=True, train_mlp=True, train_unembed=True)))
        with torch.no_grad():  # B non-zero, so the LoRA path matters to every gradient
            for name, p in eng.adapter(aid).params.items():
                p.data = p.data.double()  # float64 gradients: no float32 rounding of their sums
                p.add_(torch.randn(p.shape, generator=torch.Generator().manual_seed(seed + len(name)), dtype=p.dtype) * 0.05)
    calls = {"attn": 0, "head": 0}
    bm.model.model.layers[0].self_attn.register_forward_hook(lambda *_: calls.__setitem__("attn", calls["attn"] + 1))
    bm.model.lm_head.register_forward_hook(lambda *_: calls.__setitem__("head", calls["head"] + 1))
    g = torch.Generator().manual_seed(7)
    toks = [[int(x) for x in torch.randint(3, 320, (n,), generator=g)] for n in (96, 96, 61)]
    res = eng.forward_backward(bpb.ForwardBackwardRequest(items=[
        bpb.ForwardBackwardItem(adapter_id="a", loss_fn="cross_entropy", data=[_datum(toks[0]), _datum(toks[2])]),
        bpb.ForwardBackwardItem(adapter_id="b", loss_fn="cross_entropy", data=[_datum(toks[1])]),
    ]))
    for r in res.results:
        assert not r.HasField("error"), r.error
    grads = {aid: {n: p.grad.clone() for n, p in eng.adapter(aid).params.items()} for aid in ("a", "b")}
    return res, grads, calls


@pytest.mark.parametrize("checkpoint_tokens,logits_budget", [(0, 320 * 7), (150, 0), (1, 320 * 5)])
def test_chunked_head_and_checkpointing_equal_the_plain_pass(tiny_dir, checkpoint_tokens, logits_budget):
    want, want_g, plain = _plain(tiny_dir)
    got, got_g, calls = _run(tiny_dir, checkpoint_tokens, logits_budget)
    # the plain pass: one head call per length group, each layer once per group
    assert plain == {"attn": 2, "head": 2}
    if checkpoint_tokens:
        # the 2×96-token group is over 150 tokens: its layers ran again in backward
        assert calls["attn"] == (4 if checkpoint_tokens == 1 else 3), calls
    else:
        assert calls["attn"] == 2
    if logits_budget:
        assert calls["head"] > 2 * plain["head"], calls  # chunks, each recomputed in backward
    worst = 0.0
    for w, g in zip(want.results, got.results):
        for wo, go in zip(w.result.outputs, g.result.outputs):
            for key in ("logprobs", "elementwise_loss"):
                a = torch.tensor(list(wo.outputs[key].float32_data), dtype=torch.float64)
                b = torch.tensor(list(go.outputs[key].float32_data), dtype=torch.float64)
                assert a.shape == b.shape and a.numel() > 0
                # float32 on the wire: the float64 values rounded, within a rounding step
                assert torch.allclose(a, b, rtol=2.0 ** -22, atol=0), key
        ws, gs = w.result.metrics["loss:sum"], g.result.metrics["loss:sum"]
        assert abs(ws - gs) <= 1e-6 * abs(ws)
    for aid in want_g:
        assert want_g[aid].keys() == got_g[aid].keys()
        for n in want_g[aid]:
            assert float(want_g[aid][n].abs().max()) > 0, n
            worst = max(worst, float((want_g[aid][n] - got_g[aid][n]).abs().max()))
    assert worst <= 1e-6, worst


def test_model_info_reports_the_planning_inputs(tiny_dir):
    """The ModelInfo fields the gateway's replica plan reads (internal/replicaplan), by hand
    for the tiny Qwen3 (vocab 320, hidden 64, 2 layers, 4 heads and 2 kv heads of 16, MLP
    128, untied): parameters 2·320·64 + 64 + 2 × (2·64 + 2·16 + 64·64 + 2·64·32 + 64·64 +
    3·64·128) = 115072; LoRA per rank 64 + 320 + 2 × (128 + 96 + 96 + 128 + 3·192) = 2432."""
    bm = BaseModel("tiny", tiny_dir, torch.device("cpu"), torch.float32, 64, logits_budget=12345)
    i = bm.info
    assert (i.parameter_count, i.weight_dtype, i.num_layers, i.intermediate_size) == (115072, "float32", 2, 128)
    assert (i.num_attention_heads, i.num_key_value_heads, i.head_dim) == (4, 2, 16)
    assert (i.lora_parameters_per_rank, i.logits_chunk_elements, i.device_memory_bytes) == (2432, 12345, 0)
