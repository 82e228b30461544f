"""The SDK matrix: every feature below, with each tinker release (see run.sh).

Each test belongs to one matrix column (`cell`); a column is `pass` when all its tests
pass, `fail` when one fails, `n/a` when the release lacks the feature (the skip says why).
Only public SDK API is used; where releases differ the test looks the API up first.
"""

from __future__ import annotations

import asyncio
import base64
import io
import json
import tarfile
import urllib.request
import uuid
import warnings
from datetime import datetime
from pathlib import Path

import numpy as np
import pytest
import tinker
from tinker import types

from sdkm_helpers import (
    BASE_MODEL,
    RESULT_TIMEOUT,
    SDK_VERSION,
    close,
    encode,
    find_paged,
    logprobs_of,
    loss_sum,
    new_client,
    result,
    sft_batch,
    sft_datum,
    train_step,
)

cell = pytest.mark.cell


def _uniq(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


# ----------------------------------------------------------------------------- training


@cell("sft")
def test_sft_loss_falls(service_client, tokenizer):
    tc = new_client(service_client, seed=1)
    batch = sft_batch(tokenizer)
    losses = [train_step(tc, batch, lr=2e-3) for _ in range(8)]
    assert all(np.isfinite(losses)), losses
    assert losses[-1] < losses[0] and np.mean(losses[-3:]) < np.mean(losses[:3]), losses


@cell("forward")
def test_forward_agrees_with_forward_backward(service_client, tokenizer):
    tc = new_client(service_client, seed=2)
    batch = sft_batch(tokenizer)
    first = result(tc.forward(batch, "cross_entropy"))
    assert [lp.shape for lp in logprobs_of(first)] == [(d.model_input.length,) for d in batch]
    # forward leaves no gradients behind: an optim_step after it changes nothing.
    result(tc.optim_step(types.AdamParams(learning_rate=1e-2)))
    second = result(tc.forward(batch, "cross_entropy"))
    for a, b in zip(logprobs_of(first), logprobs_of(second), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-6)
    fb = result(tc.forward_backward(batch, "cross_entropy"))
    assert close(loss_sum(first), loss_sum(fb), rel=1e-4), (first.metrics, fb.metrics)
    for a, b in zip(logprobs_of(first), logprobs_of(fb), strict=True):
        np.testing.assert_allclose(a, b, atol=1e-5)


@cell("forward_backward_custom")
def test_forward_backward_custom(service_client, tokenizer):
    try:
        import torch
    except ImportError:
        pytest.skip("n/a: torch is not installed in this venv (LOOPS_SDK_TORCH=0 or no torch venv)")
    batch = sft_batch(tokenizer)
    a = new_client(service_client, seed=5)
    b = new_client(service_client, seed=5)

    def custom_ce(data, logprobs_list):
        loss = torch.zeros(())
        for datum, lp in zip(data, logprobs_list, strict=True):
            w = torch.tensor(datum.loss_fn_inputs["weights"].to_numpy())
            loss = loss - (lp * w).sum()
        return loss, {"custom_ce:sum": float(loss.detach())}

    custom = result(a.forward_backward_custom(batch, custom_ce))
    ce = result(b.forward_backward(batch, "cross_entropy"))
    assert close(custom.metrics["custom_ce:sum"], loss_sum(ce), rel=1e-4), (custom.metrics, ce.metrics)
    result(a.optim_step(types.AdamParams(learning_rate=5e-3)))
    result(b.optim_step(types.AdamParams(learning_rate=5e-3)))
    for x, y in zip(logprobs_of(result(a.forward(batch, "cross_entropy"))),
                    logprobs_of(result(b.forward(batch, "cross_entropy"))), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4)


@cell("multi_client")
def test_several_training_clients_on_one_base_model(service_client, tokenizer):
    # a and c: same seed, same data (c trained later, alone); b: same seed, other data.
    # All of a's and b's requests are submitted interleaved before any is awaited.
    batch = sft_batch(tokenizer)
    other = sft_batch(tokenizer, ["Completely different text for client b.", "Zebras graze at dawn."])
    a, b = new_client(service_client, seed=11), new_client(service_client, seed=11)
    futs = []
    for _ in range(3):
        futs += [a.forward_backward(batch, "cross_entropy"), b.forward_backward(other, "cross_entropy"),
                 a.optim_step(types.AdamParams(learning_rate=5e-3)),
                 b.optim_step(types.AdamParams(learning_rate=5e-3))]
    outs = [result(f) for f in futs]
    losses_a = [loss_sum(o) for o in outs[0::4]]
    assert losses_a[-1] < losses_a[0], losses_a
    c = new_client(service_client, seed=11)
    for _ in range(3):
        train_step(c, batch, lr=5e-3)
    la = logprobs_of(result(a.forward(batch, "cross_entropy")))
    lb = logprobs_of(result(b.forward(batch, "cross_entropy")))
    lc = logprobs_of(result(c.forward(batch, "cross_entropy")))
    for x, y in zip(la, lc, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-4, err_msg="a (interleaved with b) != c (alone)")
    assert any(not np.allclose(x, y, atol=1e-4) for x, y in zip(la, lb)), "b's training leaked into a"
    assert len({a.model_id, b.model_id, c.model_id}) == 3


# ----------------------------------------------------------------------------- sync / async


@cell("sync_api")
def test_sync_api_round_trip(service_client, tokenizer):
    tc = new_client(service_client, seed=21)
    batch = sft_batch(tokenizer)[:2]
    fb = tc.forward_backward(batch, "cross_entropy").result(timeout=RESULT_TIMEOUT)
    tc.optim_step(types.AdamParams(learning_rate=1e-3)).result(timeout=RESULT_TIMEOUT)
    assert np.isfinite(loss_sum(fb))
    path = tc.save_weights_for_sampler(_uniq("sync")).result(timeout=RESULT_TIMEOUT).path
    sc = tc.create_sampling_client(path)
    resp = sc.sample(types.ModelInput.from_ints(encode(tokenizer, "Hello")), 2,
                     types.SamplingParams(max_tokens=4, seed=1)).result(timeout=RESULT_TIMEOUT)
    assert len(resp.sequences) == 2
    info = tc.get_info()
    assert info.model_data.model_name == BASE_MODEL


@cell("async_api")
def test_async_api_round_trip(service_client, tokenizer):
    batch = sft_batch(tokenizer)[:2]
    prompt = types.ModelInput.from_ints(encode(tokenizer, "Hello there"))

    async def main():
        tc = await service_client.create_lora_training_client_async(base_model=BASE_MODEL, rank=8, seed=22)
        losses = []
        for _ in range(3):
            fb = await tc.forward_backward_async(batch, "cross_entropy")
            opt = await tc.optim_step_async(types.AdamParams(learning_rate=5e-3))
            out = await fb.result_async(timeout=RESULT_TIMEOUT)
            await opt.result_async(timeout=RESULT_TIMEOUT)
            losses.append(loss_sum(out))
        fwd = await (await tc.forward_async(batch, "cross_entropy")).result_async(timeout=RESULT_TIMEOUT)
        saved = await (await tc.save_state_async(_uniq("async"))).result_async(timeout=RESULT_TIMEOUT)
        sc = await tc.save_weights_and_get_sampling_client_async()
        resps = await asyncio.gather(*[
            sc.sample_async(prompt, 1, types.SamplingParams(max_tokens=4, seed=s)) for s in range(4)])
        lps = await sc.compute_logprobs_async(prompt)
        rest = service_client.create_rest_client() if not hasattr(tinker, "RestClient") else tinker.RestClient()
        run = await rest.get_training_run_async(tc.model_id)
        return losses, fwd, saved, resps, lps, run, tc

    losses, fwd, saved, resps, lps, run, tc = asyncio.run(main())
    assert losses[-1] < losses[0], losses
    assert len(logprobs_of(fwd)) == 2
    assert saved.path.startswith("tinker://")
    assert all(len(r.sequences) == 1 for r in resps)
    assert len(lps) == prompt.length and lps[0] is None
    assert run.training_run_id == tc.model_id


# ----------------------------------------------------------------------------- checkpoints


@pytest.fixture(scope="module")
def reference_run(service_client, tokenizer):
    batch = sft_batch(tokenizer)
    tc = new_client(service_client, seed=42)
    for _ in range(3):
        train_step(tc, batch)
    path = result(tc.save_state(_uniq("ckpt"))).path
    after_save = logprobs_of(result(tc.forward(batch, "cross_entropy")))
    nxt = [train_step(tc, batch) for _ in range(2)]
    return path, nxt, after_save


@cell("save_load_optimizer")
def test_load_state_with_optimizer_resumes_exactly(service_client, tokenizer, reference_run):
    path, want, after_save = reference_run
    assert path.count("/") == 4 and "/weights/" in path, path
    batch = sft_batch(tokenizer)
    tc = new_client(service_client, seed=7)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        result(tc.load_state_with_optimizer(path))
    for x, y in zip(after_save, logprobs_of(result(tc.forward(batch, "cross_entropy"))), strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5)
    got = [train_step(tc, batch) for _ in range(2)]
    assert close(got[0], want[0]) and close(got[1], want[1]), f"resumed {got} vs uninterrupted {want}"


@cell("save_load_optimizer")
def test_create_training_client_from_state_with_optimizer(service_client, tokenizer, reference_run):
    path, want, _ = reference_run
    tc = result(service_client.create_training_client_from_state_with_optimizer(path))
    assert tc.get_info().model_data.model_name == BASE_MODEL
    got = [train_step(tc, sft_batch(tokenizer)) for _ in range(2)]
    assert close(got[0], want[0]) and close(got[1], want[1]), f"resumed {got} vs uninterrupted {want}"


@cell("save_load_optimizer")
def test_create_training_client_from_state_weights_only(service_client, tokenizer, reference_run):
    path, want, _ = reference_run
    tc = result(service_client.create_training_client_from_state(path))
    got = train_step(tc, sft_batch(tokenizer))
    assert close(got, want[0]), (got, want[0])


# ----------------------------------------------------------------------------- sampling


@pytest.fixture(scope="module")
def trained(service_client, tokenizer):
    tc = new_client(service_client, seed=3)
    for _ in range(2):
        train_step(tc, sft_batch(tokenizer))
    return tc, result(tc.save_weights_and_get_sampling_client())


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return types.ModelInput.from_ints(encode(tokenizer, "The quick brown"))


def _check(resp, n, max_tokens):
    assert len(resp.sequences) == n
    for s in resp.sequences:
        assert s.stop_reason in ("stop", "length")
        assert 1 <= len(s.tokens) <= max_tokens
        if s.stop_reason == "length":
            assert len(s.tokens) == max_tokens
        assert s.logprobs is not None and len(s.logprobs) == len(s.tokens)
        assert all(np.isfinite(s.logprobs)) and max(s.logprobs) <= 1e-6
    ids = [getattr(s, "sequence_id", None) for s in resp.sequences]
    if ids[0] is not None:  # 0.3x+ stamps a sequence_id on each sequence
        assert len(set(ids)) == n, ids


@cell("save_weights_and_get_sampling_client")
def test_save_weights_and_get_sampling_client(service_client, tokenizer, prompt):
    tc = new_client(service_client, seed=8)
    batch = sft_batch(tokenizer)
    train_step(tc, batch)
    sc = result(tc.save_weights_and_get_sampling_client())
    assert isinstance(sc, tinker.SamplingClient)
    _check(result(sc.sample(prompt, 2, types.SamplingParams(max_tokens=6, seed=1))), 2, 6)
    probe = types.ModelInput.from_ints(encode(tokenizer, "snapshot probe"))
    before = result(sc.compute_logprobs(probe))
    for _ in range(2):
        train_step(tc, batch, lr=1e-2)
    after = result(sc.compute_logprobs(probe))
    np.testing.assert_allclose(np.array(before[1:], float), np.array(after[1:], float), atol=1e-6,
                               err_msg="a sampling client must be a frozen snapshot")
    newer = result(result(tc.save_weights_and_get_sampling_client()).compute_logprobs(probe))
    assert not np.allclose(np.array(before[1:], float), np.array(newer[1:], float), atol=1e-6)


@cell("compute_logprobs")
def test_compute_logprobs_matches_forward(trained, tokenizer):
    tc, sc = trained
    tokens = encode(tokenizer, "Prompt logprobs from the sampler")
    lps = result(sc.compute_logprobs(types.ModelInput.from_ints(tokens)))
    assert len(lps) == len(tokens) and lps[0] is None
    fwd = logprobs_of(result(tc.forward([sft_datum(tokens)], "cross_entropy")))[0]
    np.testing.assert_allclose(np.array(lps[1:], dtype=np.float64), fwd, atol=2e-3)


@cell("sampling_params")
def test_sampling_every_parameter(trained, prompt, tokenizer):
    _, sc = trained

    def sample(n=1, **kw):
        return result(sc.sample(prompt, n, types.SamplingParams(**kw)))

    # num_samples, max_tokens, temperature, seed
    _check(sample(3, max_tokens=8, temperature=0.7, seed=5), 3, 8)
    a, b = sample(2, max_tokens=10, seed=123), sample(2, max_tokens=10, seed=123)
    assert [s.tokens for s in a.sequences] == [s.tokens for s in b.sequences], "same seed, other output"
    outs = {tuple(sample(max_tokens=10, seed=s).sequences[0].tokens) for s in range(1, 6)}
    assert len(outs) > 1, "different seeds gave one output"
    # top_k=1 is greedy, whatever the seed; top_p tiny keeps only the top token too.
    greedy = {tuple(sample(max_tokens=8, top_k=1, seed=s).sequences[0].tokens) for s in (1, 2, 3)}
    assert len(greedy) == 1, greedy
    nucleus = {tuple(sample(max_tokens=8, top_p=1e-6, seed=s).sequences[0].tokens) for s in (1, 2, 3)}
    assert nucleus == greedy, (nucleus, greedy)
    _check(sample(2, max_tokens=8, top_k=5, top_p=0.9, temperature=1.3, seed=9), 2, 8)
    # stop as token ids: output ends with the stop token.
    base = sample(max_tokens=16, seed=77).sequences[0].tokens
    stop_tok = base[min(3, len(base) - 1)]
    k = base.index(stop_tok)
    s = sample(max_tokens=16, seed=77, stop=[stop_tok]).sequences[0]
    assert s.stop_reason == "stop" and s.tokens == base[: k + 1], (s, base)
    # stop as strings
    text = tokenizer.decode(base)
    cands = [c for c in text[1:] if c.isprintable() and c.strip() and c != "\ufffd"]
    if cands:
        s = sample(max_tokens=16, seed=77, stop=[cands[0]]).sequences[0]
        assert s.stop_reason == "stop" and cands[0] in tokenizer.decode(s.tokens), (text, cands[0])
    # prompt logprobs and top-k prompt logprobs
    r = result(sc.sample(prompt, 1, types.SamplingParams(max_tokens=2, seed=1),
                         include_prompt_logprobs=True, topk_prompt_logprobs=3))
    assert r.prompt_logprobs is not None and len(r.prompt_logprobs) == prompt.length
    assert r.prompt_logprobs[0] is None
    topk = r.topk_prompt_logprobs
    assert topk is not None and len(topk) == prompt.length and topk[0] is None
    for row in topk[1:]:
        lps = [lp for _, lp in row]
        assert 1 <= len(row) <= 3 and lps == sorted(lps, reverse=True), row


# ----------------------------------------------------------------------------- REST


@pytest.fixture(scope="module")
def run_with_checkpoints(service_client, tokenizer):
    tc = new_client(service_client, seed=31, user_metadata={"suite": "sdk-matrix"}) \
        if "user_metadata" in service_client.create_lora_training_client.__code__.co_varnames \
        else new_client(service_client, seed=31)
    train_step(tc, sft_batch(tokenizer))
    state = result(tc.save_state(_uniq("state"))).path
    sampler = result(tc.save_weights_for_sampler(_uniq("sampler"))).path
    return tc, state, sampler


@cell("rest_listings")
def test_rest_listings(rest_client, run_with_checkpoints):
    tc, state, sampler = run_with_checkpoints
    page = result(rest_client.list_training_runs(limit=5))
    assert page.cursor.limit == 5 and page.cursor.total_count >= 1 and len(page.training_runs) <= 5
    run = find_paged(rest_client.list_training_runs, lambda r: r.training_run_id, tc.model_id)
    assert run is not None and run.base_model == BASE_MODEL and run.is_lora
    assert isinstance(run.last_request_time, datetime)
    got = result(rest_client.get_training_run(tc.model_id))
    assert got.training_run_id == tc.model_id and got.lora_rank in (None, 8)
    assert result(rest_client.get_training_run_by_tinker_path(state)).training_run_id == tc.model_id
    cks = {c.tinker_path: c for c in result(rest_client.list_checkpoints(tc.model_id)).checkpoints}
    assert cks[state].checkpoint_type == "training" and cks[sampler].checkpoint_type == "sampler"
    assert cks[state].checkpoint_id == "weights/" + state.rsplit("/", 1)[1]
    for p in (state, sampler):
        assert find_paged(rest_client.list_user_checkpoints, lambda c: c.tinker_path, p) is not None, p
    info = result(rest_client.get_weights_info_by_tinker_path(state))
    assert info.base_model == BASE_MODEL and info.is_lora and info.lora_rank == 8


@cell("rest_delete")
def test_rest_delete(rest_client, service_client):
    tc = new_client(service_client, rank=4)
    name = _uniq("del")
    result(tc.save_state(name))
    ids = lambda: [c.checkpoint_id for c in result(rest_client.list_checkpoints(tc.model_id)).checkpoints]  # noqa: E731
    assert f"weights/{name}" in ids()
    result(rest_client.delete_checkpoint(tc.model_id, f"weights/{name}"))
    assert f"weights/{name}" not in ids()
    p2 = result(tc.save_weights_for_sampler(name + "-s")).path
    result(rest_client.delete_checkpoint_from_tinker_path(p2))
    assert f"sampler_weights/{name}-s" not in ids()


def _ckpt(rest_client, run_id, path):
    for c in result(rest_client.list_checkpoints(run_id)).checkpoints:
        if c.tinker_path == path:
            return c
    raise AssertionError(f"{path} not listed")


@cell("rest_ttl")
def test_rest_ttl(rest_client, service_client):
    tc = new_client(service_client, rank=4)
    path = result(tc.save_state(_uniq("ttl"), ttl_seconds=3600)).path
    c = _ckpt(rest_client, tc.model_id, path)
    assert c.expires_at is not None, "save_state(ttl_seconds=3600) left no expires_at"
    left = (c.expires_at - datetime.now(c.expires_at.tzinfo)).total_seconds()
    assert 3000 < left <= 3700, left
    result(rest_client.set_checkpoint_ttl_from_tinker_path(path, 7200))
    c = _ckpt(rest_client, tc.model_id, path)
    left = (c.expires_at - datetime.now(c.expires_at.tzinfo)).total_seconds()
    assert 6800 < left <= 7300, left
    result(rest_client.set_checkpoint_ttl_from_tinker_path(path, None))
    assert _ckpt(rest_client, tc.model_id, path).expires_at is None


@cell("rest_publish")
def test_rest_publish(rest_client, run_with_checkpoints):
    tc, state, _ = run_with_checkpoints
    result(rest_client.publish_checkpoint_from_tinker_path(state))
    assert _ckpt(rest_client, tc.model_id, state).public is True
    result(rest_client.unpublish_checkpoint_from_tinker_path(state))
    assert _ckpt(rest_client, tc.model_id, state).public is False


@cell("archive_download")
def test_archive_download(rest_client, run_with_checkpoints):
    _, state, sampler = run_with_checkpoints
    if not hasattr(rest_client, "get_checkpoint_archive_url_from_tinker_path"):
        pytest.skip("n/a: this SDK has no archive API (removed in 0.3x; `tinker checkpoint download` "
                    "uses external weights instead, see the cli_download row)")
    for path in (state, sampler):
        resp = result(rest_client.get_checkpoint_archive_url_from_tinker_path(path))
        with urllib.request.urlopen(resp.url, timeout=60) as r:
            data = r.read()
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            names = {Path(n).name for n in tar.getnames()}
            assert {"adapter_config.json", "adapter_model.safetensors"} <= names, names
            cfg = json.load(tar.extractfile(next(m for m in tar.getmembers()
                                                 if m.name.endswith("adapter_config.json"))))
            assert cfg.get("r") == 8 and "lora_alpha" in cfg, cfg


# The tinker CLI's commands: test_cli.py (enumerated from the CLI's click group).
