"""API keys as records and JWT auth, with the real SDK against a server with keys.

A server started with a flag key and an operator key: the operator creates a workspace
admin key with `loops keys create`; the admin key creates a member key; the SDK (JWT auth
on: client/config says pjwt_auth_enabled) exchanges each key at auth/token and runs
whoami, a training step and sampling with tokens; `auth/apikey/me` answers the key's
record in the shape `tinker auth login` reads, and `tinker auth logout`'s DELETE revokes it;
a revoked key, and the token the SDK already holds for it, are refused at once.
"""

from __future__ import annotations

import base64
import json
import subprocess

import httpx
import pytest
import tinker
from tinker import types

from e2e_helpers import BASE_MODEL, RESULT_TIMEOUT, result
from loops_server import loops_binary, running_server

OPERATOR_KEY = "tml-e2e-operator-key"
FLAG_KEY = "tml-e2e-flag-key"


def _binary() -> str:
    return str(loops_binary())


@pytest.fixture(scope="module")
def keyed_url():
    with running_server("keys", ["--api-key", f"{FLAG_KEY}=flag-ws", "--operator-key", OPERATOR_KEY]) as server:
        yield server.url


def loops_keys(url: str, key: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([_binary(), "keys", "--url", url, "--api-key", key, *args],
                          capture_output=True, text=True, timeout=60)


def create_key(url: str, key: str, *args: str) -> str:
    out = loops_keys(url, key, "create", *args)
    assert out.returncode == 0, out.stderr
    secret = out.stdout.strip()
    assert secret.startswith("tml-") and len(secret) == 4 + 64, out.stdout
    return secret


def claims(jwt: str) -> dict:
    payload = jwt.split(".")[1]
    return json.loads(base64.urlsafe_b64decode(payload + "=" * (-len(payload) % 4)))


def test_keys_whoami_training_sampling_and_revocation_with_jwt(keyed_url):
    admin = create_key(keyed_url, OPERATOR_KEY, "--workspace", "team-b", "--role", "admin", "--name", "e2e admin")
    member = create_key(keyed_url, admin, "--name", "e2e member")

    # The admin lists its workspace's keys (never a secret); another workspace is not found.
    out = loops_keys(keyed_url, admin, "list", "--json")
    assert out.returncode == 0, out.stderr
    listed = json.loads(out.stdout)["keys"]
    assert {k["workspace"] for k in listed} == {"team-b"}
    assert len(listed) == 2 and member not in out.stdout and admin not in out.stdout
    out = loops_keys(keyed_url, admin, "list", "--workspace", "flag-ws")
    assert out.returncode != 0 and "not found" in out.stderr

    # JWT auth is on: the SDK's whoami reads the claims of the token it exchanged the key for.
    cfg = httpx.post(f"{keyed_url}/api/v1/client/config", json={"sdk_version": "0.38.0"},
                     headers={"X-API-Key": member}).json()
    assert cfg["pjwt_auth_enabled"] is True
    rest = tinker.RestClient(base_url=keyed_url, api_key=member)
    who = result(rest.whoami())
    member_id = httpx.get(f"{keyed_url}/api/v1/auth/apikey/me", headers={"X-API-Key": member}).json()["id"]
    assert who.org_urn == "tml:organization:team-b"
    assert who.user_urn == member_id and member_id.startswith("key-")
    assert who.email is None

    # Every ordinary call works with the token: a session, a training step, sampling.
    sc = tinker.ServiceClient(base_url=keyed_url, api_key=member)
    tc = result(sc.create_lora_training_client(base_model=BASE_MODEL, rank=4, seed=3))
    datum = types.Datum(
        model_input=types.ModelInput.from_ints([5, 6, 7, 8]),
        loss_fn_inputs={"target_tokens": [6, 7, 8, 9], "weights": [1.0, 1.0, 1.0, 1.0]},
    )
    fb = result(tc.forward_backward([datum], "cross_entropy"))
    assert fb.loss_fn_outputs
    result(tc.optim_step(types.AdamParams(learning_rate=1e-3)))
    sampler = tc.save_weights_and_get_sampling_client(name="jwt")
    sampled = result(result(sampler).sample(types.ModelInput.from_ints([5, 6]), 1,
                                     types.SamplingParams(max_tokens=3, temperature=0.0)))
    assert len(sampled.sequences[0].tokens) >= 1
    token = result(sc.holder.run_coroutine_threadsafe(sc.holder.get_identity_jwt()))
    c = claims(token)
    assert c["org_id"] == "team-b" and c["key_id"] == member_id and c["exp"] - c["iat"] == 900

    # tinker auth login's check of a key (the SDK CLI's own client and response model).
    from tinker.cli.auth_api import TinkerAuthApi

    auth_api = TinkerAuthApi(httpx.Client(), base_url=keyed_url)
    self_key = auth_api.get_self_api_key(member)
    assert self_key.name == "e2e member"
    assert self_key.details.org_details.name == "team-b"
    assert self_key.key_id == int(member_id.removeprefix("key-"), 16)

    # The token alone authenticates, as the SDK sends it (X-API-Key).
    r = httpx.get(f"{keyed_url}/api/v1/training_runs", headers={"X-API-Key": token})
    assert r.status_code == 200, r.text
    # The flag key keeps working, with its own workspace.
    me = httpx.get(f"{keyed_url}/api/v1/auth/apikey/me", headers={"X-API-Key": FLAG_KEY}).json()
    assert me["details"]["org_details"]["name"] == "flag-ws"

    # Revoke the member key (tinker auth logout): the key and its live token are refused at
    # once; a token answer asks the SDK for a new one, which the key cannot get.
    auth_api.delete_self_api_key(member)
    r = httpx.get(f"{keyed_url}/api/v1/auth/apikey/me", headers={"X-API-Key": member})
    assert r.status_code == 401 and "revoked" in r.json()["detail"]
    r = httpx.get(f"{keyed_url}/api/v1/training_runs", headers={"X-API-Key": token})
    assert r.status_code == 401 and 'error="invalid_token"' in r.headers["WWW-Authenticate"]
    # (whoami itself reads the SDK's cached token and asks the server nothing.)
    with pytest.raises(tinker.AuthenticationError, match="revoked"):
        result(tc.forward_backward([datum], "cross_entropy"))

    # The admin revokes itself with the CLI; the operator sees both revoked.
    admin_id = httpx.get(f"{keyed_url}/api/v1/auth/apikey/me", headers={"X-API-Key": admin}).json()["id"]
    out = loops_keys(keyed_url, admin, "revoke", admin_id)
    assert out.returncode == 0, out.stderr
    out = loops_keys(keyed_url, OPERATOR_KEY, "list", "--workspace", "team-b", "--json")
    keys = json.loads(out.stdout)["keys"]
    assert all(k.get("revoke_time") for k in keys) and len(keys) == 2
