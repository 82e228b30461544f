"""The worker's TLS credentials (the Go side: backends/pools/mtls).

The worker protocol is authenticated both ways with mutual TLS: the gateway issues each
worker a certificate of its worker CA naming the worker's pool, and the worker answers only
clients whose certificate the gateway CA signed (only the gateway's own is), named
"loops-gateway". The same gateway CA is what the worker checks the Registry's certificate
against (its name is "loops-registry", whatever host the registry URL names).

The credentials come as files (--tls-cert, --tls-key, --tls-ca: the gateway's local provider
writes them, mode 0600; loops pools credentials issues them for a worker started by hand) or,
for the Ray pool driver's actors, as PEM text in the environment (LOOPS_WORKER_TLS_CERT,
LOOPS_WORKER_TLS_KEY, LOOPS_WORKER_TLS_CA). A key file that other users may read is refused.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass

import grpc

GATEWAY_CN = "loops-gateway"
REGISTRY_NAME = "loops-registry"
ENV_CERT, ENV_KEY, ENV_CA = "LOOPS_WORKER_TLS_CERT", "LOOPS_WORKER_TLS_KEY", "LOOPS_WORKER_TLS_CA"

MISSING = ("the worker serves over mutual TLS only and needs the credentials the gateway issues (--tls-cert, --tls-key, "
           "--tls-ca): the gateway writes them for the workers it starts, and loops pools credentials issues them for a "
           "worker started by hand")


@dataclass(frozen=True)
class Credentials:
    cert: bytes
    key: bytes
    ca: bytes

    def __repr__(self) -> str:  # never print the key
        return "Credentials(...)"

    def server(self) -> grpc.ServerCredentials:
        """Serving: this worker's certificate; clients must present one the gateway CA signed."""
        return grpc.ssl_server_credentials([(self.key, self.cert)], root_certificates=self.ca, require_client_auth=True)

    def registry_channel(self, target: str) -> grpc.Channel:
        """A channel to the gateway's Registry at host:port, which must show the gateway's
        certificate."""
        return grpc.secure_channel(target, grpc.ssl_channel_credentials(root_certificates=self.ca),
                                   options=[("grpc.ssl_target_name_override", REGISTRY_NAME)])


def _check(c: Credentials) -> Credentials:
    if b"CERTIFICATE" not in c.cert or b"PRIVATE KEY" not in c.key or b"CERTIFICATE" not in c.ca:
        raise ValueError("the worker's TLS credentials are not PEM certificates and a key (issue them with loops pools credentials)")
    return c


def load(cert_file: str, key_file: str, ca_file: str) -> Credentials:
    """Reads the credentials' files; the key file must not be readable by others."""
    if not (cert_file and key_file and ca_file):
        raise ValueError(MISSING)
    mode = stat.S_IMODE(os.stat(key_file).st_mode)
    if mode & 0o077:
        raise ValueError(f"key file {key_file} may be read by other users (mode {mode:04o}); chmod 600 it")
    out = []
    for f in (cert_file, key_file, ca_file):
        with open(f, "rb") as fh:
            out.append(fh.read())
    return _check(Credentials(*out))


def from_env() -> Credentials | None:
    """The credentials in the environment (the Ray pool driver's), or None. The key is then
    removed from this process's environment, so that no process it starts inherits it."""
    vals = [os.environ.get(k, "") for k in (ENV_CERT, ENV_KEY, ENV_CA)]
    if not all(vals):
        return None
    c = _check(Credentials(*(v.encode() for v in vals)))
    os.environ.pop(ENV_KEY, None)
    return c


def from_args(args) -> Credentials:
    """The files the command line names, else the environment's; ValueError when neither."""
    if args.tls_cert or args.tls_key or args.tls_ca:
        return load(args.tls_cert, args.tls_key, args.tls_ca)
    c = from_env()
    if c is None:
        raise ValueError(MISSING)
    return c


class GatewayOnly(grpc.ServerInterceptor):
    """Refuses a call whose client certificate does not name the gateway (mutual TLS has
    already checked that the gateway CA signed it; this checks whose it is)."""

    @staticmethod
    def _check(context) -> None:
        names = context.auth_context().get("x509_common_name", [])
        if GATEWAY_CN.encode() not in names:
            context.abort(grpc.StatusCode.UNAUTHENTICATED, "the client is not the gateway")

    def intercept_service(self, continuation, details):
        h = continuation(details)
        if h is None:
            return None
        if h.unary_unary is not None:
            fn = h.unary_unary

            def unary_unary(req, context):
                self._check(context)
                return fn(req, context)

            return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=h.request_deserializer,
                                                       response_serializer=h.response_serializer)
        if h.unary_stream is not None:
            fn = h.unary_stream

            def unary_stream(req, context):
                self._check(context)
                yield from fn(req, context)

            return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=h.request_deserializer,
                                                        response_serializer=h.response_serializer)
        # the worker serves no client-streaming methods: refuse whatever else comes
        return None
