package reference

import (
	"context"
	"math"
	"math/rand/v2"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// promptLogits64 returns the float64 logits of every prompt position (row r predicts token
// r+1) from a float64 copy of the tiny model.
func promptLogits64(t *testing.T, prompt []int) ([]float64, int) {
	m64, err := nn.Load[float64](filepath.Join(engineDir(t), "models", "loops-tiny"))
	require.NoError(t, err)
	pos := make([]int, len(prompt))
	caches := make([]*nn.KVCache[float64], len(prompt))
	cache := m64.NewCache()
	for i := range pos {
		pos[i], caches[i] = i, cache
	}
	return m64.Logits(m64.Step(prompt, pos, caches, nil), len(prompt), nil), m64.Cfg.Vocab
}

// logSoftmax64 is log softmax(z / T) in float64.
func logSoftmax64(z []float64, T float64) []float64 {
	mx := math.Inf(-1)
	for _, v := range z {
		mx = math.Max(mx, v/T)
	}
	var s float64
	for _, v := range z {
		s += math.Exp(v/T - mx)
	}
	out := make([]float64, len(z))
	for i, v := range z {
		out[i] = v/T - mx - math.Log(s)
	}
	return out
}

// TestPromptAltTokensAreTheDefinedDraws: prompt_alt_tokens_k draws are, computed again in
// float64 from their definition (a generator PCG(seed, 0x5851f42d4c957f2d - 1); per row,
// k times: u = Float64() * Σ exp(z/T - max), the first token whose running sum passes u),
// the same tokens, with their temperature-1 log-probs within 1e-4; a draw may differ only
// where u falls within 1e-6 (relative) of a boundary, where float32 logits may cut
// differently.
func TestPromptAltTokensAreTheDefinedDraws(t *testing.T) {
	e := engine(t)
	prompt := seqA[:9]
	lg, V := promptLogits64(t, prompt)
	for _, T := range []float64{1, 0.6, 2} {
		seed := uint64(77)
		const k = 50
		resp, err := e.Sample(context.Background(), &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(prompt), NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: float32(T), TopP: 1, Seed: &seed}, PromptAltTokensK: k})
		require.NoError(t, err)
		alt := resp.Result.PromptAltTokens
		require.NotNil(t, alt)
		require.Equal(t, int32(k), alt.K)
		require.Len(t, alt.TokenIds, (len(prompt)-1)*k)
		rng := rand.New(rand.NewPCG(seed, 0x5851f42d4c957f2d-1))
		near := 0
		for r := 0; r < len(prompt)-1; r++ {
			z := lg[r*V : (r+1)*V]
			lp1 := logSoftmax64(z, 1)
			lpT := logSoftmax64(z, T)
			w := make([]float64, V)
			var sum float64
			for i, v := range lpT {
				w[i] = math.Exp(v)
				sum += w[i]
			}
			for j := range k {
				u := rng.Float64() * sum
				var acc float64
				want := V - 1
				margin := math.Inf(1)
				for i, x := range w {
					acc += x
					margin = math.Min(margin, math.Abs(acc-u))
					if acc > u {
						want = i
						break
					}
				}
				got := int(alt.TokenIds[r*k+j])
				if got != want {
					require.Less(t, margin, 1e-6*sum, "T=%g position %d draw %d: token %d, float64 draws %d", T, r+1, j, got, want)
					near++
				}
				require.InDelta(t, lp1[got], float64(alt.Logprobs[r*k+j]), 1e-4, "T=%g position %d draw %d: logprob at temperature 1", T, r+1, j)
			}
		}
		require.LessOrEqual(t, near, 2, "T=%g: draws off the float64 path", T)
	}
}

// TestPromptAltTokensFollowTheDistribution: over many draws at one position, each of the
// most likely tokens is drawn about as often as its probability at the temperature (within
// 5 standard deviations).
func TestPromptAltTokensFollowTheDistribution(t *testing.T) {
	e := engine(t)
	prompt := seqA[:2]
	lg, V := promptLogits64(t, prompt)
	const T, k, seeds = 0.3, 100, 40
	counts := make([]int, V)
	for s := range uint64(seeds) {
		seed := s
		resp, err := e.Sample(context.Background(), &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(prompt), NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: T, TopP: 1, Seed: &seed}, PromptAltTokensK: k})
		require.NoError(t, err)
		for _, id := range resp.Result.PromptAltTokens.TokenIds {
			counts[id]++
		}
	}
	n := float64(k * seeds)
	lp := logSoftmax64(lg[:V], T)
	checked := 0
	for tok, l := range lp {
		p := math.Exp(l)
		if p < 0.01 {
			continue
		}
		sd := math.Sqrt(p * (1 - p) / n)
		require.InDelta(t, p, float64(counts[tok])/n, 5*sd, "token %d", tok)
		checked++
	}
	require.GreaterOrEqual(t, checked, 3, "too few likely tokens to check")
}

// TestTargetPromptLogprobsMatchFloat64: target_prompt_tokens get their temperature-1
// log-probs (float64 within 1e-4), NaN for -1; bad layouts and ids are refused.
func TestTargetPromptLogprobsMatchFloat64(t *testing.T) {
	e := engine(t)
	ctx := context.Background()
	prompt := seqA[:10]
	lg, V := promptLogits64(t, prompt)
	const k = 4
	ids := make([]int32, (len(prompt)-1)*k)
	for i := range ids {
		ids[i] = int32((i * 37) % V)
		if i%3 == 2 {
			ids[i] = -1
		}
	}
	req := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(prompt), NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 1, Temperature: 0.5, TopP: 1}, TargetPromptTokens: &loopsv1.TargetPromptTokens{K: k, TokenIds: ids}}
	resp, err := e.Sample(ctx, req)
	require.NoError(t, err)
	got := resp.Result.TargetPromptLogprobs.GetLogprobs()
	require.Len(t, got, len(ids))
	for c, id := range ids {
		if id < 0 {
			require.True(t, math.IsNaN(float64(got[c])), "cell %d asked for nothing", c)
			continue
		}
		r := c / k
		require.InDelta(t, logSoftmax64(lg[r*V:(r+1)*V], 1)[id], float64(got[c]), 1e-4, "cell %d", c)
	}
	for _, bad := range []struct {
		ids  []int32
		k    int32
		want string
	}{
		{ids[:len(ids)-1], k, "needs 36"},
		{ids, 0, "target_prompt_tokens.k must be between 1"},
		{append(append([]int32(nil), ids[:len(ids)-1]...), int32(V)), k, "outside the vocabulary"},
		{append(append([]int32(nil), ids[:len(ids)-1]...), -2), k, "outside the vocabulary"},
	} {
		req.TargetPromptTokens = &loopsv1.TargetPromptTokens{K: bad.k, TokenIds: bad.ids}
		_, err := e.Sample(ctx, req)
		require.ErrorContains(t, err, bad.want)
	}
}
