package serving

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	_ "github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/core"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// largeSeed seeds the Qwen3-0.6B-shaped model's weights.
const largeSeed = 20240917

// largeVersion names what writeLarge writes; a folder with another version is rewritten.
const largeVersion = "qwen3-0.6b-shape seed=20240917 go-v1"

// writeLarge writes a model with Qwen3-0.6B's exact shape (hidden 1024, 28 layers, 16 query
// and 8 key/value heads of 128, MLP 3072, vocabulary 151936, tied embeddings, q/k norm) and
// normal(0, 0.02) weights from largeSeed, as float32 safetensors, with loops/tiny's
// tokenizer files: the benchmark sends token ids, and the ids past the tokenizer's 512
// decode to no text, so only the token counts and timings mean anything.
func writeLarge(t *testing.T, dir string) {
	if b, err := os.ReadFile(filepath.Join(dir, "loops-bench-version")); err == nil && strings.TrimSpace(string(b)) == largeVersion {
		return
	}
	require.NoError(t, os.MkdirAll(dir, 0o755))
	tdir := t.TempDir()
	require.NoError(t, tiny.Write(tdir))
	for _, f := range []string{"tokenizer.json", "tokenizer_config.json"} {
		b, err := os.ReadFile(filepath.Join(tdir, f))
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(filepath.Join(dir, f), b, 0o644))
	}
	cfg := nn.Config{
		Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3",
		Vocab: 151936, Hidden: 1024, Layers: 28, Heads: 16, KVHeads: 8, HeadDim: 128, Inter: 3072,
		MaxPos: 40960, RopeTheta: 1e6, Eps: 1e-6, Tied: true, HiddenAct: "silu", TorchDType: "float32",
		EOS: 151645,
	}
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.02, Seed: largeSeed})
	require.NoError(t, err)
	require.NoError(t, nn.WriteConfig(dir, m.Cfg, map[string]any{"eos_token_id": 151645, "bos_token_id": 151643}))
	_, err = safetensors.Write(filepath.Join(dir, "model.safetensors"), m.Tensors(), map[string]string{"format": "pt"})
	require.NoError(t, err)
	require.NoError(t, os.WriteFile(filepath.Join(dir, "loops-bench-version"), []byte(largeVersion+"\n"), 0o644))
}

// startServer runs a gateway with the reference engine serving models, in open mode, and
// returns its root URL.
func startServer(t *testing.T, slots int, models ...string) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: t.TempDir(),
		BackendConfig: backends.Config{Models: models}, Core: core.Options{SamplingConcurrency: slots}})
	require.NoError(t, err)
	go func() { _ = srv.Serve() }()
	t.Cleanup(func() { _ = srv.Close(context.Background()) })
	return "http://" + ln.Addr().String()
}

// samplerCheckpoints creates k LoRA runs (rank 8, attention and MLP) on base and saves each
// one's sampler weights: k adapters of one base, named by their tinker:// paths.
func samplerCheckpoints(t *testing.T, root, base string, k int) []string {
	hc := &http.Client{Transport: keyTransport{http.DefaultTransport}}
	training := loopsv1connect.NewTrainingServiceClient(hc, root)
	ops := loopsv1connect.NewOperationServiceClient(hc, root)
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		for op.GetState() != loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
			require.NotEqual(t, loopsv1.OperationState_OPERATION_STATE_FAILED, op.GetState(), op.GetError().GetMessage())
			var err error
			op, err = ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(25 * time.Second)})
			require.NoError(t, err)
		}
		return op
	}
	var paths []string
	for i := range k {
		seed := uint64(i + 1)
		op, err := training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: base,
			Lora: &loopsv1.LoraConfig{Rank: 8, TrainAttn: true, TrainMlp: true, Seed: seed}})
		require.NoError(t, err)
		run := wait(op).GetTrainingRunId()
		op, err = training.SaveWeights(t.Context(), &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 1,
			Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: fmt.Sprintf("serving-%d", i)})
		require.NoError(t, err)
		paths = append(paths, wait(op).GetSaveWeights().GetCheckpoint().GetTinkerPath())
	}
	return paths
}

// keyTransport sends the benchmark's API key.
type keyTransport struct{ next http.RoundTripper }

