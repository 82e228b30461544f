package core

import (
	"encoding/json"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestOperationTimelineAndSessionTrace: a finished operation's timeline holds each stage in
// order, its first retrieval is written to its record (read back once it left memory), and
// the session's trace draws its runs' and samplers' operations; another workspace gets
// NotFound, and a trace link serves the same trace until it expires.
func TestOperationTimelineAndSessionTrace(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	sess := h.session()
	created, err := h.createIn(sess, ptr(int64(0)))
	require.NoError(t, err)
	run := h.wait(created).GetTrainingRun().GetId()
	fb, err := h.fb(run, 1, datum(1, 2, 3))
	require.NoError(t, err)
	got := h.wait(fb) // the first retrieval
	tl := got.GetTimeline()
	require.NotNil(t, tl.GetStartTime())
	require.NotNil(t, tl.GetPersistTime())
	require.Equal(t, int32(1), tl.GetBatchItems())
	require.Equal(t, int32(1), tl.GetPieces())
	order := []time.Time{got.GetCreateTime().AsTime(), tl.GetStartTime().AsTime(), tl.GetBackendStartTime().AsTime(),
		tl.GetBackendEndTime().AsTime(), got.GetDoneTime().AsTime(), tl.GetPersistTime().AsTime()}
	for i := 1; i < len(order); i++ {
		require.False(t, order[i].Before(order[i-1]), "stage %d before stage %d: %v", i, i-1, order)
	}
	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{SessionId: sess, BaseModel: "fake/model"})
	require.NoError(t, err)
	sample, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1, 2}, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1, TopP: 1}})
	require.NoError(t, err)
	h.wait(sample)

	// Out of memory: the timeline, retrieval included, comes from the store.
	require.NoError(t, h.core.ops.flush(h.ctx))
	h.core.ops.evictFinishedBefore(time.Now().Add(time.Hour))
	stored, err := h.core.store.GetOperation(h.ctx, "ws-a", fb.GetId())
	require.NoError(t, err)
	require.NotNil(t, stored.GetTimeline().GetRetrieveTime(), "the first retrieval is on the record")
	require.NotNil(t, stored.GetTimeline().GetBackendStartTime())

	tr, err := h.svc.Traces.ExportSessionTrace(h.ctx, &loopsv1.ExportSessionTraceRequest{SessionId: sess})
	require.NoError(t, err)
	require.Equal(t, int32(3), tr.GetOperations(), "create, forward_backward, sample")
	require.False(t, tr.GetTruncated())
	var doc struct {
		TraceEvents []struct {
			Name string         `json:"name"`
			Ph   string         `json:"ph"`
			Args map[string]any `json:"args"`
		} `json:"traceEvents"`
	}
	require.NoError(t, json.Unmarshal(tr.GetTraceJson(), &doc))
	ids := map[string]bool{}
	procs := 0
	for _, e := range doc.TraceEvents {
		if e.Ph == "X" && e.Name == "queued" {
			ids[e.Args["id"].(string)] = true
		}
		if e.Ph == "M" && e.Name == "process_name" {
			procs++
		}
	}
	require.Equal(t, map[string]bool{created.GetId(): true, fb.GetId(): true, sample.GetId(): true}, ids)
	require.Equal(t, 2, procs, "the run and the sampler")

	other := auth.WithWorkspace(t.Context(), "ws-b")
	_, err = h.svc.Traces.ExportSessionTrace(other, &loopsv1.ExportSessionTraceRequest{SessionId: sess})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Traces.GetSessionTraceURL(other, &loopsv1.GetSessionTraceURLRequest{SessionId: sess})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Traces.ExportSessionTrace(h.ctx, &loopsv1.ExportSessionTraceRequest{})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	link, err := h.svc.Traces.GetSessionTraceURL(h.ctx, &loopsv1.GetSessionTraceURLRequest{SessionId: sess})
	require.NoError(t, err)
	require.Contains(t, link.GetUrl(), TracePathPrefix)
	tok := link.GetUrl()[len(TracePathPrefix):]
	name, b, err := h.core.TraceDownload(t.Context(), tok)
	require.NoError(t, err)
	require.Equal(t, sess, name)
	require.Contains(t, string(b), fb.GetId())
	_, _, err = h.core.TraceDownload(t.Context(), "nope.json")
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	h.core.traceLinks.sweep(time.Now().Add(2 * TraceURLTTL))
	_, _, err = h.core.TraceDownload(t.Context(), tok)
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "expired")
}

func TestTraceLinksAreBounded(t *testing.T) {
	l := newTraceLinks()
	now := time.Now()
	for range MaxTraceLinksPerWorkspace {
		_, err := l.issue("ws-a", "s", now.Add(time.Hour), now)
		require.NoError(t, err)
	}
	_, err := l.issue("ws-a", "s", now.Add(time.Hour), now)
	require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
	_, err = l.issue("ws-b", "s", now.Add(time.Hour), now)
	require.NoError(t, err, "another workspace is not held back")
	_, err = l.issue("ws-a", "s", now.Add(time.Hour), now.Add(2*time.Hour))
	require.NoError(t, err, "expired links make room")
}
