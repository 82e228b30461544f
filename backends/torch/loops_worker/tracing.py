"""OpenTelemetry traces of the worker, configured by the standard OTEL_* environment
variables as the gateway's are (docs/operations.md, "Traces"): on when an exporter is
configured (OTEL_TRACES_EXPORTER other than none, or an OTLP endpoint), exported over OTLP
http/protobuf or grpc (OTEL_EXPORTER_OTLP_[TRACES_]PROTOCOL, as the gateway), sampled by OTEL_TRACES_SAMPLER,
service.name loops-torch-worker unless OTEL_SERVICE_NAME says otherwise. Off, nothing is
installed and the interceptor is not added.

Every call's server span continues the traceparent the gateway sent in its gRPC metadata,
so the worker's spans are children of the operation's backend call. Spans carry the method,
the batch's size and the status code: never tensors, token ids, prompts or credentials."""

from __future__ import annotations

import logging
import os

import grpc

log = logging.getLogger("loops_worker")

SERVICE_NAME = "loops-torch-worker"

_tracer = None


def configured(env=os.environ) -> bool:
    """Whether the environment asks for traces (the gateway's rule, telemetry.Configured)."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return False
    exp = env.get("OTEL_TRACES_EXPORTER", "").strip()
    if exp == "none":
        return False
    if exp:
        return True
    return bool(env.get("OTEL_EXPORTER_OTLP_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))


def otlp_exporter(env):
    """The OTLP span exporter env asks for (http/protobuf or grpc; endpoint, headers, TLS and
    timeout from the OTEL_EXPORTER_OTLP_* variables), or None, with a warning, for another."""
    exp = env.get("OTEL_TRACES_EXPORTER", "otlp").strip() or "otlp"
    proto = env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL", "http/protobuf")
    if exp != "otlp" or proto not in ("http/protobuf", "grpc"):
        log.warning("traces are off: the worker exports OTLP over http/protobuf or grpc only (OTEL_TRACES_EXPORTER=%s, "
                    "protocol %s)", exp, proto)
        return None
    if proto == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


def setup(exporter=None):
    """Installs the tracer provider the environment configures and returns it (None when
    tracing is off). exporter replaces the OTLP exporter (tests)."""
    global _tracer
    if exporter is None and not configured():
        return None
    from opentelemetry import propagate, trace
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.trace import TracerProvider
    from opentelemetry.sdk.trace.export import BatchSpanProcessor

    if exporter is None:
        exporter = otlp_exporter(os.environ)
        if exporter is None:
            return None
    # Resource.create merges OTEL_RESOURCE_ATTRIBUTES and OTEL_SERVICE_NAME over these.
    attrs = {} if os.environ.get("OTEL_SERVICE_NAME") else {"service.name": SERVICE_NAME}
    provider = TracerProvider(resource=Resource.create(attrs))
    provider.add_span_processor(BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    _ = propagate.get_global_textmap()  # OTEL_PROPAGATORS, default tracecontext,baggage
    _tracer = provider.get_tracer("loops_worker")
    return provider


def tracer():
    """The worker's tracer (None with tracing off)."""
    return _tracer


def span(name: str, **attrs):
    """A span under the current one (a no-op context with tracing off)."""
    import contextlib

    if _tracer is None:
        return contextlib.nullcontext()
    return _tracer.start_as_current_span(name, attributes=attrs, record_exception=False, set_status_on_exception=True)


class Tracing(grpc.ServerInterceptor):
    """A server span per call that carries a traceparent in its metadata, its child; a call
    without one (the gateway's background checks) starts no trace."""

    def intercept_service(self, continuation, details):
        h = continuation(details)
        if h is None or _tracer is None:
            return h
        from opentelemetry import propagate, trace
        from opentelemetry.trace import SpanKind, Status, StatusCode

        carrier = {k: v for k, v in (details.invocation_metadata or ()) if isinstance(v, str)}
        ctx = propagate.extract(carrier)
        if not trace.get_current_span(ctx).get_span_context().is_valid:
            return h  # not part of a trace (the gateway's health and capability checks)
        method = details.method.lstrip("/")
        service, _, name = method.partition("/")
        attrs = {"rpc.system": "grpc", "rpc.service": service, "rpc.method": name}

        def start(context):
            return _tracer.start_as_current_span(method, context=ctx, kind=SpanKind.SERVER, attributes=attrs,
                                                 record_exception=False, set_status_on_exception=False)

        def finish(s, context, err):
            code = context.code() if hasattr(context, "code") else None
            if err is not None or (code is not None and code != grpc.StatusCode.OK):
                # abort() raises: the status is the code, never the message (it may name files)
                c = code.name if code is not None else "UNKNOWN"
                s.set_attribute("rpc.grpc.status_code", (code.value[0] if code is not None else 2))
                s.set_status(Status(StatusCode.ERROR, c))
            else:
                s.set_attribute("rpc.grpc.status_code", 0)

        if h.unary_unary is not None:
            fn = h.unary_unary

            def unary_unary(req, context):
                with start(context) as s:
                    try:
                        out = fn(req, context)
                    except BaseException as e:
                        finish(s, context, e)
                        raise
                    finish(s, context, None)
                    return out

            return grpc.unary_unary_rpc_method_handler(unary_unary, request_deserializer=h.request_deserializer,
                                                       response_serializer=h.response_serializer)
        if h.unary_stream is not None:
            fn = h.unary_stream

            def unary_stream(req, context):
                with start(context) as s:
                    try:
                        yield from fn(req, context)
                    except BaseException as e:
                        finish(s, context, e)
                        raise
                    finish(s, context, None)

            return grpc.unary_stream_rpc_method_handler(unary_stream, request_deserializer=h.request_deserializer,
                                                        response_serializer=h.response_serializer)
        return h
