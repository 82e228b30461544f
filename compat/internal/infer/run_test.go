package infer

import (
	"context"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/tokenstream"
)

// TestSafeLen: streamed text never shows part of a stop sequence nor half a character, and
// what it shows is a prefix of the final text.
func TestSafeLen(t *testing.T) {
	for _, c := range []struct {
		s    string
		stop []string
		want string
	}{
		{"hello", nil, "hello"},
		{"hello wor", []string{"world"}, "hello "},
		{"hello world and", []string{"world"}, "hello "},
		{"ab\n", []string{"\n\n"}, "ab"},
		{"abc", []string{"x", "cd"}, "ab"},
		{"caf\xc3", nil, "caf"},
		{"café\xf0\x9f", nil, "café"},
		{"a\xff\xfeb", nil, "a\xff\xfeb"}, // invalid bytes inside stay: they decode the same later
		// Only an incomplete character is held back (at most 3 bytes): text that ends in
		// U+FFFD, or in bytes that can never become a character, is sent.
		{"ok \ufffd", nil, "ok \ufffd"},
		{"a" + strings.Repeat("\x80", 50), nil, "a" + strings.Repeat("\x80", 50)},
		{"a\xff", nil, "a\xff"},
		{"a\xed\xa0", nil, "a\xed\xa0"}, // a surrogate's start: never valid
		{"a\xe4\xb8", nil, "a"},
		{"a\xf0\x9f\x98", nil, "a"},
		{"\xe4\xb8\xe4\xb8", nil, "\xe4\xb8"},
	} {
		require.Equal(t, c.want, c.s[:safeLen(c.s, c.stop)], "%q %q", c.s, c.stop)
	}
}

// fakeSampling answers every sample at once with seqs, after writing the first streamed
// tokens of each sequence to the sink (all of them, or none: a backend that cannot stream).
type fakeSampling struct {
	loopsv1connect.UnimplementedSamplingServiceHandler
	seqs     []*loopsv1.SampledSequence
	streamed int
}

func (f *fakeSampling) CreateSampler(context.Context, *loopsv1.CreateSamplerRequest) (*loopsv1.Sampler, error) {
	return &loopsv1.Sampler{Id: "smp", BaseModel: tiny.Name}, nil
}

func (f *fakeSampling) Sample(ctx context.Context, req *loopsv1.SampleRequest) (*loopsv1.Operation, error) {
	return f.SampleStream(ctx, req, nil)
}

func (f *fakeSampling) SampleStream(_ context.Context, _ *loopsv1.SampleRequest, sink tokenstream.Sink) (*loopsv1.Operation, error) {
	for j, seq := range f.seqs {
		for k := range min(f.streamed, len(seq.Tokens)) {
			if sink != nil {
				sink.Token(j, seq.Tokens[k], seq.Logprobs[k], nil)
			}
		}
	}
	return &loopsv1.Operation{Id: "op", State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED,
		Result: &loopsv1.Operation_Sample{Sample: &loopsv1.SampleResult{Sequences: f.seqs}}}, nil
}

type fakeModels struct {
	loopsv1connect.UnimplementedModelServiceHandler
	dir string
}

func (m fakeModels) ListModels(context.Context, *loopsv1.ListModelsRequest) (*loopsv1.ListModelsResponse, error) {
	return &loopsv1.ListModelsResponse{Models: []*loopsv1.ModelInfo{{Name: tiny.Name, TokenizerId: m.dir}}}, nil
}

