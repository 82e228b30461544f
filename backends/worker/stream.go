package worker

import (
	"context"
	"errors"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

var _ backends.TokenStreamer = (*sampler)(nil)

// SampleStream is Sample with every token passed to sink as the worker samples it, through
// the worker's StreamSample. Once sink is gone the stream is cancelled (the worker stops
// the sample) and the call fails with Canceled. A worker without StreamSample (one built
// before it) answers Unimplemented: the sample then runs as a plain Sample and sink gets
// nothing, as the inference APIs expect of a backend that cannot stream.
func (s *sampler) SampleStream(ctx context.Context, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error) {
	b := (*Backend)(s)
	if err := b.usePool(ctx, req.GetPool(), true); err != nil {
		return nil, err
	}
	w, done, err := b.pickSampler(req.GetPool(), req.GetBaseModel(), adapterKey(req))
	if err != nil {
		return nil, err
	}
	defer done()
	resp, err := call(ctx, w, "StreamSample", func(c *clients) func(context.Context, *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
		return func(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
			return receiveSample(ctx, c.sc, req, sink)
		}
	}, req)
	if connect.CodeOf(err) == connect.CodeUnimplemented && ctx.Err() == nil {
		return s.Sample(ctx, req)
	}
	return resp, err
}

// receiveSample runs one StreamSample call, passing its tokens to sink, and returns its
// closing response.
func receiveSample(ctx context.Context, sc samplerStreamer, req *backendv1.SampleRequest, sink tokenstream.Sink) (*backendv1.SampleResponse, error) {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() { // ends when the call returns (cancel) at the latest
		select {
		case <-sink.Gone():
			cancel(errSinkGone)
		case <-ctx.Done():
		}
	}()
	st, err := sc.StreamSample(ctx, &backendv1.StreamSampleRequest{Request: req})
	if err != nil {
		return nil, sinkErr(ctx, err)
	}
	defer func() { _ = st.Close() }()
	for st.Receive() {
		switch it := st.Msg().GetItem().(type) {
		case *backendv1.StreamSampleResponse_Token:
			t := it.Token
			var top []tokenstream.Alt
			if n := min(len(t.GetTopTokens()), len(t.GetTopLogprobs())); n > 0 {
				top = make([]tokenstream.Alt, n)
				for i := range top {
					top[i] = tokenstream.Alt{ID: t.GetTopTokens()[i], Logprob: t.GetTopLogprobs()[i]}
				}
			}
			sink.Token(int(t.GetSequence()), t.GetToken(), t.GetLogprob(), top)
		case *backendv1.StreamSampleResponse_Response:
			return it.Response, nil
		}
	}
	if err := st.Err(); err != nil {
		return nil, sinkErr(ctx, err)
	}
	return nil, connect.NewError(connect.CodeUnavailable, errors.New("the worker's sample stream ended without its result"))
}

// samplerStreamer is the part of the SamplerService client receiveSample uses.
type samplerStreamer interface {
	StreamSample(context.Context, *backendv1.StreamSampleRequest) (*connect.ServerStreamForClient[backendv1.StreamSampleResponse], error)
}

var errSinkGone = errors.New("the reader of the sampled tokens has gone")

// sinkErr is Canceled when the call failed because the sink went away, err otherwise.
func sinkErr(ctx context.Context, err error) error {
	if errors.Is(context.Cause(ctx), errSinkGone) {
		return connect.NewError(connect.CodeCanceled, errSinkGone)
	}
	return err
}
