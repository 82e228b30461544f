package reference

import (
	"math"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func sample(t *testing.T, e *Engine, prompt []int, n int, p *loopsv1.SamplingParams, plp bool, k int) *loopsv1.SampleResult {
	t.Helper()
	r, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(prompt), NumSamples: int32(n), Params: p, PromptLogprobs: plp, TopkPromptLogprobs: int32(k)})
	require.NoError(t, err)
	return r.Result
}

func seedp(s uint64) *uint64 { return &s }

func ints(x []int32) []int {
	o := make([]int, len(x))
	for i, v := range x {
		o[i] = int(v)
	}
	return o
}

// fullLogprobs returns, for every position i >= 1 of seq, log p(· | seq[:i]) over the
// whole vocabulary at temperature 1 (from top-k prompt log-probs with k = vocab).
func fullLogprobs(t *testing.T, e *Engine, seq []int) [][]float64 {
	r := sample(t, e, seq, 1, &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 1, TopP: 1}, false, 512)
	tk := r.TopkPromptLogprobs
	out := make([][]float64, len(seq))
	for i := 1; i < len(seq); i++ {
		row := make([]float64, 512)
		for c := 0; c < 512; c++ {
			row[tk.TokenIds[i*512+c]] = float64(tk.Logprobs[i*512+c])
		}
		out[i] = row
	}
	return out
}

func TestSamplingDeterminismAndKVCache(t *testing.T) {
	e := engine(t)
	prompt := seqA[:6]
	p := &loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1, TopP: 1, Seed: seedp(42)}
	a := sample(t, e, prompt, 3, p, false, 0)
	b := sample(t, e, prompt, 3, p, false, 0)
	require.Len(t, a.Sequences, 3)
	for i := range a.Sequences {
		require.Equal(t, a.Sequences[i].Tokens, b.Sequences[i].Tokens)
		require.Equal(t, a.Sequences[i].Logprobs, b.Sequences[i].Logprobs)
	}
	require.NotEqual(t, a.Sequences[0].Tokens, a.Sequences[1].Tokens, "samples of one request differ")
	c := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1, TopP: 1, Seed: seedp(43)}, false, 0)
	require.NotEqual(t, a.Sequences[0].Tokens, c.Sequences[0].Tokens, "another seed, other tokens")
	u1 := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1, TopP: 1}, false, 0)
	u2 := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1, TopP: 1}, false, 0)
	require.NotEqual(t, u1.Sequences[0].Tokens, u2.Sequences[0].Tokens, "no seed: random")

	// the KV-cached log-probs equal a full forward pass over prompt + sample
	createAdapter(t, e, "kv", 4, 1) // B = 0: same as the base model
	for _, s := range a.Sequences {
		toks := ints(s.Tokens)
		if s.StopReason == loopsv1.StopReason_STOP_REASON_LENGTH {
			require.Len(t, toks, 12)
		}
		full := append(append([]int{}, prompt...), toks...)
		res := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "kv", LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{ceDatum(full)}})
		lp := res.Outputs[0].Outputs["logprobs"].Float32Data
		for j := range toks {
			require.InDelta(t, lp[len(prompt)-1+j], s.Logprobs[j], 2e-4)
		}
	}
}

