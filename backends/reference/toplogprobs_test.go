package reference

import (
	"math"
	"path/filepath"
	"sort"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// wantTop is the reference computation of SamplingParams.top_logprobs in float64, written
// here from its definition: the log-probs of the distribution a token is drawn from (at
// temperature <= 0 the model's at temperature 1; otherwise softmax(z / T) over the top_k
// most likely tokens, then the smallest prefix whose mass reaches top_p, renormalised),
// the k most likely first, ties by lower id.
func wantTop(z []float64, p *loopsv1.SamplingParams, k int) (ids []int, lps []float64) {
	order := make([]int, len(z))
	for i := range order {
		order[i] = i
	}
	sort.SliceStable(order, func(a, b int) bool { return z[order[a]] > z[order[b]] })
	T := float64(p.Temperature)
	if T <= 0 {
		T = 1
	} else if p.TopK > 0 && int(p.TopK) < len(order) {
		order = order[:p.TopK]
	}
	mx := z[order[0]] / T
	w := make([]float64, len(order))
	var sum float64
	for i, t := range order {
		w[i] = math.Exp(z[t]/T - mx)
		sum += w[i]
	}
	if p.Temperature > 0 && p.TopP > 0 && p.TopP < 1 {
		acc := 0.0
		for i := range w {
			acc += w[i] / sum
			if acc >= float64(p.TopP) {
				order, w = order[:i+1], w[:i+1]
				break
			}
		}
		sum = 0
		for _, x := range w {
			sum += x
		}
	}
	for i := range min(k, len(order)) {
		ids = append(ids, order[i])
		lps = append(lps, math.Log(w[i]/sum))
	}
	return ids, lps
}

// TestTopLogprobsMatchFloat64: the engine's top_logprobs of every sampled token are the k
// most likely tokens, with their log-probs within 1e-4, of the distribution computed in
// float64 from a float64 copy of the model's logits; the sampled token's logprob is its
// own entry when it is among them.
func TestTopLogprobsMatchFloat64(t *testing.T) {
	e := engine(t)
	m64, err := nn.Load[float64](filepath.Join(engineDir(t), "models", "loops-tiny"))
	require.NoError(t, err)
	prompt := seqA[:7]
	seed := uint64(5)
	for _, c := range []struct {
		p *loopsv1.SamplingParams
		k int
	}{
		{&loopsv1.SamplingParams{MaxTokens: 12, Temperature: 0, TopP: 1}, 5},
		{&loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1.3, TopP: 1, Seed: &seed}, 3},
		{&loopsv1.SamplingParams{MaxTokens: 12, Temperature: 0.7, TopK: 40, TopP: 0.9, Seed: &seed}, 20},
		{&loopsv1.SamplingParams{MaxTokens: 12, Temperature: 1, TopK: 4, TopP: 1, Seed: &seed}, 20},
	} {
		c.p.TopLogprobs = int32(c.k)
		resp, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(prompt), NumSamples: 2, Params: c.p})
		require.NoError(t, err)
		for _, seq := range resp.Result.Sequences {
			top := seq.TopLogprobs
			require.NotNil(t, top)
			require.Equal(t, int32(c.k), top.K)
			require.Equal(t, int32(len(seq.Tokens)), top.Length)
			// Logits of every position in float64: row r predicts token r+1.
			all := append(append([]int(nil), prompt...), make([]int, len(seq.Tokens))...)
			for i, tok := range seq.Tokens {
				all[len(prompt)+i] = int(tok)
			}
			pos := make([]int, len(all))
			caches := make([]*nn.KVCache[float64], len(all))
			cache := m64.NewCache()
			for i := range pos {
				pos[i], caches[i] = i, cache
			}
			V := m64.Cfg.Vocab
			lg := m64.Logits(m64.Step(all, pos, caches, nil), len(all), nil)
			for i, tok := range seq.Tokens {
				r := len(prompt) - 1 + i
				ids, lps := wantTop(lg[r*V:(r+1)*V], c.p, c.k)
				for j := range c.k {
					gotID, gotLP := top.TokenIds[i*c.k+j], top.Logprobs[i*c.k+j]
					if j >= len(ids) {
						require.Equal(t, int32(0), gotID, "%v token %d: cell %d is empty", c.p, i, j)
						require.Equal(t, float32(-99999), gotLP)
						continue
					}
					require.Equal(t, int32(ids[j]), gotID, "%v token %d rank %d", c.p, i, j)
					require.InDelta(t, lps[j], float64(gotLP), 1e-4, "%v token %d rank %d", c.p, i, j)
					if gotID == tok {
						require.Equal(t, seq.Logprobs[i], gotLP, "the sampled token's logprob is its entry")
					}
				}
				if c.p.Temperature == 0 {
					require.Equal(t, tok, top.TokenIds[i*c.k], "greedy samples the first alternative")
				}
			}
		}
	}
	_, err = e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(prompt),
		Params: &loopsv1.SamplingParams{MaxTokens: 2, Temperature: 1, TopP: 1, TopLogprobs: 21}})
	require.ErrorContains(t, err, "top_logprobs")
}
