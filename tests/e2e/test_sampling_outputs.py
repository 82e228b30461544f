"""Sampling outputs of tinker 0.38.0's sample call, through the real SDK: top-k log-probs
of sampled tokens (topk_sample_logprobs), target prompt log-probs (dense and sparse CSR),
prompt alt-token draws (prompt_alt_tokens_k), prompt_logprobs_last_n, the 400s that say
what is out of range, and inflight sampling clients (kind="inflight").

The numbers themselves are checked against the float64 oracle on both engines by the
backend contract suite (conformance/backendtest, cases sample/top_logprobs/*,
sample/target_prompt_logprobs, sample/prompt_alt_tokens*); here each argument is checked
end to end and against the other outputs of the same server (prompt_logprobs,
topk_prompt_logprobs)."""

from __future__ import annotations

import math

import numpy as np
import pytest
import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, encode, result, sft_batch, train_step


@pytest.fixture(scope="module")
def sc(service_client):
    return result(service_client.create_sampling_client(base_model=BASE_MODEL))


@pytest.fixture(scope="module")
def prompt(tokenizer):
    ids = encode(tokenizer, "The quick brown fox jumps over")
    assert len(ids) >= 5
    return types.ModelInput.from_ints(ids)


def _rows(resp_topk):
    return [row for row in resp_topk]


def test_topk_sample_logprobs(sc, prompt):
    k = 5
    for temperature in (0.0, 0.8):
        params = types.SamplingParams(max_tokens=6, temperature=temperature, seed=5)
        resp = result(sc.sample(prompt, 2, params, topk_sample_logprobs=k))
        for seq in resp.sequences:
            rows = seq.topk_logprobs
            assert rows is not None and len(rows) == len(seq.tokens)
            assert seq.topk_logprobs_np.token_ids.shape == (len(seq.tokens), k)
            for tok, lp, row in zip(seq.tokens, seq.logprobs, rows, strict=True):
                assert row is not None and len(row) == k
                lps = [x[1] for x in row]
                assert lps == sorted(lps, reverse=True), row
                ids = [x[0] for x in row]
                if tok in ids:
                    assert math.isclose(lps[ids.index(tok)], lp, abs_tol=1e-6), (tok, lp, row)
                if temperature == 0:
                    assert ids[0] == tok, "greedy samples the most likely token"
    # without the argument there are none
    resp = result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=1)))
    assert resp.sequences[0].topk_logprobs is None


def test_target_prompt_logprobs_dense_and_sparse(sc, prompt):
    toks = prompt.to_ints()
    n = len(toks)
    # row i is scored at position i + 1: column 0 the prompt's own token, column 1 token 7,
    # column 2 nothing (-1)
    ids = np.array([[toks[i + 1], 7, -1] for i in range(n - 1)], dtype=np.int64)
    params = types.SamplingParams(max_tokens=1, temperature=0.5, seed=1)
    resp = result(sc.sample(prompt, 1, params, include_prompt_logprobs=True,
                            target_prompt_logprobs=types.TensorData.from_numpy(ids)))
    got = resp.target_prompt_logprobs
    assert got is not None and got.dtype == "float32" and list(got.shape) == [n - 1, 3]
    dense = got.to_numpy()
    plp = resp.prompt_logprobs
    for i in range(n - 1):
        assert math.isclose(dense[i, 0], plp[i + 1], abs_tol=1e-6), (i, dense[i], plp[i + 1])
        assert dense[i, 1] < 0
        assert dense[i, 2] == 0.0, "a -1 cell answers 0.0"

    # sparse CSR: only row 1 column 2 and row 2 column 0 are named; the answer lists the same
    # cells, in the same layout
    sparse = types.TensorData(data=np.array([toks[2], toks[3]], dtype=np.int64), dtype="int64", shape=[n - 1, 3],
                              sparse_crow_indices=[0, 0, 1, 2] + [2] * (n - 4), sparse_col_indices=[2, 0])
    resp2 = result(sc.sample(prompt, 1, params, include_prompt_logprobs=True, target_prompt_logprobs=sparse))
    got2 = resp2.target_prompt_logprobs
    assert got2.sparse_crow_indices == sparse.sparse_crow_indices
    assert got2.sparse_col_indices == sparse.sparse_col_indices
    vals = np.asarray(got2.data, dtype=np.float32)
    assert math.isclose(vals[0], plp[2], abs_tol=1e-6) and math.isclose(vals[1], plp[3], abs_tol=1e-6)


