"""Registration with the gateway's RegistryService (loops.backend.v1): the worker side.

`Registration(...).start()` registers the worker (pool, replica, address, capabilities, a
random incarnation id, the join token) over TLS (the registry must show the gateway's
certificate: credentials.py) and keeps its lease with a heartbeat stream in a
background thread. When the gateway is unreachable or forgot the lease it registers again
with the same incarnation (its adapters are intact); when the gateway says drain, or refuses
the registration for good (bad token, replica beyond the pool's size), `done` is set and the
worker exits. Mirrors `pools.Hold` in Go (backends/pools/client.go).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
import uuid

import grpc

from .proto import bpb  # noqa: F401  (puts gen/python on sys.path)
from loops.backend.v1 import registry_pb2 as rpb  # type: ignore  # noqa: E402
from loops.backend.v1 import registry_pb2_grpc as rgrpc  # type: ignore  # noqa: E402

log = logging.getLogger("loops_worker.register")

_FATAL = {grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED,
          grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION}


def target(url: str) -> str:
    """https://host:port -> host:port (gRPC over TLS: the registry serves TLS only)."""
    if not url.startswith("https://"):
        raise ValueError(f"registry URL {url!r} must be https://host:port (the registry serves TLS only)")
    return url[len("https://"):].rstrip("/")


def read_token(path: str) -> str:
    with open(path, encoding="utf-8") as f:
        tok = f.read().strip()
    if not tok:
        raise ValueError(f"the join token file {path} is empty")
    return tok


class Registration:
    def __init__(self, url: str, pool: str, replica: int, address: str, token: str, creds,
                 capabilities=None, gpus: int = 0, incarnation: str | None = None):
        self.url, self.pool, self.replica, self.address = url, pool, replica, address
        self.token, self.capabilities, self.gpus = token, capabilities, gpus
        self.incarnation = incarnation or uuid.uuid4().hex
        self.done = threading.Event()  # set when the worker should exit
        self.why = ""
        self._stop = threading.Event()
        self._lease = ""
        self._chan = creds.registry_channel(target(url))
        self._stub = rgrpc.RegistryServiceStub(self._chan)
        self._thread = threading.Thread(target=self._run, name="loops-register", daemon=True)

    def start(self) -> "Registration":
        self._thread.start()
        return self

    def stop(self) -> None:
        """Deregisters (best effort) and stops heartbeating."""
        self._stop.set()
        if self._lease:
            try:
                self._stub.Deregister(rpb.DeregisterRequest(lease_id=self._lease), timeout=2)
            except grpc.RpcError:
                pass
        self._thread.join(timeout=5)
        self._chan.close()

    def _finish(self, why: str) -> None:
        self.why = why
        log.warning("registration ends: %s", why)
        self.done.set()

    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            req = rpb.RegisterRequest(pool_id=self.pool, replica=self.replica, address=self.address,
                                      incarnation_id=self.incarnation, join_token=self.token, gpus=self.gpus)
            if self.capabilities is not None:
                req.capabilities.CopyFrom(self.capabilities)
            try:
                resp = self._stub.Register(req, timeout=10)
            except grpc.RpcError as e:
                if e.code() in _FATAL:
                    self._finish(f"registration refused: {e.code().name}: {e.details()}")
                    return
                log.info("registry %s unreachable (%s); retrying in %.1fs", self.url, e.code().name, backoff)
                self._stop.wait(backoff)
                backoff = min(2 * backoff, 5.0)
                continue
            backoff = 0.2
            self._lease = resp.lease_id
            log.info("registered as pool %s replica %d at %s (incarnation %s)", self.pool, self.replica, self.address, self.incarnation)
            if self._beat(resp):
                return

    def _beat(self, resp) -> bool:
        """Holds the heartbeat stream; True when the worker must stop."""
        every = max(resp.heartbeat_interval_ms, 100) / 1000.0
        q: queue.Queue = queue.Queue()
        lease = resp.lease_id

        def beats():
            yield rpb.HeartbeatRequest(lease_id=lease)
            while True:
                try:
                    item = q.get(timeout=every)
                except queue.Empty:
                    item = True
                if item is None:
                    return
                yield rpb.HeartbeatRequest()

        call = self._stub.Heartbeat(beats())
        stopper = threading.Thread(target=lambda: (self._stop.wait(), q.put(None), call.cancel()), daemon=True)
        stopper.start()
        try:
            for r in call:
                if r.drain:
                    self._finish("the gateway asked this replica to drain (pool scaled down or deleted)")
                    return True
        except grpc.RpcError as e:
            if self._stop.is_set():
                return True
            if e.code() == grpc.StatusCode.NOT_FOUND:
                log.warning("lease ended (%s); registering again", e.details())
            else:
                log.info("heartbeat stream broke (%s); registering again", e.code().name)
                time.sleep(0.2)
        finally:
            q.put(None)
        return self._stop.is_set()
