package core

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/core/lane"
	"github.com/loops-dev/loops/gateway/core/trainrun"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/telemetry"
)

// TestBatchSpansLinkTheBatch: each operation of a forward/backward batch gets a batch span
// in its own trace, under its operation's span, linked to the other operations' spans; the
// backend call goes under the first one's. An untraced batch starts nothing.
func TestBatchSpansLinkTheBatch(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(telemetry.Install(tp, nil))
	tr := tp.Tracer("test")
	var batch []lane.Item[*operation]
	for _, id := range []string{"op-a", "op-b", "op-c"} {
		o := &operation{id: id, op: &loopsv1.Operation{Id: id, CreateTime: timestamppb.Now()}}
		_, o.span = tr.Start(context.Background(), "operation forward_backward") // a trace each
		batch = append(batch, lane.Item[*operation]{Task: &trainrun.Task[*operation]{Op: o}})
	}
	ctx, end := startBatchSpans(context.Background(), batch)
	end(nil)
	spans := rec.Ended()
	require.Len(t, spans, 3)
	for i, s := range spans {
		own := batch[i].Task.Op.span.SpanContext()
		require.Equal(t, "batch", s.Name())
		require.Equal(t, own.SpanID(), s.Parent().SpanID(), "under its operation's span")
		require.Equal(t, own.TraceID(), s.SpanContext().TraceID())
		var linked []string
		for _, l := range s.Links() {
			for j, other := range batch {
				if l.SpanContext.Equal(other.Task.Op.span.SpanContext()) {
					require.NotEqual(t, i, j)
					linked = append(linked, other.Task.Op.id)
				}
			}
		}
		require.Len(t, linked, 2, "linked to the batch's other operations")
	}
	require.Equal(t, spans[0].SpanContext().SpanID(), spanIDOf(ctx), "the backend call is under the first's batch span")

	untraced := []lane.Item[*operation]{{Task: &trainrun.Task[*operation]{Op: &operation{id: "x", op: &loopsv1.Operation{}}}}}
	ctx2, end2 := startBatchSpans(context.Background(), untraced)
	end2(nil)
	require.Equal(t, context.Background(), ctx2)
	require.Len(t, rec.Ended(), 3)
}

func spanIDOf(ctx context.Context) trace.SpanID { return trace.SpanContextFromContext(ctx).SpanID() }

// TestGenAIRequestOfAnEmbedding: an embedding's span is a GenAI "embeddings" operation with
// its input tokens, and no sampling attributes.
func TestGenAIRequestOfAnEmbedding(t *testing.T) {
	got := map[string]any{}
	for _, kv := range genAIRequest(&backendv1.SampleRequest{BaseModel: "m", Prompt: []int32{1, 2, 3}, Embed: true}) {
		got[string(kv.Key)] = kv.Value.AsInterface()
	}
	require.Equal(t, map[string]any{"gen_ai.operation.name": "embeddings", "gen_ai.provider.name": "loops",
		"gen_ai.request.model": "m", "gen_ai.usage.input_tokens": int64(3)}, got)
}
