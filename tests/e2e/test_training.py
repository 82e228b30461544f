"""Training: forward_backward (proto in/out), forward, optim_step, forward_backward_custom."""

from __future__ import annotations

import numpy as np
import pytest
from tinker import types

from e2e_helpers import (
    BASE_MODEL,
    close,
    encode,
    logprobs_of,
    loss_sum,
    result,
    sft_batch,
    sft_datum,
    train_step,
    weighted_nll,
)


def test_sft_loss_falls(training_client, tokenizer):
    batch = sft_batch(tokenizer)
    losses = []
    for step in range(10):
        loss, opt = train_step(training_client, batch, lr=2e-3)
        assert np.isfinite(loss), f"step {step}: loss {loss}"
        # OptimStepResponse.metrics is optional; when present keys are free-form floats.
        if opt.metrics is not None:
            assert all(isinstance(v, float) for v in opt.metrics.values()), opt.metrics
        losses.append(loss)
    assert losses[-1] < losses[0], f"loss did not fall over 10 steps: {losses}"
    assert np.mean(losses[-3:]) < np.mean(losses[:3]), f"losses={losses}"


def test_forward_backward_outputs(training_client, tokenizer):
    batch = sft_batch(tokenizer)
    out = result(training_client.forward_backward(batch, "cross_entropy"))
    assert len(out.loss_fn_outputs) == len(batch)
    for datum, o in zip(batch, out.loss_fn_outputs, strict=True):
        lp = o["logprobs"]
        assert lp.dtype == "float32"
        n = datum.model_input.length
        assert lp.to_numpy().shape == (n,), f"logprobs shape {lp.shape}, want ({n},)"
        assert np.all(lp.to_numpy() <= 1e-6), "log-probabilities must be <= 0"
    # Every metric key is name:reduction (the SDK's chunk merger requires it).
    for key in out.metrics:
        assert key.count(":") == 1, f"bad metric key {key!r}"
    # loss:sum is -Σ w·logprob, not normalised by the server.
    assert close(loss_sum(out), weighted_nll(batch, out), rel=1e-3, abs_=1e-3), (
        loss_sum(out),
        weighted_nll(batch, out),
    )


def test_forward_only_returns_logprobs_and_does_not_train(training_client, tokenizer):
    batch = sft_batch(tokenizer)
    first = result(training_client.forward(batch, "cross_entropy"))
    assert [lp.shape for lp in logprobs_of(first)] == [(d.model_input.length,) for d in batch]
    # forward() must not accumulate gradients: an optim_step right after it changes
    # nothing (no gradients), and a second forward returns the same logprobs.
    result(training_client.optim_step(types.AdamParams(learning_rate=1e-2)))
    second = result(training_client.forward(batch, "cross_entropy"))
    for a, b in zip(logprobs_of(first), logprobs_of(second), strict=True):
        np.testing.assert_allclose(a, b, rtol=0, atol=1e-6)
    # forward and forward_backward agree on the loss at the same weights.
    fb = result(training_client.forward_backward(batch, "cross_entropy"))
    assert close(loss_sum(first), loss_sum(fb), rel=1e-4)


def test_gradients_accumulate_until_optim_step(service_client, tokenizer):
    # Two forward_backward calls on halves == one call on the whole batch.
    batch = sft_batch(tokenizer)
    a = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=99))
    b = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=99))
    base_a = logprobs_of(result(a.forward(batch, "cross_entropy")))
    base_b = logprobs_of(result(b.forward(batch, "cross_entropy")))
    for x, y in zip(base_a, base_b, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-6, err_msg="same LoRA seed, different init")

    result(a.forward_backward(batch, "cross_entropy"))
    result(a.optim_step(types.AdamParams(learning_rate=5e-3)))
    fa = b.forward_backward(batch[:2], "cross_entropy")
    fb = b.forward_backward(batch[2:], "cross_entropy")
    result(fa), result(fb)
    result(b.optim_step(types.AdamParams(learning_rate=5e-3)))

    after_a = logprobs_of(result(a.forward(batch, "cross_entropy")))
    after_b = logprobs_of(result(b.forward(batch, "cross_entropy")))
    for x, y in zip(after_a, after_b, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4)
    assert any(not np.allclose(x, y, atol=1e-6) for x, y in zip(base_a, after_a)), (
        "optim_step did not change the model"
    )


def test_weights_can_be_negative(training_client, tokenizer):
    # forward_backward_custom relies on arbitrary real weights; check the server accepts
    # them and still reports loss:sum = -Σ w·lp.
    sentence = "negative weights are fine"
    tokens = encode(tokenizer, sentence)
    d = sft_datum(tokens)
    n = d.model_input.length
    weights = [(-1.0 if i % 2 else 0.5) for i in range(n)]
    datum = types.Datum(
        model_input=d.model_input,
        loss_fn_inputs={"target_tokens": tokens[1:], "weights": weights},
    )
    out = result(training_client.forward_backward([datum], "cross_entropy"))
    assert close(loss_sum(out), weighted_nll([datum], out), rel=1e-3, abs_=1e-3), sentence


def test_seq_ids_pipeline_many_requests(training_client, tokenizer):
    # Submit many ops without waiting (the SDK pipelines POSTs; the server must run
    # them in seq_id order), then wait for all.
    batch = sft_batch(tokenizer)[:2]
    futures = []
    for _ in range(5):
        futures.append(training_client.forward_backward(batch, "cross_entropy"))
        futures.append(training_client.optim_step(types.AdamParams(learning_rate=1e-3)))
    outs = [result(f) for f in futures]
    losses = [loss_sum(o) for o in outs[0::2]]
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0], f"pipelined training did not reduce loss: {losses}"


