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


def _openssl(*args, cwd):
    import subprocess

    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="session")
def certs(tmp_path_factory):
    """Certificates shaped as the gateway issues them (backends/pools/mtls), made with the
    openssl command: the gateway CA and the gateway's certificate (CN loops-gateway), the
    worker CA and a worker certificate of pool p (with a DNS name the test client can check),
    another gateway's CA and certificate, and a certificate of the gateway CA with another
    name. Returns {name: PEM bytes}."""
    import shutil

    if shutil.which("openssl") is None:
        if os.environ.get("CI") == "true":
            pytest.fail("the openssl command is needed to make test certificates")
        pytest.skip("no openssl command to make test certificates")
    d = tmp_path_factory.mktemp("certs")

    def ca(name):
        _openssl("req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.pem", "-days", "2", "-subj", f"/CN={name}", "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
                 "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=d)

    def leaf(name, issuer, cn, san, eku):
        _openssl("req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN={cn}", cwd=d)
        (d / f"{name}.ext").write_text(f"subjectAltName={san}\nextendedKeyUsage={eku}\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n")
        _openssl("x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.pem", "-CAkey", f"{issuer}.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", "2", "-extfile", f"{name}.ext", cwd=d)

    for name in ("gwca", "wkca", "otherca"):
        ca(name)
    leaf("gw", "gwca", "loops-gateway", "URI:loops://gateway,DNS:loops-registry", "clientAuth,serverAuth")
    leaf("wk", "wkca", "loops-worker p", "URI:loops://pool/p,DNS:loops-worker", "serverAuth")
    leaf("other", "otherca", "loops-gateway", "URI:loops://gateway,DNS:loops-registry", "clientAuth,serverAuth")
    leaf("notgw", "gwca", "somebody", "URI:loops://somebody", "clientAuth")
    out = {}
    for f in d.glob("*.pem"):
        out[f.stem] = f.read_bytes()
    for f in d.glob("*.key"):
        out[f.stem + ".key"] = f.read_bytes()
    return out


@pytest.fixture(scope="session")
def worker_creds(certs):
    """The worker's credentials (its certificate and key, the gateway CA)."""
    from loops_worker.credentials import Credentials

    return Credentials(cert=certs["wk"], key=certs["wk.key"], ca=certs["gwca"])


def channel(certs, port, client="gw"):
    """A channel to a test worker on port, with the client certificate client ("gw": the
    gateway's; None: none), trusting the worker CA."""
    import grpc

    kw = {}
    if client is not None:
        kw = dict(private_key=certs[client + ".key"], certificate_chain=certs[client])
    creds = grpc.ssl_channel_credentials(root_certificates=certs["wkca"], **kw)
    return grpc.secure_channel(f"127.0.0.1:{port}", creds, options=[("grpc.ssl_target_name_override", "loops-worker")])
