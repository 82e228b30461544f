"""The worker's health: the standard grpc.health.v1 service (grpcio-health-checking's
servicer), served on the worker's port behind the same mutual TLS and gateway-only check as
the rest (credentials.py), as the Go worker serves it (backends/serve).

SERVING, for the server as a whole ("") and for TrainerService and SamplerService, until
either the worker starts to shut down (drain: SIGTERM, SIGINT, the gateway closing its
stdin or telling it to drain) or its engine breaks: a call failed with an error after which
the device cannot compute any more (a CUDA error such as an illegal memory access or a
device-side assert, which leave the CUDA context unusable; vLLM's engine having died). Then
every service answers NOT_SERVING for good: the gateway's health checks declare the worker
dead and the local provider starts a new one, instead of sending it work that would fail.
Running out of GPU memory is not broken (the call fails with RESOURCE_EXHAUSTED and the
next may fit).
"""

from __future__ import annotations

import logging
import threading

from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from .proto import bpb

log = logging.getLogger("loops_worker")

SERVICES = tuple(bpb.DESCRIPTOR.services_by_name[n].full_name for n in ("TrainerService", "SamplerService"))
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING

# Errors of engines that leave the device unusable, by class name (vLLM is optional and
# not imported for this).
_DEAD_ENGINE = {"EngineDeadError"}


def broken_by(e: BaseException) -> str:
    """What e says about the engine: "" when the next call may succeed, else why the
    engine cannot compute any more."""
    if type(e).__name__ in _DEAD_ENGINE:
        return f"the sampling engine died: {type(e).__name__}: {e}"
    try:
        import torch
    except ImportError:  # pragma: no cover - the worker always has torch
        return ""
    if isinstance(e, torch.cuda.OutOfMemoryError):
        return ""
    accel = getattr(torch, "AcceleratorError", None)
    if (accel is not None and isinstance(e, accel)) or (isinstance(e, RuntimeError) and "CUDA error" in str(e)):
        return f"the device failed and cannot compute any more: {type(e).__name__}: {e}"
    return ""


class Health:
    """The worker's grpc.health.v1 servicer and its state (see the module's doc)."""

    def __init__(self):
        self.servicer = health.HealthServicer()
        for name in ("",) + SERVICES:
            self.servicer.set(name, SERVING)
        self._mu = threading.Lock()
        self.why = ""  # why it is NOT_SERVING ("" while SERVING)

    def add_to(self, server) -> None:
        health_pb2_grpc.add_HealthServicer_to_server(self.servicer, server)

    def drain(self) -> None:
        """NOT_SERVING for good: the worker is shutting down."""
        with self._mu:
            if not self.why:
                self.why = "the worker is shutting down"
        self.servicer.enter_graceful_shutdown()

    def check(self, e: BaseException) -> None:
        """Marks the engine broken (NOT_SERVING for good) when e says it is (broken_by)."""
        why = broken_by(e)
        if not why:
            return
        with self._mu:
            if self.why:
                return
            self.why = why
        log.error("health: NOT_SERVING: %s; the gateway will replace this worker", why)
        for name in ("",) + SERVICES:
            self.servicer.set(name, NOT_SERVING)