def test_prompt_alt_tokens(sc, prompt):
    toks = prompt.to_ints()
    n, k = len(toks), 4
    params = types.SamplingParams(max_tokens=1, temperature=1.2, seed=21)
    a = result(sc.sample(prompt, 1, params, prompt_alt_tokens_k=k))
    b = result(sc.sample(prompt, 1, params, prompt_alt_tokens_k=k))
    alt = a.prompt_alt_tokens
    assert alt is not None
    t, lp = alt.tokens.to_numpy(), alt.logprobs.to_numpy()
    assert t.shape == (n - 1, k) and lp.shape == (n - 1, k) and alt.tokens.dtype == "int64"
    np.testing.assert_array_equal(t, b.prompt_alt_tokens.tokens.to_numpy(), "the same seed draws the same")
    # each draw's log-prob is the model's (temperature 1): the same as target_prompt_logprobs
    # of that id at that position
    c = result(sc.sample(prompt, 1, params, target_prompt_logprobs=types.TensorData.from_numpy(t.astype(np.int64))))
    np.testing.assert_allclose(lp, c.target_prompt_logprobs.to_numpy(), atol=1e-6)
    # greedy: every draw is the most likely token
    g = result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=1, temperature=0.0), prompt_alt_tokens_k=2,
                         topk_prompt_logprobs=1))
    top = g.topk_prompt_logprobs
    gt = g.prompt_alt_tokens.tokens.to_numpy()
    for i in range(n - 1):
        assert list(gt[i]) == [top[i + 1][0][0]] * 2


def test_prompt_logprobs_last_n(sc, prompt):
    n = len(prompt.to_ints())
    params = types.SamplingParams(max_tokens=1, seed=3)
    full = result(sc.sample(prompt, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=2))
    last = result(sc.sample(prompt, 1, params, include_prompt_logprobs=True, topk_prompt_logprobs=2,
                            prompt_logprobs_last_n=2))
    assert last.prompt_logprobs[: n - 2] == [None] * (n - 2)
    np.testing.assert_allclose(last.prompt_logprobs[n - 2:], full.prompt_logprobs[n - 2:], atol=1e-6)
    assert last.topk_prompt_logprobs[: n - 2] == [None] * (n - 2)
    assert last.topk_prompt_logprobs[n - 2:] == full.topk_prompt_logprobs[n - 2:]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"topk_sample_logprobs": 21}, "topk_sample_logprobs = 21 is out of range"),
        ({"prompt_alt_tokens_k": 101}, "prompt_alt_tokens_k = 101 is out of range"),
        ({"include_prompt_logprobs": True, "prompt_logprobs_last_n": 99}, "prompt_logprobs_last_n 99 is out of range"),
        ({"target_prompt_logprobs": types.TensorData(data=[1, 2], dtype="int64", shape=[2, 1])}, "needs"),
        ({"target_prompt_logprobs": "all -1"}, "names no token id"),
    ],
)
def test_out_of_range_is_a_clear_400(sc, prompt, kwargs, message):
    n = len(prompt.to_ints())
    if kwargs.get("target_prompt_logprobs") == "all -1":
        kwargs = {"target_prompt_logprobs": types.TensorData.from_numpy(np.full((n - 1, 2), -1, dtype=np.int64))}
    with pytest.raises(tinker.BadRequestError) as e:
        result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=1), **kwargs))
    assert message in str(e.value), str(e.value)


def test_inflight_sampling_client(service_client, tokenizer, prompt):
    """kind="inflight": a sampling client of the training model's shared inflight weights;
    a later inflight save updates them for the clients already returned."""
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=9))
    a = result(tc.save_weights_and_get_sampling_client(kind="inflight"))
    params = types.SamplingParams(max_tokens=1, seed=1)
    before = result(a.sample(prompt, 1, params, include_prompt_logprobs=True)).prompt_logprobs
    batch = sft_batch(tokenizer)
    for _ in range(2):
        train_step(tc, batch, lr=5e-3)
    b = result(tc.save_weights_and_get_sampling_client(kind="inflight"))
    now_b = result(b.sample(prompt, 1, params, include_prompt_logprobs=True)).prompt_logprobs
    now_a = result(a.sample(prompt, 1, params, include_prompt_logprobs=True)).prompt_logprobs
    assert now_b[1:] != before[1:], "the second inflight client samples the trained weights"
    np.testing.assert_allclose(now_a[1:], now_b[1:], atol=1e-6, err_msg="the first inflight client follows the newest inflight save")
    # a snapshot client keeps its weights
    snap = result(tc.save_weights_and_get_sampling_client())
    for _ in range(1):
        train_step(tc, batch, lr=5e-3)
    result(tc.save_weights_and_get_sampling_client(kind="inflight"))
    assert result(snap.sample(prompt, 1, params, include_prompt_logprobs=True)).prompt_logprobs[1:] == now_b[1:]
