"""gRPC servicers for loops.backend.v1 TrainerService and SamplerService, and the standard
grpc.health.v1 service (health.py), served over mutual TLS only (credentials.py), every
request's folders and URLs checked first (confine.py)."""

from __future__ import annotations

import logging
import os
import queue
import shutil
import tempfile
import threading
import time
import traceback
from concurrent import futures

import grpc

from . import tracing, transfer
from .confine import Confinement
from .credentials import Credentials, GatewayOnly
from .errors import CANCELLED, INTERNAL, WorkerError
from .health import Health
from .proto import bgrpc, bpb

log = logging.getLogger("loops_worker")

_CODES = {c.value[0]: c for c in grpc.StatusCode}
_FAULTS = os.environ.get("LOOPS_WORKER_TEST_FAULTS") == "1"


def _call(context, fn, *args, health: Health | None = None):
    """fn(*args), its WorkerError answered with its code and anything else as INTERNAL; an
    error that leaves the engine broken makes health NOT_SERVING (Health.check)."""
    try:
        return fn(*args)
    except WorkerError as e:
        context.abort(_CODES.get(e.code, grpc.StatusCode.INTERNAL), e.message)
    except Exception as e:  # noqa: BLE001
        log.error("internal error: %s", traceback.format_exc())
        if health is not None:
            health.check(e)
        context.abort(grpc.StatusCode.INTERNAL, f"worker internal error: {type(e).__name__}: {e}")


class _Calls:
    """_call with the servicer's health."""

    health: Health | None = None

    def _call(self, context, fn, *args):
        return _call(context, fn, *args, health=self.health)


def _fault(adapter_id: str) -> None:
    """Test hooks (LOOPS_WORKER_TEST_FAULTS=1 only): simulate a crash, a hang, or a device
    error that breaks the engine (health.py)."""
    if not _FAULTS:
        return
    if adapter_id == "__crash__":
        os._exit(17)
    if adapter_id == "__device_error__":
        import torch

        raise torch.AcceleratorError("CUDA error: an illegal memory access was encountered (a test fault)")
    if adapter_id == "__hang__":
        while True:
            time.sleep(3600)


class Trainer(_Calls, bgrpc.TrainerServiceServicer):
    def __init__(self, engine, confine: Confinement, health: Health | None = None):
        self.e = engine
        self.confine = confine
        self.health = health

    def GetCapabilities(self, request, context):
        return self._call(context, self.e.capabilities)

    def CreateAdapter(self, request, context):
        return self._call(context, lambda: (self.e.create_adapter(request), bpb.CreateAdapterResponse())[1])

    def DeleteAdapter(self, request, context):
        return self._call(context, lambda: (self.e.delete_adapter(request.adapter_id), bpb.DeleteAdapterResponse())[1])

    def ForwardBackward(self, request, context):
        return self._call(context, self._forward_backward, request)

    def _forward_backward(self, request):
        for it in request.items:
            _fault(it.adapter_id)
        with tracing.span("torch forward_backward", **{"loops.batch.items": len(request.items),
                                                       "loops.batch.datums": sum(len(it.data) for it in request.items)}):
            return self.e.forward_backward(request)

    def OptimStep(self, request, context):
        with tracing.span("torch optim_step"):
            return self._call(context, self.e.optim_step, request)

    def SaveAdapter(self, request, context):
        self._call(context, self._check_save, request)
        if not request.upload:
            return self._call(context, lambda: bpb.SaveAdapterResponse(size_bytes=self.e.save_adapter(request)))
        return self._call(context, self._save_and_upload, request)

    def _check_save(self, request):
        self.confine.dir("dir", request.dir)
        self.confine.files("upload", request.upload)

    def _check_load(self, request):
        self.confine.dir("dir", request.dir)
        self.confine.files("download", request.download)

    def _save_and_upload(self, request):
        """Saves into a folder of the worker's own and PUTs the files to the gateway's URLs."""
        tmp = tempfile.mkdtemp(prefix="loops-save-")
        try:
            local = bpb.SaveAdapterRequest()
            local.CopyFrom(request)
            del local.upload[:]
            local.dir = os.path.join(tmp, "adapter")
            size = self.e.save_adapter(local)
            files = transfer.upload(local.dir, request.upload, self.confine)
            return bpb.SaveAdapterResponse(size_bytes=size, files=files)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)

    def LoadAdapter(self, request, context):
        self._call(context, self._check_load, request)
        if not request.download:
            return self._call(context, lambda: (self.e.load_adapter(request), bpb.LoadAdapterResponse())[1])
        return self._call(context, self._download_and_load, request)

    def _download_and_load(self, request):
        """Downloads the files (size and SHA-256 checked) into a folder of its own and loads."""
        tmp = tempfile.mkdtemp(prefix="loops-load-")
        try:
            local = bpb.LoadAdapterRequest()
            local.CopyFrom(request)
            del local.download[:]
            local.dir = os.path.join(tmp, "adapter")
            transfer.download(request.download, local.dir, self.confine)
            self.e.load_adapter(local)
            return bpb.LoadAdapterResponse()
        finally:
            shutil.rmtree(tmp, ignore_errors=True)


