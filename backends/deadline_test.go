package backends

import (
	"context"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func TestDeadlineGrowsWithSize(t *testing.T) {
	d := Deadlines{Base: time.Second, PerToken: 10 * time.Millisecond}
	require.Equal(t, time.Second, d.For(0))
	require.Equal(t, 2*time.Second, d.For(100))
	require.Equal(t, DefaultDeadlineBase+3*DefaultDeadlinePerToken, Deadlines{}.For(3))
	require.Equal(t, 2+2*5, sampleTokens(&backendv1.SampleRequest{Prompt: []int32{1, 2}, NumSamples: 2, Params: &loopsv1.SamplingParams{MaxTokens: 5}}))
	require.Equal(t, 5, forwardBackwardTokens(&backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
		{Data: []*loopsv1.Datum{{Tokens: []int32{1, 2}}, {Tokens: []int32{3}}}}, {Data: []*loopsv1.Datum{{Tokens: []int32{4, 5}}}},
	}}))
}

func TestBoundedReturnsAtTheDeadlineAndDropsTheLateResult(t *testing.T) {
	release := make(chan struct{})
	hang := func(context.Context, *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
		<-release // ignores its context, like a wedged engine
		return &backendv1.OptimStepResponse{}, nil
	}
	start := time.Now()
	_, err := bounded(t.Context(), Deadlines{Base: 20 * time.Millisecond, PerToken: time.Millisecond}, "OptimStep", 0, hang, &backendv1.OptimStepRequest{})
	require.Equal(t, connect.CodeDeadlineExceeded, connect.CodeOf(err))
	require.ErrorContains(t, err, "did not finish OptimStep within 20ms")
	require.Less(t, time.Since(start), 2*time.Second)
	close(release) // the abandoned call finishes; its result goes to a buffered channel

	quick := func(context.Context, *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
		return &backendv1.OptimStepResponse{}, nil
	}
	for range 1000 { // a call that finished is never reported as cancelled
		resp, err := bounded(t.Context(), Deadlines{Base: time.Second}, "OptimStep", 0, quick, &backendv1.OptimStepRequest{})
		require.NoError(t, err)
		require.NotNil(t, resp)
	}
}
