package prices_test

import (
	"log/slog"
	"math/big"
	"math/rand/v2"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/money"
)

const sheetYAML = `
models:
  m:
    prefill: "0.20"
    cached_prefill: 0.05
    sample: "0.6"
    train: 0.400001
  "*": {sample: "1"}
storage_gb_month: "0.031"
gpu_hour:
  "*": "2.50"
  H100: 3
workspaces:
  team-a:
    models:
      m: {sample: "0.45"}
    gpu_hour: {"*": "1.25"}
`

var loaded = time.Date(2026, 12, 6, 8, 0, 0, 0, time.UTC)

func cost(t *testing.T, s *prices.Sheet, ws, model, kind, gpu string, n int64) string {
	t.Helper()
	c, ok, err := s.Cost(ws, model, kind, gpu, n)
	require.NoError(t, err)
	if !ok {
		return "none"
	}
	return c.String()
}

// TestCost checks each kind's cost against a hand computation, the "*" entries, a
// workspace's own prices field by field, and usage the sheet does not price.
func TestCost(t *testing.T) {
	s, err := prices.Parse([]byte(sheetYAML), loaded)
	require.NoError(t, err)
	for _, c := range []struct {
		ws, model, kind, gpu string
		n                    int64
		want                 string
	}{
		{"x", "m", store.UsageSamplingPrefill, "", 1000, "0.0002"},              // 1000 × 0.20/1e6
		{"x", "m", prices.UsageCachedPrefill, "", 3, "0.00000015"},              // 3 × 0.05/1e6
		{"x", "m", store.UsageSamplingSample, "", 7, "0.0000042"},               // 7 × 0.6/1e6
		{"x", "m", store.UsageTraining, "", 1_000_000, "0.400001"},              // exactly the price
		{"x", "m", store.UsageTraining, "", 1, "0.000000400001"},                // one token: 0.400001 µ$
		{"x", "other", store.UsageSamplingSample, "", 2, "0.000002"},            // "*" model
		{"x", "other", store.UsageTraining, "", 2, "none"},                      // "*" has no train price
		{"team-a", "m", store.UsageSamplingSample, "", 7, "0.00000315"},         // own: 7 × 0.45/1e6
		{"team-a", "m", store.UsageSamplingPrefill, "", 1000, "0.0002"},         // not overridden
		{"x", "m", store.UsageDedicatedGPUSeconds, "A10", 3600, "2.5"},          // "*" GPU
		{"x", "m", store.UsageDedicatedGPUSeconds, "H100", 1, "0.000833333333"}, // 3/3600 = 0.000833333333|33
		{"x", "m", store.UsageDedicatedGPUSeconds, "", 2, "0.001388888889"},     // 5/3600 = 0.001388888888|89, up
		{"team-a", "m", store.UsageDedicatedGPUSeconds, "H100", 3600, "1.25"},   // the workspace's list first, its "*" included
		{"x", "m", store.UsageCheckpoint, "", 5, "none"},
		{"x", "", store.UsageCheckpointByteSeconds, "", 1e9 * 730 * 3600, "0.031"},      // a GB for 730 h: the GB-month price
		{"x", "", store.UsageCheckpointByteSeconds, "", 1e9 * 3600, "0.000042465753"},   // a GB-hour: 0.031/730 = 0.000042465753|42
		{"x", "", store.UsageCheckpointByteSeconds, "", 12345 * 15, "0.000000000002"},   // 2.18 pico, rounded
		{"team-a", "", store.UsageCheckpointByteSeconds, "", 1e9 * 730 * 3600, "0.031"}, // not overridden
		{"x", "m", store.UsageDedicatedReplicaSeconds, "", 5, "none"},
		{"x", "m", store.UsageSamplingSample, "", 0, "0"},
	} {
		require.Equal(t, c.want, cost(t, s, c.ws, c.model, c.kind, c.gpu, c.n), "%+v", c)
	}
	require.Regexp(t, `^sha256:[0-9a-f]{12}@2026-12-06T08:00:00Z$`, s.Version())

	var none *prices.Sheet
	require.Equal(t, "none", cost(t, none, "x", "m", store.UsageSamplingSample, "", 7), "no sheet, no cost")
	require.Empty(t, none.Version())
}

// TestParseErrors: a bad sheet is refused with the line or field that is wrong.
func TestParseErrors(t *testing.T) {
	for _, c := range []struct{ in, want string }{
		{"models:\n  m:\n    sample: abc\n", `line 3: "abc" is not a decimal number`},
		{"models:\n  m:\n    sample: \"0.0000001\"\n", "line 3: \"0.0000001\" has more than 6 decimal places"},
		{"models:\n  m:\n    sample: -1\n", "line 3: \"-1\": a price may not be negative"},
		{"models:\n  m:\n    smaple: 1\n", "line 3: field smaple not found"},
		{"gpu_hour: {H100: true}\n", "line 1: want a price"},
		{"workspaces:\n  \"bad name\": {}\n", `workspaces: "bad name" is not a workspace name`},
		{"models: [\n", "line 1"},
		{"a: 1\n---\nb: 2\n", "field a not found"},
		{"models: {}\n---\nmodels: {}\n", "more than one YAML document"},
		{"storage_gb_month: 99999999\n", "overflows"},
	} {
		_, err := prices.Parse([]byte(c.in), loaded)
		require.ErrorContains(t, err, c.want, c.in)
	}
	s, err := prices.Parse([]byte(`{"models": {"m": {"sample": 0.5}}}`), loaded)
	require.NoError(t, err, "JSON is accepted")
	require.Equal(t, "0.0000005", cost(t, s, "x", "m", store.UsageSamplingSample, "", 1))
	s, err = prices.Parse(nil, loaded)
	require.NoError(t, err, "an empty sheet prices nothing")
	require.Equal(t, "none", cost(t, s, "x", "m", store.UsageSamplingSample, "", 1))
}

