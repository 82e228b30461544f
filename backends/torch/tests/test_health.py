"""The worker's grpc.health.v1 service (loops_worker/health.py): SERVING over the worker's
mutual TLS, to the gateway only; NOT_SERVING once it drains or once a call breaks its
engine (a device error), which a Watch stream sees; a recoverable error (out of memory, a
bad request) leaves it SERVING."""

import grpc
import pytest
import torch
from grpc_health.v1 import health_pb2, health_pb2_grpc

from conftest import channel
from loops_worker.confine import Confinement
from loops_worker.health import SERVICES, broken_by
from loops_worker.proto import bgrpc, bpb
from loops_worker.sampler import HFSampler
from loops_worker.server import serve

SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


class _Breakable:
    """The engine, whose forward_backward raises what fail holds (a test double for a
    device failure, which a CPU cannot produce)."""

    def __init__(self, engine):
        self.e = engine
        self.fail = None

    def __getattr__(self, name):
        return getattr(self.e, name)

    def forward_backward(self, req):
        if self.fail is not None:
            raise self.fail
        return self.e.forward_backward(req)


@pytest.fixture
def worker(engine, tmp_path, worker_creds):
    eng = _Breakable(engine)
    server = serve(eng, HFSampler(engine), "127.0.0.1:0", worker_creds, Confinement([str(tmp_path)]), threads=8)
    yield server, eng
    server.stop(0)


def _check(ch, service=""):
    return health_pb2_grpc.HealthStub(ch).Check(health_pb2.HealthCheckRequest(service=service), timeout=10).status


def test_health_serving_to_the_gateway_only(worker, certs):
    server, _ = worker
    gw = channel(certs, server.bound_port)
    assert SERVICES == ("loops.backend.v1.TrainerService", "loops.backend.v1.SamplerService")
    for service in ("",) + SERVICES:
        assert _check(gw, service) == SERVING, service
    with pytest.raises(grpc.RpcError) as e:
        _check(gw, "loops.v1.TrainingService")
    assert e.value.code() == grpc.StatusCode.NOT_FOUND
    for name, client in {"no certificate": None, "another gateway": "other", "not the gateway": "notgw"}.items():
        with pytest.raises(grpc.RpcError) as e:
            _check(channel(certs, server.bound_port, client=client))
        assert e.value.code() in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.UNAUTHENTICATED), name
    with pytest.raises(grpc.RpcError) as e:
        _check(grpc.insecure_channel(f"127.0.0.1:{server.bound_port}"))
    assert e.value.code() == grpc.StatusCode.UNAVAILABLE, "plaintext"


def test_health_not_serving_once_the_engine_breaks(worker, certs):
    server, eng = worker
    gw = channel(certs, server.bound_port)
    tr = bgrpc.TrainerServiceStub(gw)
    watch = health_pb2_grpc.HealthStub(gw).Watch(health_pb2.HealthCheckRequest(), timeout=30)
    assert next(watch).status == SERVING
    req = bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(adapter_id="nope", loss_fn="cross_entropy")])
    # Errors the next call may not have: still SERVING.
    for fail in (torch.cuda.OutOfMemoryError("CUDA out of memory"), ValueError("a bug")):
        eng.fail = fail
        with pytest.raises(grpc.RpcError) as e:
            tr.ForwardBackward(req, timeout=10)
        assert e.value.code() == grpc.StatusCode.INTERNAL
        assert _check(gw) == SERVING, fail
    # A device error: NOT_SERVING for good, every service, and the Watch stream hears it.
    eng.fail = torch.AcceleratorError("CUDA error: an illegal memory access was encountered")
    with pytest.raises(grpc.RpcError) as e:
        tr.ForwardBackward(req, timeout=10)
    assert e.value.code() == grpc.StatusCode.INTERNAL
    assert next(watch).status == NOT_SERVING
    eng.fail = None
    for service in ("",) + SERVICES:
        assert _check(gw, service) == NOT_SERVING, service
    assert "illegal memory access" in server.health.why
    watch.cancel()


def test_health_not_serving_while_draining(worker, certs):
    server, _ = worker
    gw = channel(certs, server.bound_port)
    watch = health_pb2_grpc.HealthStub(gw).Watch(health_pb2.HealthCheckRequest(service=SERVICES[0]), timeout=30)
    assert next(watch).status == SERVING
    server.health.drain()
    assert next(watch).status == NOT_SERVING
    assert _check(gw) == NOT_SERVING
    assert server.health.why == "the worker is shutting down"
    # the services still answer the calls in flight and those that come meanwhile
    assert bgrpc.TrainerServiceStub(gw).GetCapabilities(bpb.GetCapabilitiesRequest(), timeout=10).models[0].name == "tiny"
    watch.cancel()


def test_broken_by():
    assert broken_by(torch.cuda.OutOfMemoryError("CUDA out of memory")) == ""
    assert broken_by(RuntimeError("shape mismatch")) == ""
    assert "device failed" in broken_by(RuntimeError("CUDA error: device-side assert triggered"))
    assert "device failed" in broken_by(torch.AcceleratorError("CUDA error: unspecified launch failure"))

    class EngineDeadError(Exception):
        pass

    assert "sampling engine died" in broken_by(EngineDeadError("EngineCore encountered an issue"))
