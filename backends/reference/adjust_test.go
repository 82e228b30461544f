package reference

import (
	"bytes"
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/constrain/constraintest"
)

// adjusted is the distribution docs/openai.md writes down, computed independently in
// float64 from the model's log-probs lp (temperature 1): l = lp + bias − fp·c − pp·[c > 0],
// softmax(l / T), tokens below min_p × max dropped, then top_k, then top_p, renormalised.
// It returns the log-prob of every token (−∞ outside the support).
func adjusted(lp []float64, p *loopsv1.SamplingParams, counts map[int]int) []float64 {
	V := len(lp)
	l := slices.Clone(lp)
	for t, b := range p.LogitBias {
		l[t] += float64(b)
	}
	for t, c := range counts {
		l[t] -= float64(c)*float64(p.FrequencyPenalty) + float64(p.PresencePenalty)
	}
	T := float64(p.Temperature)
	mx := math.Inf(-1)
	for _, v := range l {
		mx = max(mx, v/T)
	}
	prob := make([]float64, V)
	var sum float64
	for t, v := range l {
		prob[t] = math.Exp(v/T - mx)
		sum += prob[t]
	}
	for t := range prob {
		prob[t] /= sum
	}
	pmax := slices.Max(prob)
	keep := make([]bool, V)
	order := make([]int, 0, V)
	for t := range prob {
		if prob[t] >= float64(p.MinP)*pmax {
			keep[t] = true
			order = append(order, t)
		}
	}
	sort.SliceStable(order, func(a, b int) bool { return prob[order[a]] > prob[order[b]] })
	if k := int(p.TopK); k > 0 && k < len(order) {
		order = order[:k]
	}
	// top_p over the candidates left, renormalised
	var cs float64
	for _, t := range order {
		cs += prob[t]
	}
	if tp := float64(p.TopP); tp > 0 && tp < 1 {
		acc := 0.0
		for i, t := range order {
			acc += prob[t] / cs
			if acc >= tp {
				order = order[:i+1]
				break
			}
		}
	}
	out := make([]float64, V)
	for i := range out {
		out[i] = math.Inf(-1)
	}
	var z float64
	for _, t := range order {
		z += prob[t]
	}
	for _, t := range order {
		out[t] = math.Log(prob[t] / z)
	}
	return out
}

// TestAdjustmentsMatchFloat64 samples with logit_bias, both penalties, min_p, top_k and
// top_p and checks every sampled token's log-prob, and its top_logprobs, against the
// distribution computed independently in float64 from the model's own log-probs.
func TestAdjustmentsMatchFloat64(t *testing.T) {
	e := engine(t)
	prompt := seqA[:6]
	for _, p := range []*loopsv1.SamplingParams{
		{MaxTokens: 10, Temperature: 0.9, TopP: 1, Seed: seedp(3), LogitBias: map[int32]float32{7: 3.5, 100: -100, 260: 2}, PresencePenalty: 0.7, FrequencyPenalty: 0.4},
		{MaxTokens: 10, Temperature: 1.3, TopP: 0.9, TopK: 50, Seed: seedp(4), MinP: 0.05, PresencePenalty: -1.5, FrequencyPenalty: 2, TopLogprobs: 20},
		{MaxTokens: 10, Temperature: 0.7, TopP: 1, Seed: seedp(5), MinP: 0.2, FrequencyPenalty: -0.5, LogitBias: map[int32]float32{40: 1.25}, TopLogprobs: 5},
	} {
		a := sample(t, e, prompt, 2, p, false, 0)
		b := sample(t, e, prompt, 2, p, false, 0)
		for si, s := range a.Sequences {
			require.Equal(t, s.Tokens, b.Sequences[si].Tokens, "same seed, same tokens")
			toks := ints(s.Tokens)
			full := fullLogprobs(t, e, append(slices.Clone(prompt), toks...))
			counts := map[int]int{}
			for j, tok := range toks {
				want := adjusted(full[len(prompt)+j], p, counts)
				require.False(t, math.IsInf(want[tok], -1), "token %d at %d is outside the support", tok, j)
				require.InDelta(t, want[tok], float64(s.Logprobs[j]), 2e-3, "step %d", j)
				if k := int(p.TopLogprobs); k > 0 {
					tl := s.TopLogprobs
					for c := range k {
						id, lp := tl.TokenIds[j*k+c], tl.Logprobs[j*k+c]
						if lp == -99999 {
							continue
						}
						require.InDelta(t, want[id], float64(lp), 2e-3, "step %d alt %d", j, c)
					}
				}
				counts[tok]++
			}
		}
	}
	// a +100 bias all but forces a token; -100 all but bans it
	r := sample(t, e, prompt, 1, &loopsv1.SamplingParams{MaxTokens: 8, Temperature: 1, TopP: 1, Seed: seedp(1), LogitBias: map[int32]float32{77: 100}}, false, 0)
	for _, tok := range r.Sequences[0].Tokens {
		require.EqualValues(t, 77, tok)
	}
}

