package gateway_test

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/prices"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// TestEstimateMatchesTheMeteredRun runs a small SFT run and a small RL run (sample a group,
// train on each sample) under a price sheet, then checks that EstimateCost, given the
// runs' token counts and settings, equals what was metered: exactly for SFT, and for RL
// within ±10% (its completions may stop before max_tokens; the estimate is an upper bound).
// A workspace's own prices are used for its estimates.
func TestEstimateMatchesTheMeteredRun(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, `
models:
  loops/tiny: {prefill: "0.20", sample: "0.60", train: "0.40"}
workspaces:
  team-b:
    models:
      loops/tiny: {train: "0.10"}
`, time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices = sheet })

	// SFT in team-a: 3 steps of batch 2 over examples of 12, 9 and 7 tokens (cycled).
	a := newCostClient(t, url, keyA)
	examples := []int64{12, 9, 7}
	for i := range 3 * 2 {
		a.train(int(examples[i%len(examples)]))
	}
	est := must(a.usage.EstimateCost(t.Context(), &loopsv1.EstimateCostRequest{
		BaseModel: tiny.Name, Steps: 3, BatchSize: 2, ExampleTokens: examples,
	}))
	train := int64(12 + 9 + 7 + 12 + 9 + 7)
	require.Empty(t, cmpProto(&loopsv1.EstimateCostResponse{
		Usage:    []*loopsv1.UsageEstimate{{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: train, CostUsd: usd(t, "0.40", train)}},
		TotalUsd: usd(t, "0.40", train), PriceVersion: sheet.Current().Version(),
	}, est))
	require.Equal(t, a.costs()[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS][2], est.GetTotalUsd(), "SFT: the estimate is the metered cost")

	// RL in team-b: 2 steps of 1 prompt of 5 tokens, a group of 2 samples of at most 6
	// tokens, each sample trained on as prompt + completion less one.
	b := newCostClient(t, url, keyB)
	for range 2 {
		op, _ := b.sample()
		for _, s := range op.GetSample().GetSequences() {
			b.train(5 + len(s.GetTokens()) - 1)
		}
	}
	est = must(b.usage.EstimateCost(t.Context(), &loopsv1.EstimateCostRequest{
		BaseModel: tiny.Name, Steps: 2, BatchSize: 1, PromptTokens: []int64{5}, GroupSize: 2, CompletionTokens: 6,
	}))
	require.Empty(t, cmpProto(&loopsv1.EstimateCostResponse{Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 2 * 2 * (5 + 6 - 1), CostUsd: usd(t, "0.10", 40)},
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS, Amount: 10, CostUsd: usd(t, "0.20", 10)},
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: 24, CostUsd: usd(t, "0.60", 24)},
	}, TotalUsd: sumUSD(t, usd(t, "0.10", 40), usd(t, "0.20", 10), usd(t, "0.60", 24)), PriceVersion: sheet.Current().Version()}, est), "team-b's own training price")
	var metered money.USD
	for _, c := range b.costs() {
		metered = must(money.Add(metered, must(money.ParseUSD(c[2], money.Digits))))
	}
	estimated := must(money.ParseUSD(est.GetTotalUsd(), money.Digits))
	ratio := float64(estimated) / float64(metered)
	t.Logf("RL: estimated %s, metered %s, ratio %.3f", estimated, metered, ratio)
	require.InDelta(t, 1, ratio, 0.10, "estimated %s, metered %s", estimated, metered)
}

// TestEstimateErrors: no price sheet is a FailedPrecondition naming the flag; bad requests
// are InvalidArgument saying what to fix.
func TestEstimateErrors(t *testing.T) {
	url := startServer(t)
	u := newCostClient(t, url, keyA).usage
	_, err := u.EstimateCost(t.Context(), &loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1, ExampleTokens: []int64{3}})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "no prices are configured")
	require.ErrorContains(t, err, "--prices")

	for _, tc := range []struct {
		req  *loopsv1.EstimateCostRequest
		want string
	}{
		{&loopsv1.EstimateCostRequest{Steps: 1, BatchSize: 1, ExampleTokens: []int64{3}}, "base_model is required"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, BatchSize: 1, ExampleTokens: []int64{3}}, "steps is 0; it must be from 1 to 1000000"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1}, "set example_tokens"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1, ExampleTokens: []int64{3}, PromptTokens: []int64{3}}, "not both"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1, ExampleTokens: []int64{3, -1}}, "example_tokens[1] is -1"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1, PromptTokens: []int64{3}, GroupSize: 5000}, "group_size is 5000"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1, ExampleTokens: []int64{3}, GroupSize: 4}, "describe RL sampling"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, BatchSize: 1, ExampleTokens: make([]int64, 100_001)}, "at most 100000"},
	} {
		_, err := u.EstimateCost(t.Context(), tc.req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), tc.want)
		require.ErrorContains(t, err, tc.want)
	}
}
