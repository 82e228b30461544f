package telemetry

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/trace"
)

// ErrorIDKey is the span attribute of a failed request's error id: the id its answer
// ("internal error, id …") and its log line carry.
const ErrorIDKey = attribute.Key("loops.error_id")

// NoteError marks ctx's span failed with the error id its client was answered (never the
// error's text, which may name the server's files): an operator finds the span from the id
// in a user's report or in the log line.
func NoteError(ctx context.Context, id string) {
	span := trace.SpanFromContext(ctx)
	if !span.IsRecording() {
		return
	}
	span.SetAttributes(ErrorIDKey.String(id))
	span.SetStatus(codes.Error, "internal error, id "+id)
}

// Exemplar is the exemplar of an observation made under ctx: its sampled trace's id, or nil.
func Exemplar(ctx context.Context) prometheus.Labels {
	sc := trace.SpanContextFromContext(ctx)
	if !sc.IsSampled() {
		return nil
	}
	return prometheus.Labels{"trace_id": sc.TraceID().String()}
}

// Observe observes v on o, with ctx's trace id as its exemplar when ctx is in a sampled
// trace and o takes exemplars (a histogram).
func Observe(ctx context.Context, o prometheus.Observer, v float64) {
	if ex := Exemplar(ctx); ex != nil {
		if eo, ok := o.(prometheus.ExemplarObserver); ok {
			eo.ObserveWithExemplar(v, ex)
			return
		}
	}
	o.Observe(v)
}
