package tokenizer

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/bench/benchdata"
)

const mib = 1 << 20

// prose is ordinary English, several tokens a word.
const prose = "The sampler generates text from the model: it reads a prompt, computes the probability of every token in the vocabulary, and draws the next token. "

// markers is the densest chat text: every line a pair of added tokens.
const markers = "<|im_start|>user\nhi<|im_end|>\n"

// chatML is the text loops/tiny's chat template renders for n short messages.
func chatML(n int) string {
	var b strings.Builder
	for i := range n {
		fmt.Fprintf(&b, "<|im_start|>user\nMessage %d.<|im_end|>\n", i)
	}
	return b.String() + "<|im_start|>assistant\n"
}

func repeatTo(unit string, size int) string {
	return strings.Repeat(unit, max(size/len(unit), 1))
}

// scale multiplies the in-process units: $LOOPS_BENCH_SCALE (such as 0.25, for an
// encoder that is quadratic), 1 by default.
func scale() float64 {
	if v, err := strconv.ParseFloat(os.Getenv("LOOPS_BENCH_SCALE"), 64); err == nil && v > 0 {
		return v
	}
	return 1
}

// TestScaling encodes 1, 2 and 4 units of each kind of input and reports the process's CPU
// time (user + system, the GC's included; the fewest of up to 5 runs, as many as fit in a
// second: CPU time, unlike wall time, does not grow when other processes share the
// machine), the wall time of that run, and the bytes allocated per input byte; the ratios
// to 1 unit are 2 and 4 for a linear tokenizer.
func TestScaling(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the tokenizer benchmark")
	}
	tok := tiny.Tokenizer()
	k := scale()
	for _, c := range []struct {
		name  string
		input func(units int) string
	}{
		{"chat markers, 302 KiB a unit", func(u int) string { return repeatTo(markers, int(float64(u*302<<10)*k)) }},
		{"chat messages, 20,000 a unit", func(u int) string { return chatML(int(float64(u*20000) * k)) }},
		{"prose, 1 MiB a unit", func(u int) string { return repeatTo(prose, int(float64(u*mib)*k)) }},
		{"one word, 64 KiB a unit", func(u int) string { return repeatTo("Loopsisaselfhostedservice", int(float64(u*64<<10)*k)) }},
	} {
		var base time.Duration
		for _, u := range []int{1, 2, 4} {
			in := c.input(u)
			var best, wall time.Duration
			var alloc uint64
			var toks int
			start := time.Now()
			for run := 0; run < 5 && (run == 0 || time.Since(start) < time.Second); run++ {
				runtime.GC()
				var m0, m1 runtime.MemStats
				runtime.ReadMemStats(&m0)
				c0, t0 := cpuTime(t), time.Now()
				toks = len(tok.Encode(in))
				d, w := cpuTime(t)-c0, time.Since(t0)
				runtime.ReadMemStats(&m1)
				if best == 0 || d < best {
					best, wall, alloc = d, w, m1.TotalAlloc-m0.TotalAlloc
				}
			}
			if u == 1 {
				base = best
			}
			t.Logf("%s (×%g) × %d: %d bytes, %d tokens: CPU %s (%.0f ns/byte, %.2f× 1 unit), wall %s; %.1f bytes allocated per byte",
				c.name, k, u, len(in), toks, best.Round(time.Millisecond), float64(best.Nanoseconds())/float64(len(in)),
				float64(best)/float64(base), wall.Round(time.Millisecond), float64(alloc)/float64(len(in)))
		}
	}
}

// TestServe sends each hostile prompt to a fresh `loops serve` (loops/tiny, 2,048 tokens)
// and reports its answer, the time it took and the server's peak resident memory.
func TestServe(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the tokenizer benchmark")
	}
	bin := benchdata.Binary(t)
	user := func(content string) []map[string]string {
		return []map[string]string{{"role": "user", "content": content}}
	}
	many := make([]map[string]string, 20000)
	for i := range many {
		many[i] = map[string]string{"role": "user", "content": "Message " + strconv.Itoa(i) + "."}
	}
	for _, c := range []struct {
		name     string
		messages []map[string]string
	}{
		{"a short message (control)", user("Hello there")},
		{"60 MiB of prose in one message", user(repeatTo(prose, 60*mib))},
		{"302 KiB of chat markers in one message", user(repeatTo(markers, 302<<10))},
		{"20,000 messages", many},
	} {
		t.Run(c.name, func(t *testing.T) {
			body, err := json.Marshal(map[string]any{"model": tiny.Name, "max_tokens": 1, "messages": c.messages})
			require.NoError(t, err)
			srv := benchdata.Serve(t, bin)
			idle := srv.Memory(t)
			req, err := http.NewRequest(http.MethodPost, srv.URL+"/oai/api/v1/chat/completions", bytes.NewReader(body))
			require.NoError(t, err)
			req.Header.Set("Authorization", "Bearer tml-bench")
			req.Header.Set("Content-Type", "application/json")
			start := time.Now()
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			answer, _ := io.ReadAll(resp.Body)
			resp.Body.Close()
			elapsed := time.Since(start)
			peak := srv.Memory(t)
			var e struct {
				Error struct {
					Message string `json:"message"`
				} `json:"error"`
			}
			_ = json.Unmarshal(answer, &e)
			t.Logf("%s: %d-byte body; %d in %s; idle RSS %d MiB, peak %d MiB; %s", c.name, len(body), resp.StatusCode,
				elapsed.Round(time.Millisecond), idle.RSS/mib, peak.HWM/mib, truncate(e.Error.Message, 160))
		})
	}
}

// cpuTime is the CPU time the process has used.
func cpuTime(t *testing.T) time.Duration {
	var ru syscall.Rusage
	require.NoError(t, syscall.Getrusage(syscall.RUSAGE_SELF, &ru))
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

func truncate(s string, n int) string {
	if len(s) > n {
		return s[:n] + "…"
	}
	return s
}
