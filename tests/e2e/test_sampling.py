"""Sampling: save_weights_and_get_sampling_client, sample (proto SampleResponse),
compute_logprobs, named sampler weights, base-model sampling."""

from __future__ import annotations

import math
import pickle

import numpy as np
import pytest
import tinker
from tinker import types

from e2e_helpers import (
    BASE_MODEL,
    encode,
    logprobs_of,
    result,
    sft_batch,
    sft_datum,
    train_step,
)


@pytest.fixture(scope="module")
def trained(service_client, tokenizer):
    """A training client after two SFT steps, and a sampling client on its weights."""
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=3))
    batch = sft_batch(tokenizer)
    for _ in range(2):
        train_step(tc, batch, lr=2e-3)
    sc = result(tc.save_weights_and_get_sampling_client())
    return tc, sc


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return types.ModelInput.from_ints(encode(tokenizer, "The quick brown"))


def _check_sequences(resp: types.SampleResponse, num_samples: int, max_tokens: int) -> None:
    assert len(resp.sequences) == num_samples
    ids = [s.sequence_id for s in resp.sequences]
    assert all(isinstance(i, str) and i for i in ids), f"sequence ids {ids}"
    assert len(set(ids)) == len(ids), f"sequence ids not distinct: {ids}"
    for seq in resp.sequences:
        assert seq.stop_reason in ("stop", "length")
        assert 1 <= len(seq.tokens) <= max_tokens
        if seq.stop_reason == "length":
            assert len(seq.tokens) == max_tokens
        assert seq.logprobs is not None, "per-token logprobs must always be returned"
        assert len(seq.logprobs) == len(seq.tokens)
        assert all(lp <= 1e-6 and math.isfinite(lp) for lp in seq.logprobs), seq.logprobs


def test_sample_basic(trained, prompt):
    _, sc = trained
    assert isinstance(sc, tinker.SamplingClient)
    assert sc.get_base_model() == BASE_MODEL
    params = types.SamplingParams(max_tokens=8, temperature=1.0, seed=11)
    resp = result(sc.sample(prompt, num_samples=3, sampling_params=params))
    _check_sequences(resp, 3, 8)
    assert resp.prompt_logprobs is None, "prompt logprobs were not requested"


def test_sample_seed_determinism(trained, prompt):
    _, sc = trained
    params = types.SamplingParams(max_tokens=12, temperature=1.0, seed=1234)
    a = result(sc.sample(prompt, num_samples=2, sampling_params=params))
    b = result(sc.sample(prompt, num_samples=2, sampling_params=params))
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences]
    for x, y in zip(a.sequences, b.sequences, strict=True):
        np.testing.assert_allclose(x.logprobs, y.logprobs, atol=1e-6)
    others = [
        result(
            sc.sample(
                prompt, 1, types.SamplingParams(max_tokens=12, temperature=1.0, seed=s)
            )
        ).sequences[0].tokens
        for s in (1, 2, 3)
    ]
    assert any(o != a.sequences[0].tokens for o in others), "different seeds, same output"


def test_sample_stop_token(trained, prompt):
    _, sc = trained
    base = result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=16, seed=77)))
    tokens = base.sequences[0].tokens
    assert len(tokens) >= 4, tokens
    stop_tok = tokens[3]
    k = tokens.index(stop_tok)  # first occurrence
    stopped = result(
        sc.sample(prompt, 1, types.SamplingParams(max_tokens=16, seed=77, stop=[stop_tok]))
    ).sequences[0]
    assert stopped.stop_reason == "stop", stopped
    # The output includes the stop token and ends there.
    assert stopped.tokens == tokens[: k + 1], (stopped.tokens, tokens)
    assert len(stopped.logprobs) == len(stopped.tokens)


def test_sample_stop_string(trained, prompt, tokenizer):
    _, sc = trained
    base = result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=16, seed=5)))
    text = tokenizer.decode(base.sequences[0].tokens)
    candidates = [c for c in text[1:] if c.isprintable() and c != "\ufffd"]
    if not candidates:
        pytest.skip(f"sampled text has no printable character to stop on: {text!r}")
    stop = candidates[0]
    seq = result(
        sc.sample(prompt, 1, types.SamplingParams(max_tokens=16, seed=5, stop=[stop]))
    ).sequences[0]
    out = tokenizer.decode(seq.tokens)
    assert seq.stop_reason == "stop", (text, stop, out)
    assert out.endswith(stop) or stop in out, (text, stop, out)
    assert len(seq.tokens) <= len(base.sequences[0].tokens)


