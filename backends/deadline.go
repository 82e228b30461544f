package backends

import (
	"context"
	"fmt"
	"time"

	"connectrpc.com/connect"

	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

// Deadlines bound every backend call by its size: a call may take Base plus PerToken for
// each token it processes (forward/backward: the tokens of every item; sample: the prompt
// plus max_tokens for each sample; other calls: none). The zero value of a field means its
// default.
type Deadlines struct {
	// Base is what every call is allowed (default 2 min: a save or load of a large adapter
	// on a busy disk).
	Base time.Duration
	// PerToken is added per token processed (default 100 ms: about 4× the CPU engine's
	// time per token on a 0.6B model with 2 threads, so only a hung call reaches it).
	PerToken time.Duration
}

// Default deadline parameters (see Deadlines).
const (
	DefaultDeadlineBase     = 2 * time.Minute
	DefaultDeadlinePerToken = 100 * time.Millisecond
)

func (d Deadlines) withDefaults() Deadlines {
	if d.Base <= 0 {
		d.Base = DefaultDeadlineBase
	}
	if d.PerToken <= 0 {
		d.PerToken = DefaultDeadlinePerToken
	}
	return d
}

// For returns the deadline of a call that processes tokens tokens.
func (d Deadlines) For(tokens int) time.Duration {
	d = d.withDefaults()
	return d.Base + time.Duration(tokens)*d.PerToken
}

// WithDeadlines returns b with every Trainer and Sampler call bounded by d. A call past its
// deadline returns CodeDeadlineExceeded at once, whether or not the backend honours its
// context (the in-process engine checks it only between steps; a remote worker's call is
// cancelled). The call keeps running on its own goroutine until the backend returns, and
// its late result is dropped: the caller must treat the adapter's state as unknown.
func WithDeadlines(b Backend, d Deadlines) Backend {
	d = d.withDefaults()
	return &deadlined{Backend: b, t: deadlinedTrainer{b.Trainer(), d}, s: deadlinedSampler{b.Sampler(), d}}
}

type deadlined struct {
	Backend
	t deadlinedTrainer
	s deadlinedSampler
}

func (b *deadlined) Trainer() Trainer { return b.t }
func (b *deadlined) Sampler() Sampler { return b.s }

// bounded runs f under a deadline of d.For(tokens) and returns when f does or when the
// deadline passes, whichever is first.
func bounded[Req, Resp any](ctx context.Context, d Deadlines, method string, tokens int, f func(context.Context, *Req) (*Resp, error), req *Req) (*Resp, error) {
	limit := d.For(tokens)
	ctx, cancel := context.WithTimeout(ctx, limit)
	defer cancel()
	type result struct {
		resp *Resp
		err  error
	}
	done := make(chan result, 1) // buffered: a late result never blocks the abandoned call
	go func() {
		resp, err := f(ctx, req)
		done <- result{resp, err}
	}()
	select {
	case r := <-done:
		return r.resp, r.err
	case <-ctx.Done():
		if ctx.Err() == context.DeadlineExceeded {
			return nil, connect.NewError(connect.CodeDeadlineExceeded, fmt.Errorf(
				"the backend did not finish %s within %s (the deadline for %d tokens: %s + %s per token)", method, limit, tokens, d.Base, d.PerToken))
		}
		return nil, connect.NewError(connect.CodeCanceled, ctx.Err())
	}
}

// forwardBackwardTokens is the size of a forward/backward call: the tokens of every datum.
func forwardBackwardTokens(req *backendv1.ForwardBackwardRequest) int {
	n := 0
	for _, it := range req.GetItems() {
		for _, d := range it.GetData() {
			n += len(d.GetTokens())
		}
	}
	return n
}

// sampleTokens is the size of a sample call: the prompt, plus max_tokens for each sample.
func sampleTokens(req *backendv1.SampleRequest) int {
	return len(req.GetPrompt()) + int(max(req.GetNumSamples(), 1))*int(max(req.GetParams().GetMaxTokens(), 0))
}

type deadlinedTrainer struct {
	t Trainer
	d Deadlines
}

func (g deadlinedTrainer) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return bounded(ctx, g.d, "GetCapabilities", 0, g.t.GetCapabilities, req)
}

func (g deadlinedTrainer) CreateAdapter(ctx context.Context, req *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error) {
	return bounded(ctx, g.d, "CreateAdapter", 0, g.t.CreateAdapter, req)
}

func (g deadlinedTrainer) DeleteAdapter(ctx context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	return bounded(ctx, g.d, "DeleteAdapter", 0, g.t.DeleteAdapter, req)
}

func (g deadlinedTrainer) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	return bounded(ctx, g.d, "ForwardBackward", forwardBackwardTokens(req), g.t.ForwardBackward, req)
}

func (g deadlinedTrainer) OptimStep(ctx context.Context, req *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error) {
	return bounded(ctx, g.d, "OptimStep", 0, g.t.OptimStep, req)
}

func (g deadlinedTrainer) SaveAdapter(ctx context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	return bounded(ctx, g.d, "SaveAdapter", 0, g.t.SaveAdapter, req)
}

func (g deadlinedTrainer) LoadAdapter(ctx context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	return bounded(ctx, g.d, "LoadAdapter", 0, g.t.LoadAdapter, req)
}

type deadlinedSampler struct {
	s Sampler
	d Deadlines
}

func (g deadlinedSampler) GetCapabilities(ctx context.Context, req *backendv1.GetCapabilitiesRequest) (*backendv1.GetCapabilitiesResponse, error) {
	return bounded(ctx, g.d, "GetCapabilities", 0, g.s.GetCapabilities, req)
}

func (g deadlinedSampler) Sample(ctx context.Context, req *backendv1.SampleRequest) (*backendv1.SampleResponse, error) {
	return bounded(ctx, g.d, "Sample", sampleTokens(req), g.s.Sample, req)
}
