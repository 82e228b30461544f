"""Checkpoints: save_state, load_state_with_optimizer, create_training_client_from_state*."""

from __future__ import annotations

import uuid
import warnings

import numpy as np
import pytest
import tinker

from e2e_helpers import (
    BASE_MODEL,
    close,
    logprobs_of,
    result,
    sft_batch,
    train_step,
)

LR = 2e-3


def _unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


@pytest.fixture(scope="module")
def reference_run(service_client, tokenizer):
    """Uninterrupted run: 3 steps, save_state, then 2 more steps.

    Returns (checkpoint path, [loss of step 4, loss of step 5], training client,
    logprobs right after the save)."""
    batch = sft_batch(tokenizer)
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=42))
    for _ in range(3):
        train_step(tc, batch, lr=LR)
    saved = result(tc.save_state(_unique("ckpt")))
    after_save = logprobs_of(result(tc.forward(batch, "cross_entropy")))
    next_losses = [train_step(tc, batch, lr=LR)[0] for _ in range(2)]
    return saved.path, next_losses, tc, after_save


def test_save_state_path(reference_run):
    path, _, tc, _ = reference_run
    assert path.startswith(f"tinker://{tc.model_id}/weights/"), path
    assert path.count("/") == 4, f"tinker path must be tinker://<run>/weights/<name>: {path}"


def test_load_state_with_optimizer_resumes_exactly(service_client, tokenizer, reference_run):
    path, want, _, after_save = reference_run
    batch = sft_batch(tokenizer)
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=7))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # load_state* is deprecated in 0.38.0
        result(tc.load_state_with_optimizer(path))
    got_lp = logprobs_of(result(tc.forward(batch, "cross_entropy")))
    for x, y in zip(after_save, got_lp, strict=True):
        np.testing.assert_allclose(x, y, atol=1e-5, err_msg="weights differ after load")
    got = [train_step(tc, batch, lr=LR)[0] for _ in range(2)]
    # Step 4 checks the weights, step 5 also checks the restored Adam moments.
    assert close(got[0], want[0]) and close(got[1], want[1]), f"resumed {got} vs uninterrupted {want}"


def test_load_state_weights_only(service_client, tokenizer, reference_run):
    path, want, _, _ = reference_run
    batch = sft_batch(tokenizer)
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        result(tc.load_state(path))
    loss, _ = train_step(tc, batch, lr=LR)
    assert close(loss, want[0]), f"first step after weights-only load: {loss} vs {want[0]}"


def test_create_training_client_from_state_with_optimizer(service_client, tokenizer, reference_run):
    # 0.38.0: one session-addressed load_weights, then get_info on "<session>:train:<n>".
    path, want, ref_tc, _ = reference_run
    batch = sft_batch(tokenizer)
    tc = result(service_client.create_training_client_from_state_with_optimizer(path))
    info = tc.get_info()
    assert info.model_data.model_name == BASE_MODEL
    if info.lora_rank is not None:
        assert info.lora_rank == 8
    assert tc.model_id != ref_tc.model_id
    # The SDK names this client "<session>:train:<n>" without asking the server; the
    # server must resolve that id everywhere, including the REST API.
    assert ":train:" in tc.model_id
    run = result(tinker.RestClient().get_training_run(tc.model_id))
    assert run.base_model == BASE_MODEL
    got = [train_step(tc, batch, lr=LR)[0] for _ in range(2)]
    assert close(got[0], want[0]) and close(got[1], want[1]), f"resumed {got} vs uninterrupted {want}"


def test_create_training_client_from_state_weights_only(service_client, tokenizer, reference_run):
    path, want, _, _ = reference_run
    batch = sft_batch(tokenizer)
    tc = result(service_client.create_training_client_from_state(path))
    assert tc.get_info().model_data.model_name == BASE_MODEL
    loss, _ = train_step(tc, batch, lr=LR)
    assert close(loss, want[0]), f"first step after create_from_state: {loss} vs {want[0]}"


@pytest.mark.feature("errors")
def test_load_missing_checkpoint_fails(service_client, training_client):
    missing = f"tinker://{training_client.model_id}/weights/does-not-exist"
    with pytest.raises(Exception) as excinfo:
        result(service_client.create_training_client_from_state(missing), timeout=120)
    assert not isinstance(excinfo.value, TimeoutError), "server hung instead of refusing"


@pytest.mark.feature("save_overwrite")
def test_save_state_same_name(training_client):
    name = _unique("dup")
    first = result(training_client.save_state(name))
    again = result(training_client.save_state(name, overwrite=True))
    assert first.path == again.path