// TestRunChunksAddUp: whatever part of the tokens was streamed before the operation's
// answer (all, some still buffered, none), the chunks' text and tokens add up to the
// completion's, each choice ends with one Done chunk, and text never passes a stop
// sequence.
func TestRunChunksAddUp(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tok := tiny.Tokenizer()
	enc := func(s string) []int32 {
		var out []int32
		for _, id := range tok.Encode(s) {
			out = append(out, int32(id))
		}
		return out
	}
	seqs := []*loopsv1.SampledSequence{
		{Tokens: enc("héllo wörld, and more"), StopReason: loopsv1.StopReason_STOP_REASON_LENGTH},
		{Tokens: enc("abc STOP def"), StopReason: loopsv1.StopReason_STOP_REASON_STOP},
	}
	for _, s := range seqs {
		for i := range s.Tokens {
			s.Logprobs = append(s.Logprobs, -float32(i)/8)
		}
	}
	for _, streamed := range []int{0, 3, 1000} {
		f := &fakeSampling{seqs: seqs, streamed: streamed}
		e := New(Services{Sampling: f, Models: fakeModels{dir: dir}}, Options{})
		run, err := e.Stream(t.Context(), &Request{Model: tiny.Name, Prompts: []Prompt{{Text: "x"}}, N: 2,
			Params: &loopsv1.SamplingParams{StopStrings: []string{"STOP"}}})
		require.NoError(t, err)
		text := make([]string, 2)
		var toks [2][]int32
		var lps [2][]float32
		done := make([]int, 2)
		for {
			chunks, err := run.Next(t.Context())
			if IsDone(err) {
				break
			}
			require.NoError(t, err)
			for _, ch := range chunks {
				require.Zero(t, done[ch.Choice], "nothing after a choice's Done chunk")
				text[ch.Choice] += ch.Text
				for _, tk := range ch.Tokens {
					toks[ch.Choice] = append(toks[ch.Choice], tk.ID)
					lps[ch.Choice] = append(lps[ch.Choice], tk.Logprob)
				}
				if ch.Done {
					done[ch.Choice]++
					require.Equal(t, run.Completion().Stopped(ch.Choice), ch.Stopped)
				}
			}
		}
		run.Close()
		c := run.Completion()
		for i := range seqs {
			require.Equal(t, 1, done[i])
			require.Equal(t, c.ChoiceText(i), text[i], "streamed %d, choice %d", streamed, i)
			require.Equal(t, seqs[i].Tokens, toks[i])
			require.Equal(t, seqs[i].Logprobs, lps[i])
		}
		require.Equal(t, "abc ", text[1])
		require.Equal(t, "STOP", c.StopSequence(1))
		require.Equal(t, "", c.StopSequence(0))
	}
}

// TestFinishTakesBufferedTokens: tokens still in the buffer when a sample's answer arrives
// come out in the last chunks, text included.
func TestFinishTakesBufferedTokens(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tx, err := loadText(&loopsv1.ModelInfo{Name: tiny.Name, TokenizerId: dir})
	require.NoError(t, err)
	seq := &loopsv1.SampledSequence{Tokens: tx.Encode("buffered text"), StopReason: loopsv1.StopReason_STOP_REASON_LENGTH}
	seq.Logprobs = make([]float32, len(seq.Tokens))
	r := &Run{c: &Completion{Text: tx}, n: 1, buf: tokenstream.NewBuffer(100), choices: make([]choiceState, 1)}
	for _, tok := range seq.Tokens {
		r.buf.Token(0, tok, 0, nil)
	}
	text := ""
	var toks []int32
	for _, ch := range r.finish(opResult{op: &loopsv1.Operation{Result: &loopsv1.Operation_Sample{Sample: &loopsv1.SampleResult{Sequences: []*loopsv1.SampledSequence{seq}}}}}) {
		text += ch.Text
		for _, tk := range ch.Tokens {
			toks = append(toks, tk.ID)
		}
	}
	require.Equal(t, "buffered text", text)
	require.Equal(t, seq.Tokens, toks)
}

// TestStreamCostIsLinear: streaming a long choice a token at a time allocates a bounded
// amount per token: each batch decodes its own tokens and searches only the text not
// returned yet (about 240 bytes a token here). Today's main decoded every token so far at
// every batch: O(n²), 150 KB a token here.
func TestStreamCostIsLinear(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	dir := t.TempDir()
	require.NoError(t, tiny.Write(dir))
	tx, err := loadText(&loopsv1.ModelInfo{Name: tiny.Name, TokenizerId: dir})
	require.NoError(t, err)
	toks := tx.Encode(strings.Repeat("The quick brown fox jumps over the lazy dog. ", 2500))
	toks = toks[:20000]
	r := &Run{c: &Completion{Text: tx, Stop: []string{"NEVER"}}, n: 1, buf: tokenstream.NewBuffer(100), choices: make([]choiceState, 1)}
	var text strings.Builder
	var m0, m1 runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&m0)
	for _, tok := range toks {
		r.buf.Token(0, tok, 0, nil)
		for _, ch := range r.streamed() {
			text.WriteString(ch.Text)
		}
	}
	runtime.ReadMemStats(&m1)
	require.Equal(t, tx.Decode(toks)[:text.Len()], text.String())
	require.Greater(t, text.Len(), 30000)
	perToken := float64(m1.TotalAlloc-m0.TotalAlloc) / float64(len(toks))
	t.Logf("%.0f bytes allocated per streamed token", perToken)
	require.Less(t, perToken, 2000.0, "bytes allocated per streamed token")
}