func (k keyTransport) RoundTrip(r *http.Request) (*http.Response, error) {
	r = r.Clone(r.Context())
	r.Header.Set("Authorization", "Bearer "+benchKey)
	return k.next.RoundTrip(r)
}

// benchKey is the benchmark's API key (open mode: any tml- key).
const benchKey = "tml-serving-bench"

// result is one streamed completion as the client saw it.
type result struct {
	ttft   time.Duration   // request sent → first chunk with a token
	gaps   []time.Duration // between consecutive tokens (0 within one chunk)
	tokens int
}

// complete streams one completion of prompt and times its tokens.
func complete(ctx context.Context, url, model string, prompt []int32, maxTokens int, seed int) (result, error) {
	body, _ := json.Marshal(map[string]any{"model": model, "prompt": prompt, "max_tokens": maxTokens, "temperature": 1,
		"seed": seed, "logprobs": 0, "stream": true})
	req, err := http.NewRequestWithContext(ctx, "POST", url, bytes.NewReader(body))
	if err != nil {
		return result{}, err
	}
	req.Header.Set("Authorization", "Bearer "+benchKey)
	start := time.Now()
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return result{}, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return result{}, fmt.Errorf("status %d", resp.StatusCode)
	}
	var r result
	last := start
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<16), 1<<22)
	for sc.Scan() {
		data, ok := strings.CutPrefix(sc.Text(), "data: ")
		if !ok || data == "[DONE]" {
			continue
		}
		var c struct {
			Choices []struct {
				Logprobs *struct {
					Tokens []string `json:"tokens"`
				} `json:"logprobs"`
			} `json:"choices"`
			Error any `json:"error"`
		}
		if err := json.Unmarshal([]byte(data), &c); err != nil {
			return r, err
		}
		if c.Error != nil {
			return r, fmt.Errorf("stream error: %v", c.Error)
		}
		if len(c.Choices) == 0 || c.Choices[0].Logprobs == nil {
			continue
		}
		n := len(c.Choices[0].Logprobs.Tokens)
		if n == 0 {
			continue
		}
		now := time.Now()
		if r.tokens == 0 {
			r.ttft = now.Sub(start)
		} else {
			r.gaps = append(r.gaps, now.Sub(last))
		}
		for range n - 1 {
			r.gaps = append(r.gaps, 0)
		}
		r.tokens += n
		last = now
	}
	return r, sc.Err()
}

// stats are one concurrency level's figures.
type stats struct {
	conc, requests, tokens int
	wall                   time.Duration
	ttft, itl              []time.Duration
}

func (s stats) tokensPerSecond() float64 { return float64(s.tokens) / s.wall.Seconds() }

// run sends n requests, conc at a time; request i names models[i % len(models)].
func run(t *testing.T, url string, models []string, n, conc, promptLen, maxTokens int) stats {
	jobs := make(chan int)
	var mu sync.Mutex
	st := stats{conc: conc, requests: n}
	var wg sync.WaitGroup
	start := time.Now()
	for range conc {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for i := range jobs {
				p := make([]int32, promptLen)
				for k := range p {
					p[k] = int32(65 + (i*7+k)%26)
				}
				r, err := complete(t.Context(), url, models[i%len(models)], p, maxTokens, i)
				if err != nil {
					t.Error(err)
					continue
				}
				mu.Lock()
				st.tokens += r.tokens
				st.ttft = append(st.ttft, r.ttft)
				st.itl = append(st.itl, r.gaps...)
				mu.Unlock()
			}
		}()
	}
	for i := range n {
		jobs <- i
	}
	close(jobs)
	wg.Wait()
	st.wall = time.Since(start)
	return st
}

func pct(d []time.Duration, p float64) time.Duration {
	if len(d) == 0 {
		return 0
	}
	s := slices.Clone(d)
	slices.Sort(s)
	return s[min(len(s)-1, int(p*float64(len(s))))]
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}

