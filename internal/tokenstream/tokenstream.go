// Package tokenstream carries sampled tokens from a sampler to a client while they are
// decoded, for the streaming answers of the inference APIs (compat/openai,
// compat/anthropic).
//
// The path is: the adapter makes a Buffer and passes it to the core
// (Streamer.SampleStream), the core hands it with the sample to the backend when the fair
// scheduler gives the sample a slot (backends.TokenStreamer), and the backend's decoder
// calls Buffer.Token for every token it samples. Token never blocks: the decoder serves
// every request in its batch, so one slow reader must not hold it. The buffer is bounded by
// what the request may produce (max_tokens × num_samples, which the core has already
// bounded) and by an explicit limit past which it stops the sample. A reader that goes
// away calls Close: the backend drops the sample at its next step boundary.
//
// A backend without the ability (the torch worker's vLLM sampler today) never calls Token; the adapter
// then sends the whole text when the operation completes. So the tokens streamed are a
// prefix of the operation's result, never something else.
//
// A request that is not streamed passes a Watch instead: it keeps no tokens (the core then
// samples without streaming) and only closes Gone when its client goes away, so that an
// abandoned request is stopped as a streamed one is.
package tokenstream

import (
	"context"
	"sync"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Token is one sampled token of sequence Seq (0 ≤ Seq < num_samples), with its most
// likely alternatives when the request asked for them (SamplingParams.top_logprobs).
type Token struct {
	Seq     int
	ID      int32
	Logprob float32
	Top     []Alt
}

// Alt is one of the most likely tokens at a sampled token's position.
type Alt struct {
	ID      int32
	Logprob float32
}

// Buffer queues the tokens of one sampling request between the decoder (Token) and one
// reader (Ready, Take). It is safe for concurrent use.
type Buffer struct {
	limit int

	mu     sync.Mutex
	toks   []Token
	total  int
	closed bool
	ready  chan struct{} // one pending wake-up for the reader
	gone   chan struct{} // closed by Close
}

// NewBuffer returns a buffer that holds at most limit tokens not yet taken; past it the
// buffer closes itself (the sample is stopped): a reader that falls that far behind is
// treated as gone.
func NewBuffer(limit int) *Buffer {
	return &Buffer{limit: max(limit, 1), ready: make(chan struct{}, 1), gone: make(chan struct{})}
}

// Token records a sampled token. It never blocks.
func (b *Buffer) Token(seq int, id int32, logprob float32, top []Alt) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed {
		return
	}
	if len(b.toks) >= b.limit {
		b.closeLocked()
		return
	}
	b.toks = append(b.toks, Token{Seq: seq, ID: id, Logprob: logprob, Top: top})
	b.total++
	select {
	case b.ready <- struct{}{}:
	default:
	}
}

// Ready receives a value after Token added tokens that Take has not returned yet.
func (b *Buffer) Ready() <-chan struct{} { return b.ready }

// Take returns the tokens recorded since the last Take, oldest first.
func (b *Buffer) Take() []Token {
	b.mu.Lock()
	defer b.mu.Unlock()
	out := b.toks
	b.toks = nil
	return out
}

// Close says the reader is gone: later tokens are dropped and Gone is closed.
func (b *Buffer) Close() {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.closeLocked()
}

func (b *Buffer) closeLocked() {
	if !b.closed {
		b.closed = true
		b.toks = nil
		close(b.gone)
	}
}

// Gone is closed when the reader has gone (Close) or fell more than the limit behind.
func (b *Buffer) Gone() <-chan struct{} { return b.gone }

// Sink is what a sampler writes to: Token must not block, and Gone is closed when nobody
// reads any more (the sampler should stop).
type Sink interface {
	Token(seq int, id int32, logprob float32, top []Alt)
	Gone() <-chan struct{}
}

// Streamer is implemented by the core's SamplingService: Sample, with the sampled tokens
// also written to sink as they are decoded (when the backend can; otherwise nothing is
// written and the operation's result carries them as usual). The operation, its result,
// its queueing and its metering are those of Sample.
type Streamer interface {
	SampleStream(ctx context.Context, req *loopsv1.SampleRequest, sink Sink) (*loopsv1.Operation, error)
}

// CancelOnGone returns a context derived from ctx that is cancelled when sink is gone,
// and its cancel function, which the caller must call (it also ends the watch).
func CancelOnGone(ctx context.Context, sink Sink) (context.Context, context.CancelFunc) {
	ctx, cancel := context.WithCancel(ctx)
	go func() {
		select {
		case <-sink.Gone():
			cancel()
		case <-ctx.Done():
		}
	}()
	return ctx, cancel
}

// Watch is the Sink of a request whose tokens nobody reads while they are decoded (an
// inference request that is not streamed): it keeps none, and closes Gone when Close says
// its client has gone, which stops the sample as a streamed one is stopped. A sampler may
// sample without streaming to it (Discards) as long as it stops once Gone is closed.
type Watch struct {
	once sync.Once
	gone chan struct{}
}

// NewWatch returns a Watch whose client is there.
func NewWatch() *Watch { return &Watch{gone: make(chan struct{})} }

// Token drops the token.
func (w *Watch) Token(int, int32, float32, []Alt) {}

// Gone is closed by Close.
func (w *Watch) Gone() <-chan struct{} { return w.gone }

// Close says the client has gone: the sample should stop. Closing again does nothing.
func (w *Watch) Close() { w.once.Do(func() { close(w.gone) }) }

// Discards reports whether sink keeps no tokens (a *Watch): a sampler may then sample
// without streaming, and watch only Gone.
func Discards(sink Sink) bool {
	_, ok := sink.(*Watch)
	return ok
}
