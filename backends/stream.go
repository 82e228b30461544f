package backends

import (
	"context"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// TokenStreamer is the optional ability of a Sampler to report tokens while it decodes
// them: SampleStream is Sample, with every sampled token also passed to sink.Token as soon
// as it is sampled (from the decoder's goroutine: Token must not block), and the sample
// dropped, with a Canceled error, once sink.Gone is closed. Its response is the bits Sample
// would return. The reference engine has it, and the gRPC worker through its StreamSample
// (the torch worker's transformers sampler streams; its vLLM sampler answers whole, and
// the inference APIs then send the text in one chunk).
type TokenStreamer interface {
	SampleStream(ctx context.Context, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error)
}

// SampleStream streams through the guarded sampler when it can, and samples plainly when
// it cannot (the sink then gets no tokens).
func (g guardedSampler) SampleStream(ctx context.Context, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error) {
	ts, ok := g.s.(TokenStreamer)
	if !ok {
		return g.Sample(ctx, req)
	}
	return call(ctx, g.log, "Sampler.SampleStream", func(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
		return ts.SampleStream(ctx, req, sink)
	}, req)
}

// SampleStream streams through the sampler under Sample's deadline when it can, and samples
// plainly when it cannot.
func (g deadlinedSampler) SampleStream(ctx context.Context, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error) {
	ts, ok := g.s.(TokenStreamer)
	if !ok {
		return g.Sample(ctx, req)
	}
	return bounded(ctx, g.d, "Sample", sampleTokens(req), func(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
		return ts.SampleStream(ctx, req, sink)
	}, req)
}
