package evals

import (
	"context"
	"math"
	"testing"

	"github.com/stretchr/testify/require"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// tableModel scores token t after any context as logp[t] (a unigram model), and generates
// gen.
type tableModel struct {
	logp map[int32]float64
	gen  []int32
}

func (m tableModel) Logprobs(_ context.Context, tokens []int32, n int) ([]float64, error) {
	out := make([]float64, n)
	for i, t := range tokens[len(tokens)-n:] {
		out[i] = m.logp[t]
	}
	return out, nil
}

func (m tableModel) Generate(_ context.Context, _ []int32, maxTokens int) ([]int32, error) {
	return m.gen[:min(len(m.gen), maxTokens)], nil
}

// byteTok is one token per byte.
type byteTok struct{}

func (byteTok) Encode(s string) []int32 {
	out := make([]int32, len(s))
	for i := range len(s) {
		out[i] = int32(s[i])
	}
	return out
}

func (byteTok) Decode(ts []int32) string {
	b := make([]byte, len(ts))
	for i, t := range ts {
		b[i] = byte(t)
	}
	return string(b)
}

func TestScoreNLL(t *testing.T) {
	m := tableModel{logp: map[int32]float64{'a': -0.5, 'b': -2, 1: -1}}
	rows, err := Decode(nllSpec, []byte("{\"prompt\": \"z\", \"completion\": \"ab\"}\n{\"prompt\": [9], \"completion\": [1, 1, 1]}"))
	require.NoError(t, err)
	r, err := Score(t.Context(), &loopsv1.Eval{Kind: loopsv1.EvalKind_EVAL_KIND_NLL}, rows, byteTok{}, m, Options{Parallel: 2})
	require.NoError(t, err)
	want := (0.5 + 2 + 3) / 5.0 // summed over the 5 completion tokens
	require.InDelta(t, want, r.Score, 1e-12)
	require.InDelta(t, math.Exp(want), r.Metrics["perplexity"], 1e-12)
	require.Equal(t, int64(2), r.N)
	require.InDelta(t, 5.0, r.Metrics["tokens"], 0)

	_, err = Score(t.Context(), &loopsv1.Eval{Kind: loopsv1.EvalKind_EVAL_KIND_NLL}, rows, byteTok{}, m, Options{MaxSeqLen: 3})
	require.ErrorContains(t, err, "row 2: prompt and continuation are 4 tokens, more than the model's 3")
}

func TestScoreMultipleChoice(t *testing.T) {
	// "bb" sums to -4, "a" to -0.5, "aaa" to -1.5: the best is "a" (the choice's summed
	// log-prob, not its mean, decides).
	m := tableModel{logp: map[int32]float64{'a': -0.5, 'b': -2}}
	rows, err := Decode(mcSpec, []byte("{\"prompt\": \"q\", \"choices\": [\"bb\", \"a\", \"aaa\"], \"answer\": 1}\n{\"prompt\": \"q\", \"choices\": [\"a\", \"b\"], \"answer\": 1}"))
	require.NoError(t, err)
	r, err := Score(t.Context(), &loopsv1.Eval{Kind: loopsv1.EvalKind_EVAL_KIND_MULTIPLE_CHOICE}, rows, byteTok{}, m, Options{})
	require.NoError(t, err)
	require.InDelta(t, 0.5, r.Score, 0)
	require.InDelta(t, 0.5, r.Metrics["accuracy"], 0)
}

func TestScoreGeneration(t *testing.T) {
	m := tableModel{gen: byteTok{}.Encode(" 42\nmore")}
	for _, tc := range []struct {
		match  loopsv1.EvalMatch
		target string
		stop   []string
		want   float64
	}{
		{loopsv1.EvalMatch_EVAL_MATCH_EXACT, "42", []string{"\n"}, 1},
		{loopsv1.EvalMatch_EVAL_MATCH_EXACT, "42", nil, 0},
		{loopsv1.EvalMatch_EVAL_MATCH_CONTAINS, "more", nil, 1},
		{loopsv1.EvalMatch_EVAL_MATCH_CONTAINS, "more", []string{"\n"}, 0},
		{loopsv1.EvalMatch_EVAL_MATCH_REGEX, `^\s*\d+$`, []string{"\n"}, 1},
	} {
		spec := Spec{Kind: loopsv1.EvalKind_EVAL_KIND_GENERATION, Match: tc.match}
		rows, err := Decode(spec, []byte(`{"prompt": "q", "target": "`+jsonEscape(tc.target)+`"}`))
		require.NoError(t, err)
		e := &loopsv1.Eval{Kind: spec.Kind, Match: tc.match, Stop: tc.stop, MaxTokens: 32}
		r, err := Score(t.Context(), e, rows, byteTok{}, m, Options{})
		require.NoError(t, err)
		require.InDelta(t, tc.want, r.Score, 0, "%v %q", tc.match, tc.target)
		require.InDelta(t, 8.0, r.Metrics["mean_generated_tokens"], 0)
	}
}

func jsonEscape(s string) string {
	out := ""
	for _, c := range s {
		if c == '\\' || c == '"' {
			out += `\`
		}
		out += string(c)
	}
	return out
}

func TestScoreReward(t *testing.T) {
	m := tableModel{gen: byteTok{}.Encode("yes!\nno")}
	spec := Spec{Kind: loopsv1.EvalKind_EVAL_KIND_REWARD}
	rows, err := Decode(spec, []byte("{\"prompt\": \"q1\", \"info\": {\"want\": \"yes!\"}}\n{\"prompt\": [65]}"))
	require.NoError(t, err)
	e := &loopsv1.Eval{Kind: spec.Kind, Stop: []string{"\n"}, MaxTokens: 16}
	var got []RewardInput
	r, err := Score(t.Context(), e, rows, byteTok{}, m, Options{Reward: func(_ context.Context, in []RewardInput) ([]float64, error) {
		got = in
		return []float64{1, -0.5}, nil
	}})
	require.NoError(t, err)
	require.Equal(t, []RewardInput{{Prompt: "q1", Completion: "yes!", Info: []byte(`{"want": "yes!"}`)}, {Prompt: "A", Completion: "yes!"}}, got)
	require.InDelta(t, 0.25, r.Score, 0)
	require.InDelta(t, -0.5, r.Metrics["min_reward"], 0)
	_, err = Score(t.Context(), e, rows, byteTok{}, m, Options{Reward: func(context.Context, []RewardInput) ([]float64, error) {
		return []float64{1, math.NaN()}, nil
	}})
	require.ErrorContains(t, err, "row 2: the reward is not a finite number")
	_, err = Decode(nllSpec, []byte(`{"prompt": "a", "completion": "b", "info": 1}`))
	require.ErrorContains(t, err, `"info" belongs to reward rows only`)
}
