package core

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// ctxSampler is the fake backend with a Sample that runs until its context ends, and a
// SampleStream (TokenStreamer) that counts its calls.
type ctxSampler struct {
	*fakeBackend
	started  chan struct{}
	streamed atomic.Int32
}

func (h *ctxSampler) Sampler() backends.Sampler { return h }

func (h *ctxSampler) Sample(ctx context.Context, _ *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	h.started <- struct{}{}
	<-ctx.Done()
	return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
}

func (h *ctxSampler) SampleStream(ctx context.Context, req *backendv1.SampleRequest, _ tokenstream.Sink) (*backendv1.SampleResponse, error) {
	h.streamed.Add(1)
	return h.Sample(ctx, req)
}

// TestWatchedSampleStopsWhenItsClientLeaves: a sample whose sink is a tokenstream.Watch (an
// inference answer that is not streamed) runs on the backend's plain Sample, and the
// backend's context ends when the watch is closed (its client left): the operation fails
// with Canceled rather than decoding to its end for nobody.
func TestWatchedSampleStopsWhenItsClientLeaves(t *testing.T) {
	be := &ctxSampler{fakeBackend: newFakeBackend(), started: make(chan struct{}, 1)}
	h, _ := openHarness(t, t.TempDir(), be, be.fakeBackend)
	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
	require.NoError(t, err)
	w := tokenstream.NewWatch()
	op, err := h.svc.Sampling.SampleStream(h.ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1, 2}, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 1, TopP: 1}}, w)
	require.NoError(t, err)
	select {
	case <-be.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the sample did not start")
	}
	w.Close()
	got := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Equal(t, int32(connect.CodeCanceled), got.GetError().GetCode())
	require.Zero(t, be.streamed.Load(), "tokens nobody reads are not streamed")
}

// TestStreamedSampleStopsAContextOnlyBackend: a streamed sample whose backend watches only
// its context (a worker falling back from StreamSample to Sample does) is stopped too when
// its reader goes away: the backend's context ends with the sink.
func TestStreamedSampleStopsAContextOnlyBackend(t *testing.T) {
	be := &ctxSampler{fakeBackend: newFakeBackend(), started: make(chan struct{}, 1)}
	h, _ := openHarness(t, t.TempDir(), be, be.fakeBackend)
	smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{BaseModel: "fake/model"})
	require.NoError(t, err)
	buf := tokenstream.NewBuffer(8)
	op, err := h.svc.Sampling.SampleStream(h.ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1, 2}, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 1, TopP: 1}}, buf)
	require.NoError(t, err)
	select {
	case <-be.started:
	case <-time.After(30 * time.Second):
		t.Fatal("the sample did not start")
	}
	buf.Close()
	got := h.wait(op)
	require.Equal(t, int32(connect.CodeCanceled), got.GetError().GetCode())
	require.Equal(t, int32(1), be.streamed.Load())
}