func TestSamplingParameters(t *testing.T) {
	e := engine(t)
	prompt := seqA[:5]
	// temperature-scaled log-probs
	r := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 0.5, TopP: 1, Seed: seedp(1)}, false, 0)
	s := r.Sequences[0]
	full := append(append([]int{}, prompt...), ints(s.Tokens)...)
	fl := fullLogprobs(t, e, full)
	for j, tok := range s.Tokens {
		row := fl[len(prompt)+j] // distribution predicting the token at len(prompt)+j
		scaled := make([]float64, len(row))
		mx := math.Inf(-1)
		for v, x := range row {
			scaled[v] = x / 0.5
			mx = math.Max(mx, scaled[v])
		}
		var z float64
		for _, x := range scaled {
			z += math.Exp(x - mx)
		}
		require.InDelta(t, scaled[tok]-mx-math.Log(z), s.Logprobs[j], 5e-4)
	}
	// greedy, top_k = 1 and a tiny top_p all pick the argmax
	g := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 0, TopP: 1}, false, 0).Sequences[0]
	k1 := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 1, TopK: 1, TopP: 1, Seed: seedp(5)}, false, 0).Sequences[0]
	p0 := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 1, TopP: 1e-6, Seed: seedp(6)}, false, 0).Sequences[0]
	require.Equal(t, g.Tokens, k1.Tokens)
	require.Equal(t, g.Tokens, p0.Tokens)
	for j := range k1.Logprobs {
		require.Equal(t, float32(0), k1.Logprobs[j])
		require.Equal(t, float32(0), p0.Logprobs[j])
	}
	gfull := fullLogprobs(t, e, append(append([]int{}, prompt...), ints(g.Tokens)...))
	for j, tok := range g.Tokens {
		row := gfull[len(prompt)+j]
		best := 0
		for v := range row {
			if row[v] > row[best] {
				best = v
			}
		}
		require.Equal(t, best, int(tok))
		require.InDelta(t, row[best], g.Logprobs[j], 1e-4)
	}
	// top_k = 5: every token is among the 5 most likely, log-probs renormalised over them
	tk := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 5, Temperature: 1, TopK: 5, TopP: 1, Seed: seedp(7)}, false, 0).Sequences[0]
	tkf := fullLogprobs(t, e, append(append([]int{}, prompt...), ints(tk.Tokens)...))
	for j, tok := range tk.Tokens {
		row := tkf[len(prompt)+j]
		rank := 0
		for _, x := range row {
			if x > row[tok] {
				rank++
			}
		}
		require.Less(t, rank, 5)
		require.Greater(t, float64(tk.Logprobs[j]), row[tok]) // renormalised over 5 tokens
	}
	// stop tokens and stop strings end the sequence, which includes the stop
	base := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 16, Temperature: 1, TopP: 1, Seed: seedp(9)}, false, 0).Sequences[0]
	bt := ints(base.Tokens)
	stopTok := bt[4]
	want := 0
	for want = range bt {
		if bt[want] == stopTok {
			break
		}
	}
	st := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 16, Temperature: 1, TopP: 1, Seed: seedp(9), StopTokens: []int32{int32(stopTok)}}, false, 0).Sequences[0]
	require.Equal(t, base.Tokens[:want+1], st.Tokens)
	require.Equal(t, loopsv1.StopReason_STOP_REASON_STOP, st.StopReason)
	bm := e.models[tiny.Name]
	text := bm.tok.Decode(bt)
	stop := ""
	for _, r := range []int{6, 5, 7, 8} { // a short stop string taken from the text
		if x := bm.tok.Decode(bt[r : r+1]); len(strings.TrimSpace(x)) > 0 && strings.ToValidUTF8(x, "") == x {
			stop = x
			break
		}
	}
	require.NotEmpty(t, stop, "text %q", text)
	wantLen := 0
	for wantLen = 1; wantLen <= len(bt); wantLen++ {
		if strings.Contains(bm.tok.Decode(bt[:wantLen]), stop) {
			break
		}
	}
	ss := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 16, Temperature: 1, TopP: 1, Seed: seedp(9), StopStrings: []string{stop}}, false, 0).Sequences[0]
	require.Equal(t, base.Tokens[:wantLen], ss.Tokens, "stop string %q", stop)
	require.Equal(t, loopsv1.StopReason_STOP_REASON_STOP, ss.StopReason)
	// length
	ln := sample(t, e, prompt, 2, &loopsv1.SamplingParams{MaxTokens: 3, Temperature: 0, TopP: 1}, false, 0)
	for _, s := range ln.Sequences {
		require.Len(t, s.Tokens, 3)
		require.Len(t, s.Logprobs, 3)
		require.Equal(t, loopsv1.StopReason_STOP_REASON_LENGTH, s.StopReason)
	}
}

func TestEOSStops(t *testing.T) {
	e := engine(t)
	bm := e.models[tiny.Name]
	require.NotEmpty(t, bm.eos)
	eos := bm.eos[0]
	// train an adapter to emit EOS after the prompt, then sample greedily
	createAdapter(t, e, "eos", 8, 1)
	prompt := seqA[:4]
	for i := 0; i < 40; i++ {
		fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "eos", LossFn: "cross_entropy", Data: []*loopsv1.Datum{ceDatum(append(append([]int{}, prompt...), eos), 0, 0, 0, 1)}})
		_, err := e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "eos", Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}})
		require.NoError(t, err)
	}
	dir := t.TempDir()
	_, err := e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "eos", Dir: dir})
	require.NoError(t, err)
	r, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: dir, Prompt: toks32(prompt), NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 10, Temperature: 0, TopP: 1}})
	require.NoError(t, err)
	s := r.Result.Sequences[0]
	require.Equal(t, []int32{int32(eos)}, s.Tokens)
	require.Equal(t, loopsv1.StopReason_STOP_REASON_STOP, s.StopReason)
}

func TestPromptLogprobs(t *testing.T) {
	e := engine(t)
	prompt := seqA[:9]
	r := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 1, TopP: 1, Seed: seedp(1)}, true, 3)
	require.Len(t, r.PromptLogprobs, len(prompt))
	require.True(t, math.IsNaN(float64(r.PromptLogprobs[0])))
	createAdapter(t, e, "plp", 4, 1)
	res := fb(t, e, &backendv1.ForwardBackwardItem{AdapterId: "plp", LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{ceDatum(prompt)}})
	lp := res.Outputs[0].Outputs["logprobs"].Float32Data
	for i := 1; i < len(prompt); i++ {
		require.InDelta(t, lp[i-1], r.PromptLogprobs[i], 1e-4)
	}
	tk := r.TopkPromptLogprobs
	require.Equal(t, int32(3), tk.K)
	require.Equal(t, int32(len(prompt)), tk.Length)
	require.Len(t, tk.TokenIds, 3*len(prompt))
	for c := 0; c < 3; c++ {
		require.Equal(t, int32(0), tk.TokenIds[c])
		require.Equal(t, float32(-99999), tk.Logprobs[c])
	}
	for i := 1; i < len(prompt); i++ {
		row := tk.Logprobs[i*3 : i*3+3]
		require.GreaterOrEqual(t, row[0], row[1])
		require.GreaterOrEqual(t, row[1], row[2])
		require.GreaterOrEqual(t, row[0], r.PromptLogprobs[i]-1e-6)
	}
}
