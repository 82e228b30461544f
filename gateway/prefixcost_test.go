package gateway_test

import (
	"log/slog"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/prices"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestCachedPrefillIsBilled: a prompt sampled twice in one workspace is served from the
// reference engine's prefix cache the second time; the sample reports its cached tokens,
// they are metered as cached prefill and cost the sheet's cached_prefill price (checked
// by hand), on the operation, the usage API, Tinker's billing events and /metrics. Another
// workspace's same prompt is not cached.
func TestCachedPrefillIsBilled(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {prefill: \"0.20\", cached_prefill: \"0.05\", sample: \"0.60\", train: \"0.40\"}\n", time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices = sheet })
	a, b := newCostClient(t, url, keyA), newCostClient(t, url, keyB)

	prompt := make([]int32, 40)
	for i := range prompt {
		prompt[i] = int32(i*7 + 3)
	}
	sample := func(c *costClient) (*loopsv1.Operation, int64) {
		seed := uint64(7)
		op := c.wait(must(c.sampling.Sample(t.Context(), &loopsv1.SampleRequest{
			BaseModel: tiny.Name, Prompt: prompt, NumSamples: 1,
			Params: &loopsv1.SamplingParams{MaxTokens: 4, Temperature: 1, Seed: &seed},
		})))
		return op, int64(len(op.GetSample().GetSequences()[0].GetTokens()))
	}
	first, gen1 := sample(a)
	require.Zero(t, first.GetSample().GetPromptCachedTokens())
	require.Equal(t, sumUSD(t, usd(t, "0.20", 40), usd(t, "0.60", gen1)), first.GetCost().GetUsd())

	second, gen2 := sample(a)
	require.EqualValues(t, 32, second.GetSample().GetPromptCachedTokens(), "two whole blocks of 16 before the last token")
	// by hand: 8 × $0.20 + 32 × $0.05 per million prompt tokens = $0.0000016 + $0.0000016
	require.Equal(t, "0.0000032", sumUSD(t, usd(t, "0.20", 8), usd(t, "0.05", 32)))
	require.Equal(t, sumUSD(t, "0.0000032", usd(t, "0.60", gen2)), second.GetCost().GetUsd())

	other, _ := sample(b)
	require.Zero(t, other.GetSample().GetPromptCachedTokens(), "another workspace's prompt is not served from this one's cache")

	costs := a.costs()
	require.Equal(t, [3]string{"48", "48", usd(t, "0.20", 48)}, costs[loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS])
	require.Equal(t, [3]string{"32", "32", "0.0000016"}, costs[loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS])
	_, cachedB := b.costs()[loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS]
	require.False(t, cachedB)

	var cachedEvents int
	for _, ev := range a.billing() {
		info := ev["event_info"].(map[string]any)
		if info["type"] == "sampling_prefill" && info["cached"] == true {
			cachedEvents++
			require.Equal(t, "32", string(info["token_count"].(interface{ String() string }).String()))
			require.Equal(t, "0.0000016", ev["estimated_cost_usd"].(interface{ String() string }).String())
		}
	}
	require.Equal(t, 1, cachedEvents, "Tinker's billing shows the cached prefill as a cached sampling_prefill event")
	m := scrape(t, url)
	require.InDelta(t, 32, metricValue(t, m, `loops_tokens_total{kind="sample_prompt_cached"}`), 0)
	require.InDelta(t, 120, metricValue(t, m, `loops_tokens_total{kind="sample_prompt"}`), 0)
}
