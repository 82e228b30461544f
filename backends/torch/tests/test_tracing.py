"""The worker's OpenTelemetry spans (loops_worker.tracing): exported over OTLP
http/protobuf to a receiver decoding the protobuf, children of the traceparent the gateway
sends in the call's gRPC metadata, and free of token ids."""

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from loops_worker.proto import bpb, tpb

TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"
PARENT = "00f067aa0ba902b7"


class _Receiver(BaseHTTPRequestHandler):
    """POST /v1/traces: decodes ExportTraceServiceRequest and keeps its spans."""

    spans: list = []

    def do_POST(self):  # noqa: N802
        from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import (
            ExportTraceServiceRequest, ExportTraceServiceResponse)

        body = self.rfile.read(int(self.headers["Content-Length"]))
        if self.headers.get("Content-Encoding") == "gzip":
            import gzip

            body = gzip.decompress(body)
        req = ExportTraceServiceRequest.FromString(body)
        for rs in req.resource_spans:
            service = next((a.value.string_value for a in rs.resource.attributes if a.key == "service.name"), "")
            for ss in rs.scope_spans:
                for s in ss.spans:
                    _Receiver.spans.append((service, s))
        out = ExportTraceServiceResponse().SerializeToString()
        self.send_response(200)
        self.send_header("Content-Type", "application/x-protobuf")
        self.send_header("Content-Length", str(len(out)))
        self.end_headers()
        self.wfile.write(out)

    def log_message(self, *args):
        pass


def test_configured_follows_the_gateway_rule():
    from loops_worker.tracing import configured

    assert not configured({})
    assert configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318"})
    assert not configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_TRACES_EXPORTER": "none"})
    assert not configured({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x", "OTEL_SDK_DISABLED": "true"})
    assert configured({"OTEL_TRACES_EXPORTER": "otlp"})


def test_exporter_follows_the_protocol(monkeypatch):
    from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GRPC
    from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HTTP

    from loops_worker.tracing import otlp_exporter

    assert isinstance(otlp_exporter({"OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}), GRPC)
    assert isinstance(otlp_exporter({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
                                     "OTEL_EXPORTER_OTLP_TRACES_PROTOCOL": "grpc"}), GRPC)
    assert isinstance(otlp_exporter({}), HTTP)
    assert otlp_exporter({"OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}) is None
    assert otlp_exporter({"OTEL_TRACES_EXPORTER": "zipkin"}) is None


def test_spans_continue_the_gateways_traceparent(engine, tmp_path, certs, worker_creds, monkeypatch):
    from conftest import channel
    from loops_worker import tracing
    from loops_worker.confine import Confinement
    from loops_worker.proto import bgrpc
    from loops_worker.sampler import HFSampler
    from loops_worker.server import serve

    httpd = ThreadingHTTPServer(("127.0.0.1", 0), _Receiver)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_ENDPOINT", f"http://127.0.0.1:{httpd.server_address[1]}")
    monkeypatch.setenv("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    monkeypatch.delenv("OTEL_SERVICE_NAME", raising=False)
    provider = tracing.setup()
    assert provider is not None
    server = serve(engine, HFSampler(engine), "127.0.0.1:0", worker_creds, Confinement([str(tmp_path)]), threads=4)
    try:
        tr = bgrpc.TrainerServiceStub(channel(certs, server.bound_port))
        md = (("traceparent", f"00-{TRACE}-{PARENT}-01"),)
        tr.CreateAdapter(bpb.CreateAdapterRequest(adapter_id="traced", base_model="tiny",
                                                  lora=tpb.LoraConfig(rank=4, seed=7, train_attn=True)), metadata=md)
        toks = [5, 9, 33, 70, 11, 2]
        d = tpb.Datum(tokens=toks)
        d.loss_fn_inputs["target_tokens"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_INT64, shape=[6], int64_data=toks[1:] + [0]))
        d.loss_fn_inputs["weights"].CopyFrom(tpb.Tensor(dtype=tpb.DTYPE_FLOAT32, shape=[6], float32_data=[1.0] * 6))
        res = tr.ForwardBackward(bpb.ForwardBackwardRequest(items=[bpb.ForwardBackwardItem(
            adapter_id="traced", loss_fn="cross_entropy", data=[d])]), metadata=md)
        assert res.results[0].WhichOneof("outcome") == "result"
        import grpc

        with pytest.raises(grpc.RpcError):
            tr.OptimStep(bpb.OptimStepRequest(adapter_id="no-such-adapter", adam=tpb.AdamParams(learning_rate=0.1)), metadata=md)
        tr.GetCapabilities(bpb.GetCapabilitiesRequest())  # untraced: no span
        assert provider.force_flush(10_000)
    finally:
        server.stop(0)
        provider.shutdown()
        tracing._tracer = None  # the other tests' servers run untraced
        httpd.shutdown()

    assert all(s.trace_id.hex() == TRACE for _, s in _Receiver.spans), "a call without a traceparent starts no trace"
    spans = [(svc, s) for svc, s in _Receiver.spans if s.trace_id.hex() == TRACE]
    by_name = {s.name: (svc, s) for svc, s in spans}
    svc, fb = by_name["loops.backend.v1.TrainerService/ForwardBackward"]
    assert svc == tracing.SERVICE_NAME
    assert fb.parent_span_id.hex() == PARENT, "the worker's server span is the gateway call's child"
    assert fb.kind == fb.SPAN_KIND_SERVER
    _, inner = by_name["torch forward_backward"]
    assert inner.parent_span_id == fb.span_id
    assert {a.key: a.value.int_value for a in inner.attributes}["loops.batch.items"] == 1
    _, failed = by_name["loops.backend.v1.TrainerService/OptimStep"]
    assert failed.parent_span_id.hex() == PARENT
    assert failed.status.code == failed.status.STATUS_CODE_ERROR and failed.status.message == "NOT_FOUND"
    for _, s in spans:
        for a in s.attributes:
            assert not a.value.HasField("array_value"), f"{s.name}: {a.key} is a list (token ids?)"
            assert "no-such-adapter" not in str(a.value), "no request content in spans"
        assert not s.events, "no exception events (their text may name files)"
