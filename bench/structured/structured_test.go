package structured

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"slices"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
)

// schema is the json_schema the constrained runs ask for: an object of a string, an
// integer, a nullable number, an enum and an array of booleans.
var schema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"city":  map[string]any{"type": "string"},
		"count": map[string]any{"type": "integer"},
		"temp":  map[string]any{"anyOf": []any{map[string]any{"type": "number"}, map[string]any{"type": "null"}}},
		"kind":  map[string]any{"enum": []any{"rain", "snow", "sun"}},
		"flags": map[string]any{"type": "array", "items": map[string]any{"type": "boolean"}},
	},
	"required":             []string{"city", "count", "temp", "kind", "flags"},
	"additionalProperties": false,
}

func start(t *testing.T) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir()})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return "http://" + ln.Addr().String() + "/oai/api/v1/chat/completions"
}

// run sends conc requests at once, each n choices of up to maxTokens, and returns the
// output tokens and the wall time.
func run(t *testing.T, url string, format any, conc, n, maxTokens int, seed int) (int, time.Duration) {
	var wg sync.WaitGroup
	tokens := make([]int, conc)
	t0 := time.Now()
	for c := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := map[string]any{"model": tiny.Name, "messages": []map[string]any{{"role": "user", "content": "Describe the weather as JSON."}},
				"n": n, "max_tokens": maxTokens, "temperature": 1, "seed": seed*1000 + c}
			if format != nil {
				body["response_format"] = format
			}
			raw, _ := json.Marshal(body)
			req, _ := http.NewRequestWithContext(t.Context(), "POST", url, bytes.NewReader(raw))
			req.Header.Set("Authorization", "Bearer tml-bench")
			resp, err := http.DefaultClient.Do(req)
			if err != nil {
				t.Error(err)
				return
			}
			defer resp.Body.Close()
			var out struct {
				Usage struct {
					CompletionTokens int `json:"completion_tokens"`
				} `json:"usage"`
			}
			if resp.StatusCode != http.StatusOK || json.NewDecoder(resp.Body).Decode(&out) != nil {
				t.Errorf("status %d", resp.StatusCode)
				return
			}
			tokens[c] = out.Usage.CompletionTokens
		}()
	}
	wg.Wait()
	sum := 0
	for _, v := range tokens {
		sum += v
	}
	return sum, time.Since(t0)
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestStructuredThroughput compares output tokens/s of unconstrained, json_schema and
// json_object chat completions on loops/tiny, alternating the three in each round (the
// machine's load moves), and reports the median ratio over the rounds. Without LOOPS_BENCH
// it runs one short round as a smoke test.
func TestStructuredThroughput(t *testing.T) {
	rounds, conc, n, maxTokens := envInt("LOOPS_BENCH_ROUNDS", 5), envInt("LOOPS_BENCH_CONC", 4), envInt("LOOPS_BENCH_N", 4), envInt("LOOPS_BENCH_TOKENS", 128)
	if os.Getenv("LOOPS_BENCH") == "" {
		rounds, conc, n, maxTokens = 1, 1, 2, 8
	}
	url := start(t)
	kinds := []struct {
		name   string
		format any
	}{
		{"unconstrained", nil},
		{"json_schema", map[string]any{"type": "json_schema", "json_schema": map[string]any{"name": "weather", "strict": true, "schema": schema}}},
		{"json_object", map[string]any{"type": "json_object"}},
	}
	for _, k := range kinds { // warm-up: the schema's automaton and its masks are compiled once
		run(t, url, k.format, 1, 1, maxTokens, 0)
	}
	ratios := make([][]float64, len(kinds))
	for r := range rounds {
		rates := make([]float64, len(kinds))
		for i, k := range kinds {
			toks, d := run(t, url, k.format, conc, n, maxTokens, r+1)
			rates[i] = float64(toks) / d.Seconds()
			t.Logf("round %d %-13s %5d tokens in %7.3fs: %8.1f tokens/s", r, k.name, toks, d.Seconds(), rates[i])
		}
		for i := range kinds {
			ratios[i] = append(ratios[i], rates[i]/rates[0])
		}
	}
	for i, k := range kinds[1:] {
		rs := slices.Clone(ratios[i+1])
		slices.Sort(rs)
		med := rs[len(rs)/2]
		t.Logf("%s / unconstrained tokens/s: median %.3f (cost %.1f%%) over %d rounds %v", k.name, med, 100*(1-med), rounds, fmtRatios(ratios[i+1]))
	}
}

func fmtRatios(rs []float64) string {
	s := ""
	for _, r := range rs {
		s += fmt.Sprintf(" %.3f", r)
	}
	return s
}
