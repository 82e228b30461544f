package telemetry

import (
	"context"
	"errors"
	"fmt"
	"os"
	"strings"
	"sync/atomic"

	"go.opentelemetry.io/contrib/exporters/autoexport"
	"go.opentelemetry.io/contrib/propagators/autoprop"
	"go.opentelemetry.io/otel"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/sdk/resource"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"
)

// ScopeName is the instrumentation scope of the spans Loops starts itself.
const ScopeName = "github.com/loops-dev/loops"

// DefaultServiceName is service.name unless OTEL_SERVICE_NAME or OTEL_RESOURCE_ATTRIBUTES
// say otherwise.
const DefaultServiceName = "loops"

// enabled is set by Setup when it installed a recording provider.
var enabled atomic.Bool

// Enabled reports whether Setup installed a tracer provider that exports spans.
func Enabled() bool { return enabled.Load() }

// Tracer is Loops' tracer, from the provider Setup (or Install) installed; OpenTelemetry's
// global one (a no-op unless someone set it) before that.
func Tracer() trace.Tracer {
	if t := tracer.Load(); t != nil {
		return *t
	}
	return otel.Tracer(ScopeName)
}

// tracer is the installed provider's tracer (nil: none installed).
var tracer atomic.Pointer[trace.Tracer]

// Install makes tp the provider of Loops' spans and OpenTelemetry's global one, and p (nil:
// W3C tracecontext and baggage) the global propagator, and turns tracing on (Enabled) for
// what is made from now on: for a program that embeds the gateway with a provider of its
// own, and for tests. Setup calls it. The returned function turns tracing off again (it
// does not shut tp down).
func Install(tp trace.TracerProvider, p propagation.TextMapPropagator) (off func()) {
	if p == nil {
		p = propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
	}
	otel.SetTracerProvider(tp)
	otel.SetTextMapPropagator(p)
	t := tp.Tracer(ScopeName)
	tracer.Store(&t)
	enabled.Store(true)
	return func() {
		enabled.Store(false)
		tracer.Store(nil)
	}
}

// Configured reports whether the environment asks for traces: OTEL_SDK_DISABLED is not
// true, and OTEL_TRACES_EXPORTER names an exporter other than none, or it is unset and an
// OTLP endpoint (OTEL_EXPORTER_OTLP_ENDPOINT or OTEL_EXPORTER_OTLP_TRACES_ENDPOINT) is.
func Configured() bool {
	if strings.EqualFold(os.Getenv("OTEL_SDK_DISABLED"), "true") {
		return false
	}
	switch exp := strings.TrimSpace(os.Getenv("OTEL_TRACES_EXPORTER")); exp {
	case "none":
		return false
	case "":
		return os.Getenv("OTEL_EXPORTER_OTLP_ENDPOINT") != "" || os.Getenv("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") != ""
	default:
		return true
	}
}

// Setup installs the global tracer provider and propagator the environment configures
// (Configured): the exporter (OTEL_TRACES_EXPORTER: otlp, the default, over
// OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf or grpc, to OTEL_EXPORTER_OTLP_ENDPOINT with
// OTEL_EXPORTER_OTLP_HEADERS; console), the sampler (OTEL_TRACES_SAMPLER and _ARG, default
// parentbased_always_on), the batch processor (OTEL_BSP_*), the resource (OTEL_SERVICE_NAME,
// default service (DefaultServiceName), OTEL_RESOURCE_ATTRIBUTES) and the propagators
// (OTEL_PROPAGATORS, default tracecontext,baggage). Unconfigured, it installs nothing and
// returns a shutdown that does nothing. shutdown flushes the spans still buffered.
func Setup(ctx context.Context, service string) (shutdown func(context.Context) error, err error) {
	nothing := func(context.Context) error { return nil }
	if !Configured() {
		return nothing, nil
	}
	exp, err := autoexport.NewSpanExporter(ctx)
	if err != nil {
		return nothing, fmt.Errorf("telemetry: the OTEL_* trace exporter settings: %w", err)
	}
	if autoexport.IsNoneSpanExporter(exp) {
		return nothing, nil
	}
	if service == "" {
		service = DefaultServiceName
	}
	// The environment's resource (OTEL_SERVICE_NAME, OTEL_RESOURCE_ATTRIBUTES) wins over the
	// default name: it is merged last.
	res, err := resource.New(ctx,
		resource.WithAttributes(semconv.ServiceName(service)),
		resource.WithTelemetrySDK(), resource.WithHost(), resource.WithProcessPID(),
		resource.WithFromEnv())
	if err != nil && !errors.Is(err, resource.ErrPartialResource) {
		_ = exp.Shutdown(ctx)
		return nothing, fmt.Errorf("telemetry: OTEL_RESOURCE_ATTRIBUTES: %w", err)
	}
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(exp), sdktrace.WithResource(res))
	off := Install(tp, autoprop.NewTextMapPropagator())
	return func(ctx context.Context) error {
		off()
		return tp.Shutdown(ctx)
	}, nil
}