// TestCostOverflow: a cost past what a USD holds is an error, never a wrapped number.
func TestCostOverflow(t *testing.T) {
	_, _, err := mustParse(t, "models: {m: {sample: \"1000000\"}}").Cost("x", "m", store.UsageSamplingSample, "", 1<<40)
	require.ErrorIs(t, err, money.ErrOverflow)
}

func mustParse(t *testing.T, in string) *prices.Sheet {
	t.Helper()
	s, err := prices.Parse([]byte(in), loaded)
	require.NoError(t, err)
	return s
}

// TestMillionsOfOperationsSumExactly prices 2 million operations of random sizes and kinds,
// sums their costs as USD, and checks the sum against exact rational arithmetic on the
// prices as written (what a float64 sum drifts from).
func TestMillionsOfOperationsSumExactly(t *testing.T) {
	s := mustParse(t, "models: {m: {prefill: \"0.123457\", sample: \"1.999999\", train: \"0.3\"}}\ngpu_hour: {\"*\": \"2.71\"}\n")
	kinds := []struct {
		kind  string
		price string
		float float64
		per   int64
	}{
		{store.UsageSamplingPrefill, "0.123457", 0.123457, 1_000_000},
		{store.UsageSamplingSample, "1.999999", 1.999999, 1_000_000},
		{store.UsageTraining, "0.3", 0.3, 1_000_000},
	}
	rng := rand.New(rand.NewPCG(1, 2))
	var sum money.USD
	var float float64
	tokens := make([]int64, len(kinds)) // per kind, for the exact sum
	for range 2_000_000 {
		i := rng.IntN(len(kinds))
		n := rng.Int64N(100_000)
		c, ok, err := s.Cost("x", "m", kinds[i].kind, "", n)
		if err == nil && ok {
			sum, err = money.Add(sum, c)
		}
		if err != nil || !ok {
			t.Fatalf("pricing %d: %v, %v", n, ok, err)
		}
		tokens[i] += n
		float += float64(n) * kinds[i].float / 1e6
	}
	exact := new(big.Rat)
	for i, k := range kinds {
		p, _ := new(big.Rat).SetString(k.price)
		exact.Add(exact, p.Mul(p, big.NewRat(tokens[i], k.per)))
	}
	got, _ := new(big.Rat).SetString(sum.String())
	require.Zero(t, got.Cmp(exact), "sum %s, exact %s", sum, exact.FloatString(12))
	t.Logf("2e6 operations: %s USD exact; a float64 sum gives %.12f", sum, float)
}

// TestHotReload: a changed file is priced for new work; a bad change is refused and the
// sheet in force kept; fixing it loads it.
func TestHotReload(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	write := func(body string, age time.Duration) {
		require.NoError(t, os.WriteFile(file, []byte(body), 0o600))
		at := time.Now().Add(-age)
		require.NoError(t, os.Chtimes(file, at, at))
	}
	write("models: {m: {sample: \"1\"}}\n", time.Hour)
	w, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	first := w.Current()
	require.Equal(t, "0.000001", cost(t, first, "x", "m", store.UsageSamplingSample, "", 1))

	write("models: {m: {sample: \"2\"}}\n", 30*time.Minute)
	w.Poll()
	second := w.Current()
	require.NotEqual(t, first.Version(), second.Version())
	require.Equal(t, "0.000002", cost(t, second, "x", "m", store.UsageSamplingSample, "", 1))
	require.Equal(t, "0.000001", cost(t, first, "x", "m", store.UsageSamplingSample, "", 1), "a loaded sheet never changes")

	write("models: {m: {sample: oops}}\n", 20*time.Minute)
	w.Poll()
	require.Same(t, second, w.Current(), "a bad sheet is refused; the one in force is kept")
	w.Poll()
	require.Same(t, second, w.Current())

	write("models: {m: {sample: \"3\"}}\n", 10*time.Minute)
	w.Poll()
	require.Equal(t, "0.000003", cost(t, w.Current(), "x", "m", store.UsageSamplingSample, "", 1))

	write("models: {m: {sample: oops}}\n", time.Minute)
	_, err = prices.Load(file, slog.New(slog.DiscardHandler))
	require.ErrorContains(t, err, "line 1", "a bad sheet at start is refused with its line")
	var nilWatcher *prices.Watcher
	require.Nil(t, nilWatcher.Current())
}