func envInt(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestServing reports, per model and sampler slot count, streamed completion throughput
// and latency at concurrency 1, 8 and 32 (one workspace), and the gain over concurrency 1.
func TestServing(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the serving benchmark")
	}
	type model struct {
		name              string
		prompt, maxTokens int
		perConc, reqs     int // requests per level: max(perConc·conc, reqs)
		adapters          int // > 0: requests go round robin to that many sampler checkpoints
	}
	models := []model{{tiny.Name, 16, 64, 2, 16, 0}, {tiny.Name, 16, 64, 2, 16, envInt("LOOPS_BENCH_ADAPTERS", 4)}}
	if os.Getenv("LOOPS_BENCH_LARGE") != "" {
		home, err := os.UserHomeDir()
		require.NoError(t, err)
		dir := filepath.Join(home, ".cache", "loops", "bench", "serving-qwen3-0.6b-shape")
		t0 := time.Now()
		writeLarge(t, dir)
		t.Logf("0.6B-shaped model in %s (%v)", dir, time.Since(t0).Round(time.Second))
		models = append(models, model{dir, 16, envInt("LOOPS_BENCH_LARGE_TOKENS", 16), 1, 4, 0})
		if os.Getenv("LOOPS_BENCH_LARGE") == "only" {
			models = models[2:]
		}
	}
	// The core's default is 4 sampler slots; a serving deployment wants one per request in
	// flight (the queue keeps an eighth of them for other workspaces, so 40 give one
	// workspace 35).
	slotCounts := []int{40, 4}
	if v := os.Getenv("LOOPS_BENCH_SLOTS"); v != "" {
		slotCounts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			slotCounts = append(slotCounts, n)
		}
	}
	concs := []int{1, 8, 32}
	if v := os.Getenv("LOOPS_BENCH_CONC"); v != "" { // e.g. "1,8": the first is the serial baseline
		concs = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			concs = append(concs, n)
		}
	}
	t.Logf("GOMAXPROCS %d, load average before: %s", runtime.GOMAXPROCS(0), loadavg())
	rounds := envInt("LOOPS_BENCH_ROUNDS", 3)
	label := func(m model) string {
		if m.adapters > 0 {
			return fmt.Sprintf("%s with %d adapters", filepath.Base(m.name), m.adapters)
		}
		return filepath.Base(m.name)
	}
	line := func(m model, slots int, st stats, gain string) {
		t.Logf("%s, %d slots, concurrency %2d: %3d requests × (%d+≤%d tokens): %7.1f tokens/s%s; TTFT p50 %v p99 %v; ITL p50 %v p99 %v; load %s",
			label(m), slots, st.conc, st.requests, m.prompt, m.maxTokens, st.tokensPerSecond(), gain,
			pct(st.ttft, .5).Round(time.Millisecond), pct(st.ttft, .99).Round(time.Millisecond),
			pct(st.itl, .5).Round(100*time.Microsecond), pct(st.itl, .99).Round(100*time.Microsecond), loadavg())
	}
	for _, m := range models {
		for _, slots := range slotCounts {
			root := startServer(t, slots, m.name)
			url := root + "/oai/api/v1/completions"
			names := []string{m.name}
			if m.adapters > 0 {
				names = samplerCheckpoints(t, root, m.name, m.adapters)
			}
			run(t, url, names, 2*len(names), 2, m.prompt, 4) // warm-up: loads the model and adapters
			// The machine's load moves between phases, so each level alternates with its own
			// serial baseline (the same number of requests one at a time, right before it),
			// rounds times; the gain is the median of the rounds' ratios.
			for _, conc := range concs[1:] {
				n := max(m.perConc*conc, m.reqs)
				var ratios []float64
				for range rounds {
					serial := run(t, url, names, max(n/4, m.reqs/2, 1), concs[0], m.prompt, m.maxTokens)
					par := run(t, url, names, n, conc, m.prompt, m.maxTokens)
					ratios = append(ratios, par.tokensPerSecond()/serial.tokensPerSecond())
					line(m, slots, serial, "")
					line(m, slots, par, fmt.Sprintf(" (%.2f× the serial run before it)", ratios[len(ratios)-1]))
				}
				slices.Sort(ratios)
				t.Logf("%s, %d slots, concurrency %d: batching gain over serial, median of %d rounds: %.2f× (range %.2f–%.2f×)",
					label(m), slots, conc, rounds, ratios[len(ratios)/2], ratios[0], ratios[len(ratios)-1])
			}
		}
	}
}
