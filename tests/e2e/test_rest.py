"""RestClient: training runs, checkpoints, delete, weights_info, samplers."""

from __future__ import annotations

import uuid
from datetime import datetime

import pytest
import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, find_paged, result, sft_batch, train_step


@pytest.fixture(scope="module")
def run_with_checkpoints(service_client, tokenizer):
    tc = result(service_client.create_lora_training_client(
        base_model=BASE_MODEL, rank=8, user_metadata={"suite": "e2e"}
    ))
    train_step(tc, sft_batch(tokenizer), lr=1e-3)
    tag = uuid.uuid4().hex[:6]
    state = result(tc.save_state(f"state-{tag}"))
    sampler = result(tc.save_weights_for_sampler(f"sampler-{tag}"))
    return tc, state.path, sampler.path


def test_list_training_runs(rest_client, run_with_checkpoints):
    tc, _, _ = run_with_checkpoints
    page = result(rest_client.list_training_runs(limit=5))
    assert page.cursor.limit == 5 and page.cursor.total_count >= 1
    assert len(page.training_runs) <= 5
    run = find_paged(rest_client.list_training_runs, lambda r: r.training_run_id, tc.model_id)
    assert run is not None, f"{tc.model_id} not in list_training_runs"
    assert run.base_model == BASE_MODEL
    assert run.is_lora is True
    assert isinstance(run.last_request_time, datetime)


def test_get_training_run(rest_client, run_with_checkpoints):
    tc, state_path, sampler_path = run_with_checkpoints
    run = result(rest_client.get_training_run(tc.model_id))
    assert run.training_run_id == tc.model_id
    assert run.base_model == BASE_MODEL
    assert run.lora_rank in (None, 8)
    assert run.model_owner
    if run.user_metadata is not None:
        assert run.user_metadata.get("suite") == "e2e"
    if run.last_checkpoint is not None:
        assert run.last_checkpoint.tinker_path == state_path
    if run.last_sampler_checkpoint is not None:
        assert run.last_sampler_checkpoint.tinker_path == sampler_path
    same = result(rest_client.get_training_run_by_tinker_path(state_path))
    assert same.training_run_id == tc.model_id


def test_list_checkpoints(rest_client, run_with_checkpoints):
    tc, state_path, sampler_path = run_with_checkpoints
    resp = result(rest_client.list_checkpoints(tc.model_id))
    by_path = {c.tinker_path: c for c in resp.checkpoints}
    assert state_path in by_path and sampler_path in by_path, list(by_path)
    state = by_path[state_path]
    assert state.checkpoint_type == "training"
    assert state.checkpoint_id == "weights/" + state_path.rsplit("/", 1)[1]
    assert isinstance(state.time, datetime)
    sampler = by_path[sampler_path]
    assert sampler.checkpoint_type == "sampler"
    assert sampler.checkpoint_id.startswith("sampler_weights/")


def test_list_user_checkpoints(rest_client, run_with_checkpoints):
    _, state_path, sampler_path = run_with_checkpoints
    for path in (state_path, sampler_path):
        found = find_paged(rest_client.list_user_checkpoints, lambda c: c.tinker_path, path)
        assert found is not None, f"{path} not in list_user_checkpoints"


def test_weights_info(rest_client, run_with_checkpoints):
    _, state_path, _ = run_with_checkpoints
    info = result(rest_client.get_weights_info_by_tinker_path(state_path))
    assert info.base_model == BASE_MODEL
    assert info.is_lora is True
    assert info.lora_rank == 8


def test_get_sampler(rest_client, trained_sampler):
    sc, sampler_id = trained_sampler
    got = result(rest_client.get_sampler(sampler_id))
    assert got.sampler_id == sampler_id
    assert got.base_model == BASE_MODEL


@pytest.fixture(scope="module")
def trained_sampler(service_client):
    sc = result(service_client.create_sampling_client(base_model=BASE_MODEL))
    # The sampler id is not a public attribute; the sampler handle carries it.
    import base64
    import json

    state = json.loads(base64.urlsafe_b64decode(sc.get_sampler_handle()))
    return sc, state["sampling_session_id"]


def test_delete_checkpoint(rest_client, service_client, tokenizer):
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    name = f"delete-me-{uuid.uuid4().hex[:6]}"
    path = result(tc.save_state(name)).path
    ids = [c.checkpoint_id for c in result(rest_client.list_checkpoints(tc.model_id)).checkpoints]
    assert f"weights/{name}" in ids
    result(rest_client.delete_checkpoint(tc.model_id, f"weights/{name}"))
    ids = [c.checkpoint_id for c in result(rest_client.list_checkpoints(tc.model_id)).checkpoints]
    assert f"weights/{name}" not in ids
    # and via a tinker path
    path2 = result(tc.save_state(name + "-2")).path
    result(rest_client.delete_checkpoint_from_tinker_path(path2))
    paths = [c.tinker_path for c in result(rest_client.list_checkpoints(tc.model_id)).checkpoints]
    assert path not in paths and path2 not in paths


@pytest.mark.feature("auth_isolation")
def test_other_key_cannot_see_run(loops_url, run_with_checkpoints):
    tc, _, _ = run_with_checkpoints
    other = tinker.RestClient(api_key="tml-e2e-someone-else")
    with pytest.raises(tinker.NotFoundError):
        result(other.get_training_run(tc.model_id))


@pytest.mark.feature("sessions")
def test_sessions_listing(rest_client, run_with_checkpoints):
    tc, _, _ = run_with_checkpoints
    sessions = result(rest_client.list_sessions(limit=100)).sessions
    assert sessions, "list_sessions is empty"
    owners = [s for s in sessions if tc.model_id in result(rest_client.get_session(s)).training_run_ids]
    assert len(owners) == 1, f"{tc.model_id} found in sessions {owners}"


def test_types_are_public():
    # Guard against SDK API drift in this suite itself.
    assert hasattr(types, "Checkpoint") and hasattr(tinker, "RestClient")
