package infer

import (
	"context"
	"errors"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// limitedModels serves loops/tiny with a max_sequence_length.
type limitedModels struct {
	loopsv1connect.UnimplementedModelServiceHandler
	dir   string
	limit int32
}

func (m limitedModels) ListModels(context.Context, *loopsv1.ListModelsRequest) (*loopsv1.ListModelsResponse, error) {
	return &loopsv1.ListModelsResponse{Models: []*loopsv1.ModelInfo{{Name: tiny.Name, TokenizerId: m.dir, MaxSequenceLength: m.limit}}}, nil
}

// countingSampling is fakeSampling that counts the samples queued.
type countingSampling struct {
	fakeSampling
	queued atomic.Int32
}

func (f *countingSampling) SampleStream(ctx context.Context, req *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	f.queued.Add(1)
	return f.fakeSampling.SampleStream(ctx, req, sink)
}

func tinyDir(t *testing.T) string {
	t.Helper()
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	return dir
}

func requireTooLong(t *testing.T, err error, param string, contains ...string) {
	t.Helper()
	var ae *Error
	require.True(t, errors.As(err, &ae), "%v", err)
	require.Equal(t, 400, ae.Status)
	require.Equal(t, "context_length_exceeded", ae.Code)
	require.Equal(t, param, ae.Param)
	for _, c := range contains {
		require.Contains(t, ae.Message, c)
	}
}

// TestOverlongPromptRefusedByBytes: a prompt of more bytes than the model's token limit can
// hold is refused before it is rendered or tokenized, with a 400 that gives the limit and
// the fix; nothing is queued. Today's main tokenized such a prompt whole (a 60 MiB message
// took 52.8 s and 4.4 GiB) before the core refused its token count.
func TestOverlongPromptRefusedByBytes(t *testing.T) {
	dir := tinyDir(t)
	f := &countingSampling{}
	const limit = 100
	e := New(Services{Sampling: f, Models: limitedModels{dir: dir, limit: limit}}, Options{})
	tx, err := e.Text(t.Context(), tiny.Name)
	require.NoError(t, err)
	maxBytes := limit * len(tiny.EOS) // the longest token of loops/tiny is its EOS
	huge := strings.Repeat("x", maxBytes+1)

	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: []Message{{Role: "user", Content: huge}}})
	requireTooLong(t, err, "messages", "1301 bytes", "limit of 100 tokens", "shorten")
	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: []Message{{Role: "user", Content: "hi"}}, Prefill: huge})
	requireTooLong(t, err, "messages")
	_, err = e.Tokens(t.Context(), &Request{Model: tiny.Name, Messages: []Message{{Role: "user", Content: huge}}})
	requireTooLong(t, err, "messages")
	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: make([]Message, limit+1)})
	requireTooLong(t, err, "messages", "101 messages cannot fit", "send fewer")
	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Prompts: []Prompt{{Text: "ok"}, {Text: huge}}})
	requireTooLong(t, err, "prompt[1]", "bytes")
	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Prompts: []Prompt{{Tokens: make([]int32, limit+1)}}})
	requireTooLong(t, err, "prompt", "101 tokens")
	require.Zero(t, f.queued.Load(), "nothing was queued")

	// A chat template that renders short messages into a long prompt is bounded too.
	tmpl, err := compileTemplate(`{% for m in messages %}{% for i in range(1000) %}{{ m.content }}{% endfor %}{% endfor %}`)
	require.NoError(t, err)
	tx.tmpl = tmpl
	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: []Message{{Role: "user", Content: "xyz"}}})
	requireTooLong(t, err, "messages", "more than 100 tokens")
}

// TestOverlongPromptStopsTokenizing: a prompt within the byte bound but over the token
// limit is refused once tokenizing passes the limit (backends/reference/tokenizer's
// EncodeLimit stops there).
func TestOverlongPromptStopsTokenizing(t *testing.T) {
	dir := tinyDir(t)
	f := &countingSampling{}
	e := New(Services{Sampling: f, Models: limitedModels{dir: dir, limit: 100}}, Options{})
	text := strings.Repeat("\U0001F642 ", 200) // each emoji is several tokens
	_, err := e.Sample(t.Context(), &Request{Model: tiny.Name, Prompts: []Prompt{{Text: text}}})
	requireTooLong(t, err, "prompt", "more than 100 tokens", "max_sequence_length")
	_, err = e.Sample(t.Context(), &Request{Model: tiny.Name, Messages: []Message{{Role: "user", Content: text}}})
	requireTooLong(t, err, "messages", "more than 100 tokens")
	require.Zero(t, f.queued.Load())
	// Within the limit, the same path tokenizes as Encode does.
	ps, err := e.Tokens(t.Context(), &Request{Model: tiny.Name, Prompts: []Prompt{{Text: "Hello world"}}})
	require.NoError(t, err)
	tx, err := e.Text(t.Context(), tiny.Name)
	require.NoError(t, err)
	require.Equal(t, tx.Encode("Hello world"), ps[0])
}