def test_compute_logprobs_matches_training_forward(trained, tokenizer):
    tc, sc = trained
    tokens = encode(tokenizer, "Prompt logprobs from the sampler")
    lps = result(sc.compute_logprobs(types.ModelInput.from_ints(tokens)))
    assert len(lps) == len(tokens)
    assert lps[0] is None
    assert all(lp is not None and lp <= 1e-6 for lp in lps[1:]), lps
    # Same weights in the trainer: logprob of tokens[i+1] given tokens[:i+1].
    fwd = logprobs_of(result(tc.forward([sft_datum(tokens)], "cross_entropy")))[0]
    np.testing.assert_allclose(np.array(lps[1:], dtype=np.float64), fwd, atol=2e-3)


def test_sample_with_prompt_logprobs(trained, prompt):
    _, sc = trained
    resp = result(
        sc.sample(
            prompt,
            1,
            types.SamplingParams(max_tokens=4, seed=1),
            include_prompt_logprobs=True,
        )
    )
    assert resp.prompt_logprobs is not None
    assert len(resp.prompt_logprobs) == prompt.length
    assert resp.prompt_logprobs[0] is None
    direct = result(sc.compute_logprobs(prompt))
    np.testing.assert_allclose(
        np.array(resp.prompt_logprobs[1:], dtype=np.float64),
        np.array(direct[1:], dtype=np.float64),
        atol=1e-4,
    )


@pytest.mark.feature("topk_prompt_logprobs")
def test_topk_prompt_logprobs(trained, prompt):
    _, sc = trained
    resp = result(
        sc.sample(
            prompt,
            1,
            types.SamplingParams(max_tokens=2, seed=1),
            include_prompt_logprobs=True,
            topk_prompt_logprobs=3,
        )
    )
    topk = resp.topk_prompt_logprobs
    assert topk is not None and len(topk) == prompt.length
    assert topk[0] is None
    for row in topk[1:]:
        assert row is not None and 1 <= len(row) <= 3
        lps = [lp for _, lp in row]
        assert lps == sorted(lps, reverse=True)


def test_sampler_is_a_frozen_snapshot(service_client, tokenizer):
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=8))
    batch = sft_batch(tokenizer)
    train_step(tc, batch, lr=2e-3)
    sc = result(tc.save_weights_and_get_sampling_client())
    probe = types.ModelInput.from_ints(encode(tokenizer, "snapshot probe text"))
    before = result(sc.compute_logprobs(probe))
    for _ in range(2):
        train_step(tc, batch, lr=1e-2)
    after = result(sc.compute_logprobs(probe))
    np.testing.assert_allclose(
        np.array(before[1:], dtype=np.float64), np.array(after[1:], dtype=np.float64), atol=1e-6
    )
    newer = result(tc.save_weights_and_get_sampling_client())
    changed = result(newer.compute_logprobs(probe))
    assert not np.allclose(np.array(before[1:]), np.array(changed[1:]), atol=1e-6)


def test_named_sampler_weights_and_create_sampling_client(service_client, trained, prompt):
    tc, _ = trained
    saved = result(tc.save_weights_for_sampler("sampler-e2e"))
    assert saved.path.startswith(f"tinker://{tc.model_id}/sampler_weights/"), saved.path
    # create_sampling_client(model_path=…) -> create_sampling_session + GET samplers/{id}
    sc = result(service_client.create_sampling_client(model_path=saved.path))
    assert sc.get_base_model() == BASE_MODEL
    resp = result(sc.sample(prompt, 2, types.SamplingParams(max_tokens=5, seed=2)))
    _check_sequences(resp, 2, 5)
    # The same weights through the training client's own method.
    sc2 = result(tc.create_sampling_client(saved.path))
    resp2 = result(sc2.sample(prompt, 2, types.SamplingParams(max_tokens=5, seed=2)))
    assert [s.tokens for s in resp.sequences] == [s.tokens for s in resp2.sequences]


def test_base_model_sampling_client(service_client, prompt):
    sc = result(service_client.create_sampling_client(base_model=BASE_MODEL))
    assert sc.get_base_model() == BASE_MODEL
    resp = result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=6, seed=9)))
    _check_sequences(resp, 1, 6)
    assert sc.get_tokenizer() is not None


@pytest.mark.feature("pickle")
def test_pickled_sampling_client(trained, prompt):
    # A pickled copy uses a shadow holder and seq_ids starting at k·1e9.
    _, sc = trained
    clone = pickle.loads(pickle.dumps(sc))
    params = types.SamplingParams(max_tokens=6, seed=21)
    a = result(clone.sample(prompt, 1, params))
    b = result(sc.sample(prompt, 1, params))
    assert a.sequences[0].tokens == b.sequences[0].tokens