@pytest.mark.needs_torch
def test_forward_backward_custom_matches_cross_entropy(service_client, tokenizer):
    import torch

    batch = sft_batch(tokenizer)
    a = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=5))
    b = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=5))

    def custom_ce(data, logprobs_list):
        loss = torch.zeros(())
        for datum, lp in zip(data, logprobs_list, strict=True):
            w = torch.tensor(datum.loss_fn_inputs["weights"].to_numpy())
            loss = loss - (lp * w).sum()
        return loss, {"custom_ce:sum": float(loss.detach())}

    custom = result(a.forward_backward_custom(batch, custom_ce))
    ce = result(b.forward_backward(batch, "cross_entropy"))
    assert close(loss_sum(custom), loss_sum(ce), rel=1e-4), (custom.metrics, ce.metrics)
    assert "surrogate_loss:sum" in custom.metrics
    result(a.optim_step(types.AdamParams(learning_rate=5e-3)))
    result(b.optim_step(types.AdamParams(learning_rate=5e-3)))
    for x, y in zip(
        logprobs_of(result(a.forward(batch, "cross_entropy"))),
        logprobs_of(result(b.forward(batch, "cross_entropy"))),
        strict=True,
    ):
        np.testing.assert_allclose(x, y, atol=1e-4)


@pytest.mark.feature("rl_losses")
@pytest.mark.parametrize(
    "loss_fn,config",
    [
        ("importance_sampling", None),
        ("ppo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        ("cispo", {"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}),
        ("dro", {"beta": 0.1}),
    ],
)
def test_rl_losses_accept_inputs(training_client, tokenizer, loss_fn, config):
    tokens = encode(tokenizer, "reinforcement learning from a tiny model")
    n = len(tokens) - 1
    fwd = result(training_client.forward([sft_datum(tokens)], "cross_entropy"))
    sampler_lp = logprobs_of(fwd)[0].astype(np.float32)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": sampler_lp.tolist(),
            "advantages": [1.0] * n,
        },
    )
    out = result(training_client.forward_backward([datum], loss_fn, config))
    assert np.isfinite(loss_sum(out))
    assert logprobs_of(out)[0].shape == (n,)
    # At lp == q (r = 1) with A = 1: importance_sampling and ppo give -Σ A = -n;
    # cispo gives -Σ A·lp and dro -Σ (lp·A - ½β·0) = -Σ lp.
    if loss_fn in ("importance_sampling", "ppo"):
        expect = -float(n)
    else:
        expect = -float(sampler_lp.astype(np.float64).sum())
    assert close(loss_sum(out), expect, rel=1e-3, abs_=1e-3), (loss_fn, out.metrics, expect)


@pytest.mark.feature("rl_losses")
def test_gspo_clips_the_sequence_ratio(training_client, tokenizer):
    """gspo through the SDK with its sequence_ratio_mask: every position carries the sequence
    ratio s (geometric mean over the marked positions), clipped to [0.9997, 1.0004] by default."""
    tokens = encode(tokenizer, "group sequence policy optimization on a tiny model")
    n = len(tokens) - 1
    lp = logprobs_of(result(training_client.forward([sft_datum(tokens)], "cross_entropy")))[0].astype(np.float64)
    mask = [0.0] * 2 + [1.0] * (n - 2)
    # every marked position's ratio is 1.1, so s = 1.1; the unmarked ones' do not count
    q = np.where(np.array(mask) > 0, lp - np.log(1.1), lp - np.log(5.0)).astype(np.float32)
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={
            "target_tokens": tokens[1:],
            "logprobs": q.tolist(),
            "advantages": [1.0] * n,
            "sequence_ratio_mask": mask,
        },
    )
    out = result(training_client.forward([datum], "gspo"))
    assert close(loss_sum(out), -1.0004 * n, rel=1e-4), out.metrics  # A > 0 above the band: clipped
    wide = result(training_client.forward([datum], "gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}))
    assert close(loss_sum(wide), -1.1 * n, rel=1e-4), wide.metrics
    out = result(training_client.forward_backward([datum], "gspo", {"clip_low_threshold": 0.5, "clip_high_threshold": 2.0}))
    assert close(loss_sum(out), -1.1 * n, rel=1e-4), out.metrics


@pytest.mark.feature("rl_losses")
@pytest.mark.parametrize("loss_fn,why", [
    ("stable_reinforce", "publishes its inputs (sampling with record_stability_info and datum provenance) but not its objective"),
    ("dppo", "publishes no formula"),
])
def test_unpublished_losses_are_refused_with_the_reason(training_client, tokenizer, loss_fn, why):
    tokens = encode(tokenizer, "a loss without a published objective")
    n = len(tokens) - 1
    datum = types.Datum(
        model_input=types.ModelInput.from_ints(tokens[:-1]),
        loss_fn_inputs={"target_tokens": tokens[1:], "logprobs": [-1.0] * n, "advantages": [1.0] * n},
    )
    with pytest.raises(Exception) as excinfo:
        result(training_client.forward_backward([datum], loss_fn))
    assert why in str(excinfo.value), str(excinfo.value)


@pytest.mark.feature("errors")
def test_dimuon_is_refused_at_create_naming_adamw(service_client):
    with pytest.raises(Exception) as excinfo:
        result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4, optimizer=types.DimuonOptimizerConfig()), timeout=120)
    assert 'Loops trains with "adamw" only' in str(excinfo.value), str(excinfo.value)