// TestTopLogprobsBound: choices × max_tokens × top_logprobs over MaxLogprobAlternatives is
// refused before any work, naming the product and the limit (n = 32 once made a 77.6 MB
// answer and +640 MiB).
func TestTopLogprobsBound(t *testing.T) {
	dir := tinyDir(t)
	f := &countingSampling{}
	e := New(Services{Sampling: f, Models: limitedModels{dir: dir, limit: 2048}}, Options{})
	params := func(maxTokens, top int32) *loopsv1.SamplingParams {
		return &loopsv1.SamplingParams{MaxTokens: maxTokens, TopLogprobs: top}
	}
	for _, c := range []struct {
		req  *Request
		want string
	}{
		{&Request{Model: tiny.Name, Prompts: []Prompt{{Text: "x"}}, N: 32, Params: params(1024, 20)}, "32 choices × max_tokens 1024 × top_logprobs 20 = 655360"},
		{&Request{Model: tiny.Name, Prompts: []Prompt{{Text: "x"}, {Text: "y"}}, N: 4, Params: params(0, 20)}, "8 choices × max_tokens (not given: its default) 1024 × top_logprobs 20"},
	} {
		_, err := e.Sample(t.Context(), c.req)
		var ae *Error
		require.True(t, errors.As(err, &ae), "%v", err)
		require.Equal(t, 400, ae.Status)
		require.Equal(t, "top_logprobs", ae.Param)
		require.Contains(t, ae.Message, c.want)
		require.Contains(t, ae.Message, "limit of 131072")
	}
	require.Zero(t, f.queued.Load())
	_, err := e.Sample(t.Context(), &Request{Model: tiny.Name, Prompts: []Prompt{{Text: "x"}}, N: 4, Params: params(1024, 20)})
	require.NoError(t, err, "4 × 1024 × 20 is within the bound")
}

// heldCore is a core whose samples run until their sink is gone, then take until end is
// closed to stop (a backend finishing its step), then fail with Canceled.
type heldCore struct {
	loopsv1connect.UnimplementedSamplingServiceHandler
	loopsv1connect.UnimplementedOperationServiceHandler
	end     chan struct{}
	mu      sync.Mutex
	sinks   []tokenstream.Sink
	done    map[string]chan struct{}
	started chan struct{}
}

func (h *heldCore) CreateSampler(context.Context, *loopsv1.CreateSamplerRequest) (*loopsv1.Sampler, error) {
	return &loopsv1.Sampler{Id: "smp", BaseModel: tiny.Name}, nil
}

func (h *heldCore) SampleStream(_ context.Context, _ *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	h.mu.Lock()
	defer h.mu.Unlock()
	id := "op" + string(rune('a'+len(h.sinks)))
	h.sinks = append(h.sinks, sink)
	done := make(chan struct{})
	h.done[id] = done
	go func() {
		<-sink.Gone()
		<-h.end
		close(done)
	}()
	h.started <- struct{}{}
	return &loopsv1.Operation{Id: id, State: loopsv1.OperationState_OPERATION_STATE_RUNNING}, nil
}

func (h *heldCore) WaitOperation(ctx context.Context, req *loopsv1.WaitOperationRequest) (*loopsv1.Operation, error) {
	h.mu.Lock()
	done := h.done[req.GetId()]
	h.mu.Unlock()
	select {
	case <-done:
		return &loopsv1.Operation{Id: req.GetId(), State: loopsv1.OperationState_OPERATION_STATE_FAILED,
			Error: &loopsv1.OperationError{Code: int32(connect.CodeCanceled), Message: "stopped"}}, nil
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

// TestAbandonedSampleIsStoppedAndWaitedFor: when the client of a request that is not
// streamed goes away, its samples' sinks are gone (the core stops them) and Sample returns
// only once the core says they have ended, so the request counts against its key until
// then. Today's main queued such samples with no way to stop them and returned at once.
func TestAbandonedSampleIsStoppedAndWaitedFor(t *testing.T) {
	dir := tinyDir(t)
	h := &heldCore{end: make(chan struct{}), done: map[string]chan struct{}{}, started: make(chan struct{}, 8)}
	e := New(Services{Sampling: h, Operations: h, Models: limitedModels{dir: dir, limit: 2048}}, Options{})
	ctx, cancel := context.WithCancel(t.Context())
	returned := make(chan error, 1)
	go func() {
		_, err := e.Sample(ctx, &Request{Model: tiny.Name, Prompts: []Prompt{{Text: "a"}, {Text: "b"}}, Params: &loopsv1.SamplingParams{MaxTokens: 8}})
		returned <- err
	}()
	for range 2 {
		select {
		case <-h.started:
		case err := <-returned:
			t.Fatalf("Sample returned (%v) without queueing its samples with a sink that can stop them", err)
		case <-time.After(time.Minute):
			t.Fatal("the samples were not queued")
		}
	}
	cancel() // the client leaves
	h.mu.Lock()
	sinks := h.sinks
	h.mu.Unlock()
	require.Len(t, sinks, 2)
	for _, s := range sinks {
		select {
		case <-s.Gone():
		case <-time.After(10 * time.Second):
			t.Fatal("the sample's sink is not gone after its client left: it would decode for nobody")
		}
	}
	select {
	case err := <-returned:
		t.Fatalf("Sample returned (%v) while its samples still ran", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(h.end) // the samples end
	select {
	case err := <-returned:
		require.Equal(t, connect.CodeCanceled, connect.CodeOf(err))
	case <-time.After(10 * time.Second):
		t.Fatal("Sample did not return once its samples ended")
	}
}