func TestAdjustmentsRefused(t *testing.T) {
	e := engine(t)
	for name, p := range map[string]*loopsv1.SamplingParams{
		"bias":      {MaxTokens: 2, Temperature: 1, LogitBias: map[int32]float32{1: 101}},
		"bias id":   {MaxTokens: 2, Temperature: 1, LogitBias: map[int32]float32{100000: 1}},
		"penalty":   {MaxTokens: 2, Temperature: 1, PresencePenalty: 3},
		"min_p":     {MaxTokens: 2, Temperature: 1, MinP: -0.1},
		"schema":    {MaxTokens: 2, Temperature: 1, ResponseFormat: &loopsv1.ResponseFormat{Type: loopsv1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: `{"type":"string","format":"date"}`}},
		"with stop": {MaxTokens: 2, Temperature: 1, StopStrings: []string{"x"}, ResponseFormat: &loopsv1.ResponseFormat{Type: loopsv1.ResponseFormat_TYPE_JSON_OBJECT}},
	} {
		_, err := e.Sample(ctx, &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: toks32(seqA[:3]), Params: p})
		require.Error(t, err, name)
	}
}

// TestStructuredOutputsValidate is the property test: random schemas of the supported
// subset, sampled from the tiny model at temperature 1 with several seeds; every output
// that completed (stop reason stop) parses and validates against its schema
// (santhosh-tekuri/jsonschema), and an output cut by max_tokens is a prefix of one.
func TestStructuredOutputsValidate(t *testing.T) {
	e := engine(t)
	bm, err := e.model(tiny.Name)
	require.NoError(t, err)
	prompt := bm.tok.Encode("Answer in JSON: ")
	completed, total := 0, 0
	for seed := range uint64(12) {
		schema := constraintest.Schema(rand.New(rand.NewPCG(seed, 11)), 2)
		doc, err := jsonschema.UnmarshalJSON(bytes.NewReader(schema))
		require.NoError(t, err)
		c := jsonschema.NewCompiler()
		require.NoError(t, c.AddResource("s.json", doc))
		sch, err := c.Compile("s.json")
		require.NoError(t, err)
		res := sample(t, e, prompt, 4, &loopsv1.SamplingParams{MaxTokens: 200, Temperature: 1, TopP: 1, Seed: seedp(seed),
			ResponseFormat: &loopsv1.ResponseFormat{Type: loopsv1.ResponseFormat_TYPE_JSON_SCHEMA, JsonSchema: string(schema)}}, false, 0)
		for _, s := range res.Sequences {
			total++
			toks := ints(s.Tokens)
			if s.StopReason != loopsv1.StopReason_STOP_REASON_STOP {
				continue
			}
			completed++
			require.Contains(t, bm.eos, toks[len(toks)-1], "a completed output ends on end-of-sequence")
			text := bm.tok.Decode(toks[:len(toks)-1])
			inst, err := jsonschema.UnmarshalJSON(bytes.NewReader([]byte(text)))
			require.NoError(t, err, "schema %s\noutput %q", schema, text)
			require.NoError(t, sch.Validate(inst), "schema %s\noutput %q", schema, text)
		}
	}
	t.Logf("%d of %d outputs completed within max_tokens", completed, total)
	require.GreaterOrEqual(t, completed, total/3)
}
