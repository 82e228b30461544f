"""Bootstrap: client/config, dynamic_config, create_session, capabilities, model creation."""

from __future__ import annotations

import warnings

import pytest
import tinker

from e2e_helpers import BASE_MODEL, encode, result


def test_rest_client_server_capabilities(rest_client):
    # RestClient(): client/config -> dynamic_config -> GET get_server_capabilities
    caps = result(rest_client.get_server_capabilities())
    names = [m.model_name for m in caps.supported_models]
    assert BASE_MODEL in names, f"supported_models={caps.supported_models}"


def test_service_client_server_capabilities_deprecated_path(service_client):
    # The deprecated ServiceClient method still works in 0.38.0 (FutureWarning).
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        caps = service_client.get_server_capabilities()
    assert BASE_MODEL in [m.model_name for m in caps.supported_models]


def test_create_lora_training_client(service_client):
    # create_session (first use) -> create_model + retrieve_future -> get_info
    tc = result(
        service_client.create_lora_training_client(base_model=BASE_MODEL, rank=8, seed=7)
    )
    assert isinstance(tc, tinker.TrainingClient)
    assert tc.model_id, "create_model result had an empty model_id"
    info = tc.get_info()  # cached from the get_info call made at creation
    assert info.model_id == tc.model_id
    assert info.model_data.model_name == BASE_MODEL
    if info.lora_rank is not None:
        assert info.lora_rank == 8
    if info.is_lora is not None:
        assert info.is_lora is True


def test_training_clients_get_distinct_ids(service_client):
    tc1 = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    tc2 = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    assert tc1.model_id != tc2.model_id


def test_tokenizer_offline(service_client):
    # TrainingClient.get_tokenizer(): HF AutoTokenizer from get_info's model_data
    # (tokenizer_id or model_name), with HF_HUB_OFFLINE=1.
    tc = result(service_client.create_lora_training_client(base_model=BASE_MODEL, rank=4))
    tok = tc.get_tokenizer()
    text = "Hello, Loops! ünïcödé"
    ids = encode(tok, text)
    assert ids and all(isinstance(i, int) for i in ids)
    assert tok.decode(ids) == text  # byte-level tokenizer round-trips exactly


@pytest.mark.feature("session_finish")
def test_service_client_context_manager_finishes_session(loops_url):
    # `with ServiceClient()` -> POST /api/v1/sessions/{id}/finish on exit.
    with tinker.ServiceClient() as sc:
        tc = result(sc.create_lora_training_client(base_model=BASE_MODEL, rank=4))
        assert tc.model_id


@pytest.mark.feature("errors")
def test_unknown_base_model_is_an_error(service_client):
    with pytest.raises(Exception) as excinfo:
        result(
            service_client.create_lora_training_client(base_model="no-such-org/no-such-model"),
            timeout=120,
        )
    assert not isinstance(excinfo.value, TimeoutError), "server hung instead of refusing"
