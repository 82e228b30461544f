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
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
)

// schema is the json_schema the constrained runs ask for: an object holding exactly 32
// records of a string, an integer, a nullable number, an enum and a boolean. Its shortest
// answer is over a thousand bytes, so every choice runs to max_tokens, as the unconstrained
// ones do with their end-of-sequence tokens banned: both decode the same number of tokens
// in full batches, and the ratio is the constraint's cost per token.
var schema = map[string]any{
	"type": "object",
	"properties": map[string]any{
		"records": map[string]any{"type": "array", "minItems": 32, "maxItems": 32, "items": map[string]any{
			"type": "object",
			"properties": map[string]any{
				"city":  map[string]any{"type": "string"},
				"count": map[string]any{"type": "integer"},
				"temp":  map[string]any{"anyOf": []any{map[string]any{"type": "number"}, map[string]any{"type": "null"}}},
				"kind":  map[string]any{"enum": []any{"rain", "snow", "sun"}},
				"ok":    map[string]any{"type": "boolean"},
			},
			"required":             []string{"city", "count", "temp", "kind", "ok"},
			"additionalProperties": false,
		}},
	},
	"required":             []string{"records"},
	"additionalProperties": false,
}

// noEOS bans loops/tiny's end-of-sequence tokens (logit_bias -100).
func noEOS() map[string]any {
	out := map[string]any{}
	for _, s := range []string{tiny.EOS, tiny.IMEnd} {
		id, ok := tiny.Tokenizer().TokenID(s)
		if ok {
			out[strconv.Itoa(id)] = -100
		}
	}
	return out
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

// cpu is the CPU time this process (client and server) has used.
func cpu() time.Duration {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// run sends conc requests at once, each n choices of up to maxTokens, and returns the
// output tokens, the wall time and the CPU time the process used meanwhile.
func run(t *testing.T, url string, format any, conc, n, maxTokens int, seed int) (int, time.Duration, time.Duration) {
	bias := noEOS()
	var wg sync.WaitGroup
	tokens := make([]int, conc)
	t0, c0 := time.Now(), cpu()
	for c := range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			body := map[string]any{"model": tiny.Name, "messages": []map[string]any{{"role": "user", "content": "Describe the weather as JSON."}},
				"n": n, "max_tokens": maxTokens, "temperature": 1, "seed": seed*1000 + c}
			if format != nil {
				body["response_format"] = format
			} else {
				body["logit_bias"] = bias
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
	return sum, time.Since(t0), cpu() - c0
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestStructuredThroughput compares output tokens/s of json_schema chat completions with
// unconstrained ones on loops/tiny, both running every choice to max_tokens, alternating
// (and swapping their order) round after round since the machine's load moves, and
// reports the median ratio over the rounds. Without LOOPS_BENCH
// it runs one short round as a smoke test.
func TestStructuredThroughput(t *testing.T) {
	rounds, conc, n, maxTokens := envInt("LOOPS_BENCH_ROUNDS", 16), envInt("LOOPS_BENCH_CONC", 4), envInt("LOOPS_BENCH_N", 4), envInt("LOOPS_BENCH_TOKENS", 96)
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
	}
	for _, k := range kinds { // warm-up: the schema's automaton and its masks are compiled once
		run(t, url, k.format, 1, 1, maxTokens, 0)
	}
	ratios := make([][]float64, len(kinds))
	cpuRatios := make([][]float64, len(kinds))
	for r := range rounds {
		rates := make([]float64, len(kinds))
		cpuRates := make([]float64, len(kinds))
		order := []int{0, 1}
		if r%2 == 1 {
			order = []int{1, 0}
		}
		for _, i := range order {
			k := kinds[i]
			toks, d, c := run(t, url, k.format, conc, n, maxTokens, r+1)
			rates[i], cpuRates[i] = float64(toks)/d.Seconds(), float64(toks)/c.Seconds()
			t.Logf("round %d %-13s %5d tokens in %7.3fs wall, %7.3fs CPU: %8.1f tokens/s, %8.1f tokens per CPU-second", r, k.name, toks, d.Seconds(), c.Seconds(), rates[i], cpuRates[i])
		}
		for i := range kinds {
			ratios[i] = append(ratios[i], rates[i]/rates[0])
			cpuRatios[i] = append(cpuRatios[i], cpuRates[i]/cpuRates[0])
		}
	}
	for i, k := range kinds[1:] {
		for _, m := range []struct {
			what string
			rs   []float64
		}{{"tokens/s (wall)", ratios[i+1]}, {"tokens per CPU-second", cpuRatios[i+1]}} {
			rs := slices.Clone(m.rs)
			slices.Sort(rs)
			med := rs[len(rs)/2]
			t.Logf("%s / unconstrained %s: median %.3f (cost %.1f%%) over %d rounds:%s", k.name, m.what, med, 100*(1-med), rounds, fmtRatios(m.rs))
		}
	}
}

func fmtRatios(rs []float64) string {
	s := ""
	for _, r := range rs {
		s += fmt.Sprintf(" %.3f", r)
	}
	return s
}
