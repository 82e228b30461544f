import os
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.normpath(os.path.join(HERE, "..", "..", ".."))
sys.path.insert(0, os.path.join(ROOT, "backends", "torch"))
sys.path.insert(0, os.path.join(ROOT, "gen", "python"))
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@pytest.fixture(scope="session")
def tiny_dir(tmp_path_factory):
    """A tiny Qwen3ForCausalLM with random weights from a fixed seed (no tokenizer)."""
    import torch
    from transformers import Qwen3Config, Qwen3ForCausalLM

    d = tmp_path_factory.mktemp("tiny-qwen3")
    cfg = Qwen3Config(vocab_size=320, hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, head_dim=16, max_position_embeddings=256,
                      tie_word_embeddings=False, rms_norm_eps=1e-6, eos_token_id=2, bos_token_id=1)
    torch.manual_seed(1234)
    m = Qwen3ForCausalLM(cfg)
    m.save_pretrained(str(d))
    return str(d)


@pytest.fixture(scope="session")
def engine(tiny_dir):
    import torch

    from loops_worker.engine import BaseModel, Engine

    bm = BaseModel("tiny", tiny_dir, torch.device("cpu"), torch.float32, 64)
    return Engine({"tiny": bm}, ["tiny"])



@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """Certificates shaped as the gateway issues them (loops_worker.testcerts, made with the
    openssl command), {name: PEM bytes}."""
    import shutil

    from loops_worker import testcerts

    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the openssl command is needed to make test certificates")
        pytest.skip("no openssl command to make test certificates")
    return testcerts.make(str(tmp_path_factory.mktemp("certs")))


@pytest.fixture(scope="session")
def worker_creds(certs):
    """The worker's credentials (its certificate and key, the gateway CA)."""
    from loops_worker.credentials import Credentials

    return Credentials(cert=certs["wk"], key=certs["wk.key"], ca=certs["gwca"])


def channel(certs, port, client="gw"):
    """A channel to a test worker on port, as client (testcerts.channel)."""
    from loops_worker import testcerts

    return testcerts.channel(certs, f"127.0.0.1:{port}", client)
