package gateway_test

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/prices"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/money"
)

// costClient is one workspace's view of a test server, for the cost tests.
type costClient struct {
	t        *testing.T
	url, key string
	training loopsv1connect.TrainingServiceClient
	sampling loopsv1connect.SamplingServiceClient
	ops      loopsv1connect.OperationServiceClient
	usage    loopsv1connect.UsageServiceClient
	run      string
}

func newCostClient(t *testing.T, url, key string) *costClient {
	c := &costClient{t: t, url: url, key: key,
		training: loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey(key)),
		sampling: loopsv1connect.NewSamplingServiceClient(http.DefaultClient, url, withKey(key)),
		ops:      loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey(key)),
		usage:    loopsv1connect.NewUsageServiceClient(http.DefaultClient, url, withKey(key)),
	}
	c.run = c.wait(must(c.training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true},
	}))).GetTrainingRun().GetId()
	return c
}

func (c *costClient) wait(op *loopsv1.Operation) *loopsv1.Operation {
	c.t.Helper()
	for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED && op.GetState() != loopsv1.OperationState_OPERATION_STATE_FAILED {
		op = must(c.ops.WaitOperation(c.t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Second)}))
	}
	require.Equal(c.t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, op.GetState(), op.GetError().GetMessage())
	return op
}

// train runs one forward_backward of n tokens.
func (c *costClient) train(n int) *loopsv1.Operation {
	in, tgt, w := tokens(n)
	return c.wait(must(c.training.ForwardBackward(c.t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: c.run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})))
}

// sample samples 2 sequences of at most 6 tokens after a prompt of 5, and returns the
// operation and the tokens generated.
func (c *costClient) sample() (*loopsv1.Operation, int64) {
	seed := uint64(7)
	op := c.wait(must(c.sampling.Sample(c.t.Context(), &loopsv1.SampleRequest{
		BaseModel: tiny.Name, Prompt: []int32{10, 20, 30, 40, 50}, NumSamples: 2,
		Params: &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 1, Seed: &seed},
	})))
	var generated int64
	for _, s := range op.GetSample().GetSequences() {
		generated += int64(len(s.GetTokens()))
	}
	require.Positive(c.t, generated)
	return op, generated
}

// costs sums the workspace's usage by kind: amounts, priced amounts and costs (exactly).
func (c *costClient) costs() map[loopsv1.UsageKind][3]string {
	c.t.Helper()
	type acc struct {
		amount, priced int64
		cost           money.USD
		anyCost        bool
	}
	sums := map[loopsv1.UsageKind]*acc{}
	for _, b := range must(c.usage.GetUsage(c.t.Context(), &loopsv1.GetUsageRequest{})).GetBuckets() {
		a := sums[b.GetKind()]
		if a == nil {
			a = &acc{}
			sums[b.GetKind()] = a
		}
		a.amount += b.GetAmount()
		a.priced += b.GetPricedAmount()
		if b.GetCostUsd() != "" {
			v := must(money.ParseUSD(b.GetCostUsd(), money.Digits))
			a.cost = must(money.Add(a.cost, v))
			a.anyCost = true
		} else {
			require.Zero(c.t, b.GetPricedAmount(), "no cost, nothing priced")
		}
	}
	out := map[loopsv1.UsageKind][3]string{}
	for k, a := range sums {
		cost := "none"
		if a.anyCost {
			cost = a.cost.String()
		}
		out[k] = [3]string{itoa(a.amount), itoa(a.priced), cost}
	}
	return out
}

func itoa(n int64) string { return strconv.FormatInt(n, 10) }

// billing reads Tinker's billing route: each event's type, count, cost and rate.
func (c *costClient) billing() []map[string]any {
	c.t.Helper()
	req := must(http.NewRequestWithContext(c.t.Context(), http.MethodGet, c.url+"/api/v1/billing/usage/events", nil))
	req.Header.Set("X-API-Key", c.key)
	resp := must(http.DefaultClient.Do(req))
	defer resp.Body.Close()
	require.Equal(c.t, http.StatusOK, resp.StatusCode)
	dec := json.NewDecoder(resp.Body)
	dec.UseNumber() // the costs are exact decimals: read them as written
	var body struct {
		Data []map[string]any `json:"data"`
	}
	require.NoError(c.t, dec.Decode(&body))
	return body.Data
}

// usd is n tokens at a price in USD per million tokens, by hand: price × n / 1e6.
func usd(t *testing.T, price string, n int64) string {
	p := must(money.ParseUSD(price, 6))
	return must(money.MulDiv(p, n, 1_000_000)).String()
}

func sumUSD(t *testing.T, xs ...string) string {
	var s money.USD
	for _, x := range xs {
		s = must(money.Add(s, must(money.ParseUSD(x, money.Digits))))
	}
	return s.String()
}

func writeSheet(t *testing.T, file, body string, age time.Duration) {
	t.Helper()
	require.NoError(t, os.WriteFile(file, []byte(body), 0o600))
	at := time.Now().Add(-age)
	require.NoError(t, os.Chtimes(file, at, at))
}

