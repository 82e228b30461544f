"""Certificates shaped as a gateway issues them (backends/pools/mtls), made with the openssl
command: for the worker's tests and for benchmarks that drive a worker without a gateway
(bench/gpu). Never for a deployment: there the gateway issues them (its local provider, its
Ray provider, or loops pools credentials).

make(folder) writes and returns {name: PEM bytes}: "gwca" (the gateway CA), "gw" and "gw.key"
(the gateway's certificate, CN loops-gateway), "wkca" (the worker CA), "wk" and "wk.key" (a
worker of pool p, with the DNS name loops-worker that a Python client can check), "otherca",
"other" and "other.key" (another gateway's), "notgw" and "notgw.key" (a certificate of the
gateway CA that is not the gateway's).
"""

from __future__ import annotations

import os
import subprocess

WORKER_NAME = "loops-worker"


def _openssl(folder: str, *args: str) -> None:
    subprocess.run(["openssl", *args], cwd=folder, check=True, capture_output=True)


def make(folder: str, days: int = 2) -> dict:
    os.makedirs(folder, mode=0o700, exist_ok=True)

    def ca(name):
        _openssl(folder, "req", "-x509", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.pem", "-days", str(days), "-subj", f"/CN={name}",
                 "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0", "-addext", "keyUsage=critical,keyCertSign,cRLSign")

    def leaf(name, issuer, cn, san, eku):
        _openssl(folder, "req", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:P-256", "-nodes", "-keyout", f"{name}.key",
                 "-out", f"{name}.csr", "-subj", f"/CN={cn}")
        with open(os.path.join(folder, f"{name}.ext"), "w") as f:
            f.write(f"subjectAltName={san}\nextendedKeyUsage={eku}\nkeyUsage=critical,digitalSignature\nbasicConstraints=CA:FALSE\n")
        _openssl(folder, "x509", "-req", "-in", f"{name}.csr", "-CA", f"{issuer}.pem", "-CAkey", f"{issuer}.key", "-CAcreateserial",
                 "-out", f"{name}.pem", "-days", str(days), "-extfile", f"{name}.ext")

    for name in ("gwca", "wkca", "otherca"):
        ca(name)
    leaf("gw", "gwca", "loops-gateway", "URI:loops://gateway,DNS:loops-registry", "clientAuth,serverAuth")
    leaf("wk", "wkca", "loops-worker p", f"URI:loops://pool/p,DNS:{WORKER_NAME}", "serverAuth")
    leaf("other", "otherca", "loops-gateway", "URI:loops://gateway,DNS:loops-registry", "clientAuth,serverAuth")
    leaf("notgw", "gwca", "somebody", "URI:loops://somebody", "clientAuth")
    out = {}
    for f in sorted(os.listdir(folder)):
        stem, ext = os.path.splitext(f)
        if ext in (".pem", ".key"):
            os.chmod(os.path.join(folder, f), 0o600)
            with open(os.path.join(folder, f), "rb") as fh:
                out[stem if ext == ".pem" else stem + ".key"] = fh.read()
    return out


def worker_args(folder: str) -> list:
    """The worker flags naming the worker's credentials that make(folder) wrote."""
    return ["--tls-cert", os.path.join(folder, "wk.pem"), "--tls-key", os.path.join(folder, "wk.key"), "--tls-ca", os.path.join(folder, "gwca.pem")]


def channel(certs: dict, address: str, client: str | None = "gw", options=()):
    """A gRPC channel to a worker with make's certificates at host:port, with the client
    certificate client ("gw": the gateway's; None: none), trusting the worker CA."""
    import grpc

    kw = {}
    if client is not None:
        kw = dict(private_key=certs[client + ".key"], certificate_chain=certs[client])
    creds = grpc.ssl_channel_credentials(root_certificates=certs["wkca"], **kw)
    return grpc.secure_channel(address, creds, options=[("grpc.ssl_target_name_override", WORKER_NAME), *options])
