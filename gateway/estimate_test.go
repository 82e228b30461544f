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
	var sampled, trained int64 // what a pilot counts on the client
	for range 2 {
		op, _ := b.sample()
		for _, s := range op.GetSample().GetSequences() {
			b.train(5 + len(s.GetTokens()) - 1)
			sampled += int64(len(s.GetTokens()))
			trained += int64(5 + len(s.GetTokens()) - 1)
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

	// The same run as a pilot counts it on the client (each request's prompt once, every
	// sampled token, each datum's model input), given as usage: exactly the metered cost.
	est = must(b.usage.EstimateCost(t.Context(), &loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS, Amount: 2 * 5},
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: sampled},
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: trained, AmountLow: trained - 1, AmountHigh: trained + 1},
	}}))
	require.Equal(t, metered.String(), est.GetTotalUsd(), "the pilot's counts priced are the metered cost")
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

	train := loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS
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
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Steps: 1, Usage: []*loopsv1.UsageEstimate{{Kind: train, Amount: 3}}}, "set it with base_model only"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{{Kind: train, Amount: 3}, {Kind: train, Amount: 4}}}, "appears twice"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{{Kind: loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS, Amount: 3}}}, "want a token kind"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{{Kind: train, Amount: 3, AmountLow: 4, AmountHigh: 5}}}, "amount_low <= amount <= amount_high"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{{Kind: train, Amount: -3}}}, "usage[0].amount is -3"},
		{&loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{{Kind: train, Amount: 3, CostUsd: "1"}}}, "leave the costs empty"},
	} {
		_, err := u.EstimateCost(t.Context(), tc.req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), tc.want)
		require.ErrorContains(t, err, tc.want)
	}
}

// TestEstimateGivenUsage: tokens by kind that a caller extrapolated (a pilot) are priced as
// given, each line and the total with its band, in UsageKind order; cached prefill at its
// own price, and a line without a band is its own band.
func TestEstimateGivenUsage(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, `
models:
  loops/tiny: {prefill: "0.20", cached_prefill: "0.05", sample: "0.60", train: "0.40"}
`, time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices = sheet })
	u := newCostClient(t, url, keyA).usage
	est := must(u.EstimateCost(t.Context(), &loopsv1.EstimateCostRequest{BaseModel: tiny.Name, Usage: []*loopsv1.UsageEstimate{
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: 3000, AmountLow: 2500, AmountHigh: 3600},
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS, Amount: 700, AmountLow: 600, AmountHigh: 800},
		{Kind: loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, Amount: 10_000, AmountLow: 9000, AmountHigh: 12_000},
		{Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS, Amount: 2000},
	}}))
	line := func(kind loopsv1.UsageKind, price string, n, lo, hi int64) *loopsv1.UsageEstimate {
		return &loopsv1.UsageEstimate{Kind: kind, Amount: n, CostUsd: usd(t, price, n), AmountLow: lo, AmountHigh: hi,
			CostLowUsd: usd(t, price, lo), CostHighUsd: usd(t, price, hi)}
	}
	require.Empty(t, cmpProto(&loopsv1.EstimateCostResponse{
		Usage: []*loopsv1.UsageEstimate{
			line(loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, "0.40", 10_000, 9000, 12_000),
			line(loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS, "0.20", 2000, 2000, 2000),
			line(loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, "0.60", 3000, 2500, 3600),
			line(loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS, "0.05", 700, 600, 800),
		},
		// 0.004 + 0.0004 + 0.0018 + 0.000035; low 0.0036 + 0.0004 + 0.0015 + 0.00003;
		// high 0.0048 + 0.0004 + 0.00216 + 0.00004
		TotalUsd: "0.006235", TotalLowUsd: "0.00553", TotalHighUsd: "0.0074", PriceVersion: sheet.Current().Version(),
	}, est))
}
