package core

import (
	"context"
	"sync"
	"sync/atomic"
	"time"

	"connectrpc.com/connect"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	semconv "go.opentelemetry.io/otel/semconv/v1.40.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/loops-dev/loops/gateway/core/lane"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/telemetry"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// An operation's OpenTelemetry spans (docs/operations.md, "Traces"): one trace per
// operation, under the span of the request that created it. Its stages are those of the
// session trace (docs/traces.md), read from the same clocks:
//
//	operation <kind>      create → published (the outcome durable and answerable)
//	  queue               create → its work started
//	  batch               a forward/backward batch it was an item of, linked to the others
//	    <backend call>    the loops.backend.v1 client span (a worker's spans under it)
//	  backend <kind>      unbatched work (optim_step, save_weights, sample, …)
//	    checkpoint write  the checkpoint's files into the checkpoint store
//	  persist             outcome decided → committed to the store and published
//
// A request that reads the outcome (retrieve_future, GetOperation, WaitOperation) links
// its span to the operation's. With tracing off when the core was made (telemetry.Enabled)
// none of this starts.

// Span attribute keys of Loops' own spans.
const (
	attrOpID      = attribute.Key("loops.operation.id")
	attrOpKind    = attribute.Key("loops.operation.kind")
	attrOpState   = attribute.Key("loops.operation.state")
	attrRunID     = attribute.Key("loops.training_run.id")
	attrSamplerID = attribute.Key("loops.sampler.id")
	attrSeqID     = attribute.Key("loops.seq_id")
	attrWorkspace = attribute.Key("loops.workspace")
	attrItems     = attribute.Key("loops.batch.items")
	attrErrorCode = attribute.Key("loops.error.code")
	// attrTTFT is the time to the first sampled token, in seconds (the GenAI metric
	// gen_ai.server.time_to_first_token's value for this request).
	attrTTFT = attribute.Key("gen_ai.server.time_to_first_token")
)

// startOpSpan starts o's span under ctx's (the creating request's); nothing unless tracing
// was on when c was made.
func (c *Core) startOpSpan(ctx context.Context, o *operation) {
	if !c.traced {
		return
	}
	op := o.op
	kind := kindLabel(op.GetKind())
	attrs := []attribute.KeyValue{attrOpID.String(op.GetId()), attrOpKind.String(kind), attrWorkspace.String(o.workspace)}
	if op.GetTrainingRunId() != "" {
		attrs = append(attrs, attrRunID.String(op.GetTrainingRunId()))
	}
	if op.GetSamplerId() != "" {
		attrs = append(attrs, attrSamplerID.String(op.GetSamplerId()))
	}
	if op.GetSeqId() > 0 {
		attrs = append(attrs, attrSeqID.Int64(op.GetSeqId()))
	}
	_, o.span = telemetry.Tracer().Start(ctx, "operation "+kind,
		trace.WithTimestamp(op.GetCreateTime().AsTime()), trace.WithAttributes(attrs...))
}

// spanCtx is ctx with o's span as its current one (ctx itself when o has none).
func (o *operation) spanCtx(ctx context.Context) context.Context {
	if o.span == nil {
		return ctx
	}
	return trace.ContextWithSpan(ctx, o.span)
}

// traceQueued records o's queue span, from its creation to its work starting.
func (o *operation) traceQueued(created, started time.Time) {
	if o.span == nil {
		return
	}
	_, s := telemetry.Tracer().Start(o.spanCtx(context.Background()), "queue", trace.WithTimestamp(created))
	s.End(trace.WithTimestamp(started))
}

// startBackendSpan starts the span of o's unbatched backend work (optim_step, save,
// load, sample, …) and returns ctx with it; end it with endSpan.
func startBackendSpan(ctx context.Context, o *operation, attrs ...attribute.KeyValue) (context.Context, trace.Span) {
	if o.span == nil {
		return ctx, nil
	}
	return telemetry.Tracer().Start(o.spanCtx(ctx), "backend "+kindLabel(o.op.GetKind()), trace.WithAttributes(attrs...))
}

// startBatchSpans starts, in the trace of each operation of batch, a batch span linked
// to the others' operations, and returns ctx with the first item's batch span (the
// backend call, and a worker's spans, are its children) and a function that ends them
// all with err's status.
func startBatchSpans(ctx context.Context, batch []lane.Item[*operation]) (context.Context, func(error)) {
	if len(batch) == 0 || batch[0].Task.Op.span == nil { // untraced (a core's operations all are, or none)
		return ctx, func(error) {}
	}
	spans := make([]trace.Span, 0, len(batch))
	var first context.Context
	for i, it := range batch {
		o := it.Task.Op
		if o.span == nil {
			continue
		}
		var links []trace.Link
		for j, other := range batch {
			if j != i && other.Task.Op.span != nil {
				links = append(links, trace.Link{SpanContext: other.Task.Op.span.SpanContext(),
					Attributes: []attribute.KeyValue{attrOpID.String(other.Task.Op.id)}})
			}
		}
		sctx, s := telemetry.Tracer().Start(o.spanCtx(ctx), "batch", trace.WithLinks(links...),
			trace.WithAttributes(attrItems.Int(len(batch))))
		if first == nil {
			first = sctx
		}
		spans = append(spans, s)
	}
	if first == nil {
		first = ctx
	}
	return first, func(err error) {
		for _, s := range spans {
			endSpan(s, err)
		}
	}
}

// endSpan ends s (nil: none) with err's outcome: the error's code (never its text, which
// may name the server's files; the operation's span gets the error id).
func endSpan(s trace.Span, err error) {
	if s == nil {
		return
	}
	if err != nil {
		s.SetAttributes(attrErrorCode.String(connect.CodeOf(err).String()))
		s.SetStatus(codes.Error, connect.CodeOf(err).String())
	}
	s.End()
}

// traceFinished records o's persist span (done → published) and ends o's span, with its
// outcome (a failed operation's error code and id).
func (o *operation) traceFinished(op *loopsv1.Operation, errID string, published time.Time) {
	if o.span == nil {
		return
	}
	done := op.GetDoneTime().AsTime()
	_, s := telemetry.Tracer().Start(o.spanCtx(context.Background()), "persist", trace.WithTimestamp(done))
	s.End(trace.WithTimestamp(published))
	o.span.SetAttributes(attrOpState.String(stateLabel(op.GetState())))
	if e := op.GetError(); e != nil {
		code := connect.Code(e.GetCode()).String()
		o.span.SetAttributes(attrErrorCode.String(code))
		if errID != "" {
			o.span.SetAttributes(telemetry.ErrorIDKey.String(errID))
		}
		if op.GetState() == loopsv1.OperationState_OPERATION_STATE_FAILED {
			o.span.SetStatus(codes.Error, code)
		}
	}
	o.span.End(trace.WithTimestamp(published))
}

// linkRetrieval links ctx's span (a request reading o's outcome) to o's.
func linkRetrieval(ctx context.Context, o *operation) {
	if o.span == nil {
		return
	}
	trace.SpanFromContext(ctx).AddLink(trace.Link{SpanContext: o.span.SpanContext(),
		Attributes: []attribute.KeyValue{attrOpID.String(o.id)}})
}

// genAIRequest are the GenAI semantic-convention attributes of a sampling request: the
// model and the sampling parameters (never the prompt or its tokens).
func genAIRequest(req *backendv1.SampleRequest) []attribute.KeyValue {
	if req.GetEmbed() {
		return []attribute.KeyValue{semconv.GenAIOperationNameEmbeddings, semconv.GenAIProviderNameKey.String("loops"),
			semconv.GenAIRequestModel(req.GetBaseModel()), semconv.GenAIUsageInputTokens(len(req.GetPrompt()))}
	}
	p := req.GetParams()
	attrs := []attribute.KeyValue{
		semconv.GenAIOperationNameTextCompletion, semconv.GenAIProviderNameKey.String("loops"),
		semconv.GenAIRequestModel(req.GetBaseModel()),
		semconv.GenAIRequestMaxTokens(int(p.GetMaxTokens())),
		semconv.GenAIRequestChoiceCount(int(max(req.GetNumSamples(), 1))),
		semconv.GenAIUsageInputTokens(len(req.GetPrompt())),
	}
	if p != nil {
		attrs = append(attrs, semconv.GenAIRequestTemperature(float64(p.GetTemperature())),
			semconv.GenAIRequestTopP(float64(p.GetTopP())), semconv.GenAIRequestTopK(float64(p.GetTopK())))
		if p.Seed != nil {
			attrs = append(attrs, semconv.GenAIRequestSeed(int(p.GetSeed())))
		}
	}
	return attrs
}

// genAIResponse are the GenAI attributes of a sample's answer: output tokens, finish
// reasons, and the time to its first token when it was streamed.
func genAIResponse(resp *backendv1.SampleResponse, ttft time.Duration) []attribute.KeyValue {
	out := 0
	var reasons []string
	for _, seq := range resp.GetResult().GetSequences() {
		out += len(seq.GetTokens())
		reasons = append(reasons, stopReasonLabel(seq.GetStopReason()))
	}
	attrs := []attribute.KeyValue{semconv.GenAIUsageOutputTokens(out), semconv.GenAIResponseFinishReasons(reasons...)}
	if ttft > 0 {
		attrs = append(attrs, attrTTFT.Float64(ttft.Seconds()))
	}
	return attrs
}

// stopReasonLabel is a stop reason as GenAI's finish reasons name them ("stop", "length").
func stopReasonLabel(r loopsv1.StopReason) string {
	switch r {
	case loopsv1.StopReason_STOP_REASON_STOP:
		return "stop"
	case loopsv1.StopReason_STOP_REASON_LENGTH:
		return "length"
	}
	return "unspecified"
}

// firstTokenSink passes tokens on to Sink and, at the first one, notes when it came (for the
// span's time to first token) and calls first (the metrics'), when set.
type firstTokenSink struct {
	tokenstream.Sink
	once  sync.Once
	at    time.Time
	first func()
	// sent counts the tokens passed on: what a stream that ends early has sent, and is
	// metered for.
	sent atomic.Int64
	// started is set once the backend has the request (its prompt is being computed).
	started atomic.Bool
}

// Token implements tokenstream.Sink.
func (f *firstTokenSink) Token(seq int, id int32, logprob float32, top []tokenstream.Alt) {
	f.once.Do(func() {
		f.at = time.Now()
		if f.first != nil {
			f.first()
		}
	})
	f.Sink.Token(seq, id, logprob, top)
	f.sent.Add(1)
}

// after is the time from start (the request's arrival) to the first token (0: none came, or f is nil). Call it
// once the stream has ended.
func (f *firstTokenSink) after(start time.Time) time.Duration {
	if f == nil || f.at.IsZero() {
		return 0
	}
	return f.at.Sub(start)
}

// startCheckpointSpan starts the span of a checkpoint write (key: its store key, which
// names the run and the checkpoint, never a URL) under ctx's, when ctx is in a trace.
func startCheckpointSpan(ctx context.Context, key string, optimizer bool) (context.Context, trace.Span) {
	if !trace.SpanFromContext(ctx).IsRecording() {
		return ctx, nil
	}
	return telemetry.Tracer().Start(ctx, "checkpoint write", trace.WithAttributes(
		attribute.String("loops.checkpoint.key", key), attribute.Bool("loops.checkpoint.optimizer", optimizer)))
}