class Sampler(_Calls, bgrpc.SamplerServiceServicer):
    def __init__(self, engine, sampler, confine: Confinement, adapters: transfer.AdapterCache | None = None,
                 health: Health | None = None):
        self.e = engine
        self.s = sampler
        self.confine = confine
        self.health = health
        self.adapters = adapters or transfer.AdapterCache(
            os.path.join(tempfile.gettempdir(), f"loops-worker-adapters-{os.getpid()}"),
            int(os.environ.get("LOOPS_WORKER_ADAPTER_CACHE_BYTES", str(8 << 30))), confine)

    def _check(self, request):
        self.confine.dir("adapter_dir", request.adapter_dir)
        self.confine.files("adapter_files", request.adapter_files)

    def GetCapabilities(self, request, context):
        return self._call(context, self.e.capabilities)

    def Sample(self, request, context):
        self._call(context, self._check, request)
        if not request.adapter_files:
            return self._call(context, self.s.sample, request)
        return self._call(context, self._sample_downloaded, request)

    def _sample_downloaded(self, request, on_token=None):
        """Samples with an adapter given as URLs, downloaded once per content (AdapterCache)."""
        local = bpb.SampleRequest()
        local.CopyFrom(request)
        del local.adapter_files[:]
        local.adapter_dir = self.adapters.get(request.adapter_files)
        return self._sample(local, on_token)

    def _sample(self, request, on_token=None):
        if on_token is not None and getattr(self.s, "streams", False):
            return self.s.sample(request, on_token)
        return self.s.sample(request)

    def StreamSample(self, request, context):
        """Sample, with every token sent as the sampler draws it (the transformers sampler;
        vLLM's answers come whole), then the result. The sample runs on its own thread; a
        client that goes away stops it at its next token."""
        req = request.request
        self._call(context, self._check, req)
        items: "queue.SimpleQueue" = queue.SimpleQueue()
        end = object()

        def on_token(i, t, lp, top):
            if not context.is_active():
                raise WorkerError(CANCELLED, "the client stopped reading the sample")
            msg = bpb.SampledToken(sequence=i, token=t, logprob=lp)
            if top:
                msg.top_tokens.extend(int(a) for a, _ in top)
                msg.top_logprobs.extend(float(b) for _, b in top)
            items.put(bpb.StreamSampleResponse(token=msg))

        def run():
            try:
                if req.adapter_files:
                    resp = self._sample_downloaded(req, on_token)
                else:
                    resp = self._sample(req, on_token)
                items.put(bpb.StreamSampleResponse(response=resp))
            except BaseException as e:  # noqa: BLE001 - reported to the client below
                items.put(e)
            finally:
                items.put(end)

        threading.Thread(target=run, name="stream-sample", daemon=True).start()
        while True:
            item = items.get()
            if item is end:
                return
            if isinstance(item, BaseException):
                self._call(context, _raise, item)
                return
            yield item


def _raise(e: BaseException):
    raise e


def serve(engine, sampler, listen: str, creds: Credentials, confine: Confinement, threads: int = 64) -> grpc.Server:
    """Serves the engine over mutual TLS with creds (only the gateway is answered), with
    its health (server.health: Health, which the caller drains on shutdown); the folders
    and URLs of requests are checked against confine."""
    opts = [("grpc.max_receive_message_length", 1 << 30), ("grpc.max_send_message_length", 1 << 30)]
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=threads), options=opts,
                         interceptors=[GatewayOnly(), tracing.Tracing()])
    health = Health()
    bgrpc.add_TrainerServiceServicer_to_server(Trainer(engine, confine, health), server)
    bgrpc.add_SamplerServiceServicer_to_server(Sampler(engine, sampler, confine, health=health), server)
    health.add_to(server)
    server.health = health  # type: ignore[attr-defined]
    port = server.add_secure_port(listen, creds.server())
    if port == 0:
        raise WorkerError(INTERNAL, f"cannot listen on {listen}")
    server.start()
    server.bound_port = port  # type: ignore[attr-defined]
    return server