// TestCostUnderAPriceSheet trains and samples in two workspaces under a price sheet (one
// with its own training price) and checks every cost reported (each operation's, a step's,
// the usage API's, Tinker's billing route's, /metrics') against a hand computation; then
// reloads the sheet with new prices: new work is priced with them, past work keeps its.
func TestCostUnderAPriceSheet(t *testing.T) {
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
	v1 := sheet.Current().Version()
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices = sheet })
	a, b := newCostClient(t, url, keyA), newCostClient(t, url, keyB)

	fbA := a.train(12)
	require.Equal(t, &loopsv1.OperationCost{Usd: usd(t, "0.40", 12), PriceVersions: []string{v1}}, fbA.GetCost())
	require.Equal(t, "0.0000048", fbA.GetCost().GetUsd()) // 12 × $0.40 / 1e6
	fbB := b.train(12)
	require.Equal(t, "0.0000012", fbB.GetCost().GetUsd(), "team-b's own training price: 12 × $0.10 / 1e6")

	sA, genA := a.sample()
	wantSample := sumUSD(t, usd(t, "0.20", 5), usd(t, "0.60", genA))
	require.Equal(t, &loopsv1.OperationCost{Usd: wantSample, PriceVersions: []string{v1}}, sA.GetCost())
	sB, genB := b.sample()
	require.Equal(t, sumUSD(t, usd(t, "0.20", 5), usd(t, "0.60", genB)), sB.GetCost().GetUsd(), "team-b pays the sheet's sampling prices")

	steps := must(a.training.GetTrainingRunMetrics(t.Context(), &loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: a.run})).GetSteps()
	require.Len(t, steps, 1)
	require.Equal(t, "0.0000048", steps[0].GetCostUsd(), "the step's cost")

	require.Equal(t, map[loopsv1.UsageKind][3]string{
		loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS:         {"12", "12", "0.0000048"},
		loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS: {"5", "5", usd(t, "0.20", 5)},
		loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:  {itoa(genA), itoa(genA), usd(t, "0.60", genA)},
	}, a.costs())
	require.Equal(t, "0.0000012", b.costs()[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS][2])
	for _, bk := range must(a.usage.GetUsage(t.Context(), &loopsv1.GetUsageRequest{})).GetBuckets() {
		require.Equal(t, auth.KeyIDOf(keyA), bk.GetKeyId(), "usage is kept under the key that did the work: %v", bk)
	}

	billed := map[string][2]string{}
	for _, ev := range a.billing() {
		info := ev["event_info"].(map[string]any)
		billed[info["type"].(string)] = [2]string{string(ev["estimated_cost_usd"].(json.Number)), string(ev["effective_rate_usd_per_million_tokens"].(json.Number))}
	}
	require.Equal(t, map[string][2]string{
		"training":         {"0.0000048", "0.4"},
		"sampling_prefill": {usd(t, "0.20", 5), "0.2"},
		"sampling_sample":  {usd(t, "0.60", genA), "0.6"},
	}, billed)

	want := must(json.Number(sumUSD(t, "0.0000012", sB.GetCost().GetUsd())).Float64())
	require.InDelta(t, want, metricValue(t, scrape(t, url), `loops_cost_usd_total{workspace="team-b"}`), want*1e-12, "a float, for dashboards")

	// Reload with new prices: new work is priced with them, past work is not repriced.
	writeSheet(t, file, "models:\n  loops/tiny: {prefill: \"0.20\", sample: \"0.60\", train: \"0.80\"}\n", 0)
	sheet.Poll()
	v2 := sheet.Current().Version()
	require.NotEqual(t, v1, v2)
	fb2 := a.train(12)
	require.Equal(t, &loopsv1.OperationCost{Usd: "0.0000096", PriceVersions: []string{v2}}, fb2.GetCost())
	require.Equal(t, "0.0000096", b.train(12).GetCost().GetUsd(), "team-b's override is gone from the new sheet")
	require.Equal(t, "0.0000012", must(b.ops.GetOperation(t.Context(), &loopsv1.GetOperationRequest{Id: fbB.GetId()})).GetCost().GetUsd(), "a past operation keeps its cost")
	require.Equal(t, "0.0000048", must(a.ops.GetOperation(t.Context(), &loopsv1.GetOperationRequest{Id: fbA.GetId()})).GetCost().GetUsd())
	require.Equal(t, [3]string{"24", "24", "0.0000144"}, a.costs()[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS], "4.8 µ$ under the first sheet + 9.6 µ$ under the second")
	require.Equal(t, "0.0000108", b.costs()[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS][2], "team-b: 1.2 µ$ + 12 × $0.80 / 1e6")
}

// TestNoPriceSheetNoCost: without a price sheet no cost is shown anywhere: no operation
// cost, no bucket cost, null costs on Tinker's billing route, no cost series on /metrics.
func TestNoPriceSheetNoCost(t *testing.T) {
	url := startServer(t)
	a := newCostClient(t, url, keyA)
	require.Nil(t, a.train(12).GetCost())
	op, _ := a.sample()
	require.Nil(t, op.GetCost())
	for _, c := range a.costs() {
		require.Equal(t, "none", c[2])
	}
	for _, ev := range a.billing() {
		require.Nil(t, ev["estimated_cost_usd"])
		require.Nil(t, ev["effective_rate_usd_per_million_tokens"])
	}
	steps := must(a.training.GetTrainingRunMetrics(t.Context(), &loopsv1.GetTrainingRunMetricsRequest{TrainingRunId: a.run})).GetSteps()
	require.Empty(t, steps[0].GetCostUsd())
	require.NotContains(t, scrape(t, url), "loops_cost_usd_total{")
}

func scrape(t *testing.T, url string) string {
	t.Helper()
	resp := must(http.Get(url + "/metrics"))
	defer resp.Body.Close()
	return string(must(io.ReadAll(resp.Body)))
}

// metricValue is the value of the series named (with its labels) in a /metrics page.
func metricValue(t *testing.T, page, series string) float64 {
	t.Helper()
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, series+" "); ok {
			return must(strconv.ParseFloat(v, 64))
		}
	}
	t.Fatalf("no %s in /metrics", series)
	return 0
}
