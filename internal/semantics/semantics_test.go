package semantics_test

import (
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"testing"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/loops-dev/loops/conformance/oracle"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
)

func TestAdamWithDefaults(t *testing.T) {
	require.Nil(t, semantics.AdamWithDefaults(nil))

	zero := &loopsv1.AdamParams{LearningRate: 0.01, WeightDecay: 0.1}
	got := semantics.AdamWithDefaults(zero)
	require.Empty(t, cmp.Diff(&loopsv1.AdamParams{LearningRate: 0.01, WeightDecay: 0.1, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}, got, protocmp.Transform()))
	require.Zero(t, zero.GetBeta1(), "the caller's message is not changed")

	set := &loopsv1.AdamParams{LearningRate: 0.01, Beta2: 0.99}
	require.Same(t, set, semantics.AdamWithDefaults(set), "one of the three set: nothing is filled")
}

func TestLossConfig(t *testing.T) {
	c, ok := semantics.LossConfig("ppo")
	require.True(t, ok)
	require.Equal(t, map[string]float64{"clip_low_threshold": 0.8, "clip_high_threshold": 1.2}, c)
	c["clip_low_threshold"] = 0
	c, _ = semantics.LossConfig("ppo")
	require.InDelta(t, 0.8, c["clip_low_threshold"], 0, "each call returns a new map")

	c, ok = semantics.LossConfig("dro")
	require.True(t, ok)
	require.Equal(t, map[string]float64{"beta": 0.05}, c)
	c, ok = semantics.LossConfig("gspo")
	require.True(t, ok)
	require.Equal(t, map[string]float64{"clip_low_threshold": 0.9997, "clip_high_threshold": 1.0004}, c)
	_, ok = semantics.LossConfig("stable_reinforce")
	require.False(t, ok, "refused, with semantics.UnsupportedLosses' reason")
	require.Contains(t, semantics.UnsupportedLosses["stable_reinforce"], "not supported")
	c, ok = semantics.LossConfig("cross_entropy")
	require.True(t, ok)
	require.Empty(t, c)
	_, ok = semantics.LossConfig("nope")
	require.False(t, ok)
}

// TestOracleAgrees pins the conformance oracle's loss defaults, written independently, to
// these.
func TestOracleAgrees(t *testing.T) {
	require.InDelta(t, semantics.DefaultClipLowThreshold, oracle.DefaultClipLow, 0)
	require.InDelta(t, semantics.DefaultClipHighThreshold, oracle.DefaultClipHigh, 0)
	require.InDelta(t, semantics.DefaultDROBeta, oracle.DefaultDROBeta, 0)
	require.InDelta(t, semantics.DefaultGSPOClipLowThreshold, oracle.DefaultGSPOClipLow, 0)
	require.InDelta(t, semantics.DefaultGSPOClipHighThreshold, oracle.DefaultGSPOClipHigh, 0)
}

// TestPythonWorkerAgrees checks the Python worker's copies of the defaults and limits, which
// cannot import this package.
func TestPythonWorkerAgrees(t *testing.T) {
	dir := filepath.Join("..", "..", "backends", "torch", "loops_worker")
	read := func(name string) string {
		b, err := os.ReadFile(filepath.Join(dir, name))
		require.NoError(t, err)
		return string(b)
	}
	number := func(src, pattern string) []float64 {
		m := regexp.MustCompile(pattern).FindStringSubmatch(src)
		require.NotNil(t, m, "pattern %q not found", pattern)
		var out []float64
		for _, s := range m[1:] {
			f, err := strconv.ParseFloat(s, 64)
			require.NoError(t, err)
			out = append(out, f)
		}
		return out
	}
	engine, sampler := read("engine.py"), read("sampler.py")
	require.Equal(t, []float64{semantics.DefaultClipLowThreshold}, number(engine, `(?m)^DEFAULT_CLIP_LOW = (\S+)$`))
	require.Equal(t, []float64{semantics.DefaultClipHighThreshold}, number(engine, `(?m)^DEFAULT_CLIP_HIGH = (\S+)$`))
	require.Equal(t, []float64{semantics.DefaultDROBeta}, number(engine, `(?m)^DEFAULT_DRO_BETA = (\S+)$`))
	require.Equal(t, []float64{semantics.DefaultGSPOClipLowThreshold}, number(engine, `(?m)^DEFAULT_GSPO_CLIP_LOW = (\S+)$`))
	require.Equal(t, []float64{semantics.DefaultGSPOClipHighThreshold}, number(engine, `(?m)^DEFAULT_GSPO_CLIP_HIGH = (\S+)$`))
	for _, k := range []string{"clip_low_threshold", "clip_high_threshold", "beta"} {
		lo, hi := semantics.LossConfigRange(k)
		require.Equal(t, []float64{lo, hi}, number(engine, `"`+k+`": \((\S+), (\S+)\)`), "LOSS_CONFIG_RANGE[%q]", k)
	}
	require.Equal(t, []float64{semantics.DefaultBeta1, semantics.DefaultBeta2, semantics.DefaultEps},
		number(engine, `b1, b2, eps = (\S+), (\S+), (\S+)\n`))
	require.Equal(t, []float64{semantics.MaxNumSamples}, number(sampler, `(?m)^MAX_SAMPLES = (\S+)$`))
	require.GreaterOrEqual(t, number(sampler, `(?m)^MAX_TOPK_PROMPT_LOGPROBS = (\S+)$`)[0], float64(semantics.MaxTopKPromptLogprobs))
	adj := read("adjust.py")
	require.Equal(t, []float64{semantics.MaxLogitBias}, number(adj, `(?m)^MAX_LOGIT_BIAS = (\S+)$`))
	require.Equal(t, []float64{semantics.MaxLogitBiasEntries}, number(adj, `(?m)^MAX_LOGIT_BIAS_ENTRIES = (\S+)$`))
	require.Equal(t, []float64{semantics.MaxPenalty}, number(adj, `(?m)^MAX_PENALTY = (\S+)$`))
}
