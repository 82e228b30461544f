"""copy_weights with weights-access tokens, join_sampling_session and create_custom_loss,
through the unmodified SDK (RestClient/ServiceClient.copy_weights,
SamplingClient.from_sampler_handle) against `loops serve`.

Tokens are issued and revoked through loops.v1 REST (/v1/weights_access_tokens): Tinker's SDK
has no call that issues one.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
import uuid

import pytest
import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, result, sft_batch, train_step

OWNER_KEY = os.environ.get("LOOPS_E2E_API_KEY", "tml-e2e-test")
OTHER_KEY = "tml-e2e-copy-weights-other"


def _http(url: str, method: str, path: str, key: str, body: dict | None = None) -> tuple[int, dict]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url + path, data=data, method=method,
                                 headers={"X-Api-Key": key, "Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, json.loads(resp.read() or b"{}")
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read() or b"{}")


@pytest.fixture(scope="module")
def owner_checkpoints(service_client, tokenizer):
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=7))
    train_step(tc, sft_batch(tokenizer), lr=1e-3)
    tag = uuid.uuid4().hex[:6]
    shared = result(tc.save_state(f"shared-{tag}")).path
    private = result(tc.save_state(f"private-{tag}")).path
    return tc, shared, private


def _issue(url: str, path: str) -> tuple[str, str]:
    status, body = _http(url, "POST", "/v1/weights_access_tokens", OWNER_KEY,
                         {"checkpoint_path": path, "description": "e2e"})
    assert status == 200, body
    return body["token"], body["weights_access_token"]["id"]


@pytest.mark.feature("copy_weights")
def test_copy_with_token_survives_source_delete(loops_url, owner_checkpoints, rest_client):
    tc, shared, private = owner_checkpoints
    token, token_id = _issue(loops_url, shared)
    other = tinker.ServiceClient(api_key=OTHER_KEY, project_id="proj-e2e")
    other_rest = tinker.RestClient(api_key=OTHER_KEY)

    # Without the token, or for another checkpoint, the owner's checkpoints do not exist.
    with pytest.raises(tinker.NotFoundError):
        result(other.copy_weights(shared))
    with pytest.raises(tinker.NotFoundError):
        result(other.copy_weights(private, weights_access_token=token))

    copied = result(other.copy_weights(shared, weights_access_token=token, ttl_seconds=3600))
    assert copied.startswith("tinker://") and copied != shared
    assert copied.endswith("/weights/" + shared.rsplit("/", 1)[1])
    mine = [c.tinker_path for c in result(other_rest.list_user_checkpoints(limit=100)).checkpoints]
    assert copied in mine and shared not in mine and private not in mine
    theirs = [c.tinker_path for c in result(rest_client.list_user_checkpoints(limit=100)).checkpoints]
    assert copied not in theirs

    # The owner deletes the source: the copy is the other workspace's own, and loads.
    result(rest_client.delete_checkpoint_from_tinker_path(shared))
    loaded = result(other.create_training_client_from_state(copied))
    assert loaded.model_id

    # Revoked: the token is refused (403, not retried), and only its owner may revoke it.
    status, _ = _http(loops_url, "DELETE", f"/v1/weights_access_tokens/{token_id}", OTHER_KEY)
    assert status == 404
    status, _ = _http(loops_url, "DELETE", f"/v1/weights_access_tokens/{token_id}", OWNER_KEY)
    assert status == 200
    token2, _ = _issue(loops_url, private)
    result(other.copy_weights(private, weights_access_token=token2))
    # The token also loads the checkpoint straight into a run of the other workspace.
    assert result(other.create_training_client_from_state(private, weights_access_token=token2)).model_id
    with pytest.raises(tinker.NotFoundError):
        result(other.create_training_client_from_state(private))
    with pytest.raises(tinker.PermissionDeniedError, match="revoked"):
        result(other_rest.copy_weights(private, "proj-e2e", weights_access_token=token))


@pytest.mark.feature("copy_weights")
def test_copy_own_checkpoint_into_a_project(owner_checkpoints, rest_client, loops_url):
    tc, _, private = owner_checkpoints
    copied = result(rest_client.copy_weights(private, "proj-archive"))
    assert copied != private
    status, body = _http(loops_url, "GET", "/v1/checkpoints?limit=1000", OWNER_KEY)
    assert status == 200, body
    rec = [c for c in body["checkpoints"] if c["tinker_path"] == copied]
    assert rec and rec[0]["project_id"] == "proj-archive" and rec[0]["copied_from"] == private


@pytest.mark.feature("join_sampling_session")
def test_sampler_handle_clients_join(service_client, tokenizer):
    sc = result(service_client.create_sampling_client(base_model=BASE_MODEL))
    handle = sc.get_sampler_handle()
    prompt = types.ModelInput.from_ints(tokenizer.encode("Hello")[:4] or [1])
    params = types.SamplingParams(max_tokens=2, temperature=1.0, seed=3)
    ids = []
    for _ in range(2):
        clone = tinker.SamplingClient.from_sampler_handle(handle)
        out = result(clone.sample(prompt, num_samples=1, sampling_params=params))
        assert out.sequences and len(out.sequences[0].tokens) >= 1
        ids.append(clone._cloned_sampler_id)
    assert ids == [1, 2], f"clone ids {ids}: the server hands them out in order"


@pytest.mark.feature("create_custom_loss")
def test_create_custom_loss_route_says_why(loops_url):
    status, body = _http(loops_url, "POST", "/api/v1/create_custom_loss", OWNER_KEY,
                         {"session_id": "s", "custom_loss_seq_id": 0, "name": "l", "inputs": [],
                          "graph": {"format": 1, "nodes": []}, "type": "create_custom_loss"})
    assert status == 400
    assert "forward_backward_custom computes the loss on your client" in body["detail"]
