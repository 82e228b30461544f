package worker

import (
	"context"
	"math"
	"sync"
	"testing"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// collector is a tokenstream.Sink that keeps every token, and goes away after goneAfter
// tokens when goneAfter > 0.
type collector struct {
	goneAfter int

	mu   sync.Mutex
	toks []tokenstream.Token
	gone chan struct{}
}

func newCollector(goneAfter int) *collector {
	return &collector{goneAfter: goneAfter, gone: make(chan struct{})}
}

func (c *collector) Token(seq int, id int32, lp float32, top []tokenstream.Alt) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.toks = append(c.toks, tokenstream.Token{Seq: seq, ID: id, Logprob: lp, Top: top})
	if c.goneAfter > 0 && len(c.toks) == c.goneAfter {
		close(c.gone)
	}
}

func (c *collector) Gone() <-chan struct{} { return c.gone }

// bySeq returns the collected tokens of each sequence in order.
func (c *collector) bySeq(n int) [][]tokenstream.Token {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := make([][]tokenstream.Token, n)
	for _, t := range c.toks {
		out[t.Seq] = append(out[t.Seq], t)
	}
	return out
}

// TestStreamSample: the worker streams every token as it samples it (StreamSample), the
// streamed tokens are the result's, and their top_logprobs are the reference engine's (an
// independent implementation of the same definition) within 1e-4, greedy and seeded with
// top_k/top_p; a reader that goes away stops the sample with Canceled and leaves the worker
// serving.
func TestStreamSample(t *testing.T) {
	b := sharedBackend(t)
	ctx := context.Background()
	ref, err := reference.New(reference.Options{DataDir: sharedDir})
	require.NoError(t, err)
	prompt := []int32{72, 101, 108, 108, 111, 32, 119}
	for _, p := range []*loopsv1.SamplingParams{
		{MaxTokens: 8, Temperature: 0, TopP: 1, TopLogprobs: 5},
		{MaxTokens: 8, Temperature: 0.8, TopK: 50, TopP: 0.9, Seed: new(uint64(7)), TopLogprobs: 3},
		{MaxTokens: 6, Temperature: 1, TopP: 1, Seed: new(uint64(3)), TopLogprobs: 2},
	} {
		req := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: prompt, NumSamples: 2, Params: p}
		sink := newCollector(0)
		got, err := (*sampler)(b).SampleStream(ctx, req, sink)
		require.NoError(t, err)
		want, err := ref.Sample(ctx, req)
		require.NoError(t, err)
		streamed := sink.bySeq(2)
		var worst float64
		for i, seq := range got.Result.Sequences {
			require.Len(t, streamed[i], len(seq.Tokens), "sequence %d: one streamed token per sampled token", i)
			tk := seq.GetTopLogprobs()
			require.NotNil(t, tk, "top_logprobs asked for")
			require.EqualValues(t, p.TopLogprobs, tk.K)
			require.EqualValues(t, len(seq.Tokens), tk.Length)
			for j, st := range streamed[i] {
				require.Equal(t, seq.Tokens[j], st.ID)
				require.Equal(t, seq.Logprobs[j], st.Logprob)
				for c, a := range st.Top {
					require.Equal(t, tk.TokenIds[j*int(tk.K)+c], a.ID)
					require.Equal(t, tk.Logprobs[j*int(tk.K)+c], a.Logprob)
				}
			}
			ws := want.Result.Sequences[i]
			require.Equal(t, ws.Tokens, seq.Tokens, "the worker draws the reference engine's tokens (same PCG streams)")
			wt := ws.GetTopLogprobs()
			require.Equal(t, wt.TokenIds, tk.TokenIds)
			for e := range wt.Logprobs {
				worst = math.Max(worst, math.Abs(float64(wt.Logprobs[e])-float64(tk.Logprobs[e])))
			}
		}
		t.Logf("temperature %g top_k %d top_p %g: %d tokens streamed; max |Δ| top_logprobs vs reference %.3g", p.Temperature, p.TopK, p.TopP, len(sink.toks), worst)
		require.Less(t, worst, 1e-4)
	}

	// The reader goes away after 3 tokens of a long sample: Canceled, and the worker serves on.
	req := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: prompt, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 400, Temperature: 1, TopP: 1, Seed: new(uint64(5))}}
	sink := newCollector(3)
	_, err = (*sampler)(b).SampleStream(ctx, req, sink)
	require.Equal(t, connect.CodeCanceled, connect.CodeOf(err), "%v", err)
	require.Less(t, len(sink.bySeq(1)[0]), 400)
	req.Params.MaxTokens = 4
	res, err := b.Sampler().Sample(ctx, req)
	require.NoError(t, err)
	require.Len(t, res.Result.Sequences[0].Tokens, 4)
}
