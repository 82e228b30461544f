package replicas

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func env(name string, def int) int {
	if v, err := strconv.Atoi(os.Getenv(name)); err == nil && v > 0 {
		return v
	}
	return def
}

// TestReplicaThroughput starts one pooled backend per replica count (all idle but the one
// measured), then alternates rounds between them: each round sends LOOPS_BENCH_REQUESTS
// sampling requests (16-token prompt, LOOPS_BENCH_TOKENS new tokens, temperature 1, their
// own seeds) with 4 in flight per replica of the largest count, and reports output tokens/s.
//
//	LOOPS_BENCH=1 LOOPS_WORKER_PYTHON=… go test -count=1 -v -run TestReplicaThroughput ./bench/replicas/
//	  LOOPS_BENCH_REPLICAS=1,2   replica counts (default 1,2 and 4 when the box has ≥ 8 cores)
//	  LOOPS_BENCH_THREADS=1      torch threads per worker     LOOPS_BENCH_ROUNDS=3
func TestReplicaThroughput(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") != "1" {
		t.Skip("set LOOPS_BENCH=1 (and LOOPS_WORKER_PYTHON) to run the benchmark")
	}
	py := os.Getenv("LOOPS_WORKER_PYTHON")
	require.NotEmpty(t, py, "LOOPS_WORKER_PYTHON: an interpreter with the torch worker's requirements")
	threads := env("LOOPS_BENCH_THREADS", 1)
	rounds := env("LOOPS_BENCH_ROUNDS", 3)
	requests := env("LOOPS_BENCH_REQUESTS", 32)
	tokens := env("LOOPS_BENCH_TOKENS", 32)
	counts := []int{1, 2}
	if runtime.NumCPU() >= 8 {
		counts = append(counts, 4)
	}
	if v := os.Getenv("LOOPS_BENCH_REPLICAS"); v != "" {
		counts = nil
		for _, f := range strings.Split(v, ",") {
			n, err := strconv.Atoi(f)
			require.NoError(t, err)
			counts = append(counts, n)
		}
	}
	_, file, _, _ := runtime.Caller(0)
	root := filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
	t.Setenv("HF_HUB_OFFLINE", "1")
	backends := map[int]*worker.Backend{}
	for _, n := range counts {
		o := worker.Options{
			DataDir:      t.TempDir(),
			AllowDirs:    []string{os.TempDir()}, // the adapters are saved in other temp folders
			Python:       py,
			PythonPath:   filepath.Join(root, "backends", "torch") + string(os.PathListSeparator) + filepath.Join(root, "gen", "python"),
			Models:       []string{tiny.Name},
			Args:         []string{"--device", "cpu", "--threads", strconv.Itoa(threads)},
			Env:          []string{"HF_HUB_OFFLINE=1", "TOKENIZERS_PARALLELISM=false", "OMP_NUM_THREADS=" + strconv.Itoa(threads)},
			StartTimeout: 5 * time.Minute,
			Pool:         &worker.PoolOptions{Provider: "local", Replicas: n},
		}
		start := time.Now()
		b, err := worker.New(t.Context(), o)
		require.NoError(t, err)
		t.Cleanup(func() { _ = b.Close() })
		// every replica attached before measuring
		_, reg := b.Pools()
		require.Eventually(t, func() bool { return len(reg.Members(worker.PoolID(tiny.Name))) == n }, 5*time.Minute, 100*time.Millisecond)
		t.Logf("%d replica(s) up in %v", n, time.Since(start).Round(time.Millisecond))
		backends[n] = b
	}
	inFlight := 4 * counts[len(counts)-1]
	prompt := make([]int32, 16)
	for i := range prompt {
		prompt[i] = int32(32 + i*7)
	}
	// 4 LoRA sampler checkpoints of the base model, saved by each backend's own trainer
	adapters := map[int][]string{}
	for _, n := range counts {
		b := backends[n]
		for a := range 4 {
			id := fmt.Sprintf("bench-%d", a)
			_, err := b.Trainer().CreateAdapter(t.Context(), &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: tiny.Name,
				Lora: &loopsv1.LoraConfig{Rank: 8, Seed: uint64(a + 1), TrainAttn: true, TrainMlp: true}})
			require.NoError(t, err)
			dir := filepath.Join(t.TempDir(), id)
			_, err = b.Trainer().SaveAdapter(t.Context(), &backendv1.SaveAdapterRequest{AdapterId: id, Dir: dir})
			require.NoError(t, err)
			adapters[n] = append(adapters[n], dir)
		}
	}
	measure := func(b *worker.Backend, dirs []string) float64 {
		var mu sync.Mutex
		total := 0
		work := make(chan int, requests)
		for i := range requests {
			work <- i
		}
		close(work)
		start := time.Now()
		var wg sync.WaitGroup
		for range inFlight {
			wg.Go(func() {
				for i := range work {
					seed := uint64(i + 1)
					dir := ""
					if len(dirs) > 0 {
						dir = dirs[i%len(dirs)]
					}
					res, err := b.Sampler().Sample(context.Background(), &backendv1.SampleRequest{BaseModel: tiny.Name, AdapterDir: dir, Prompt: prompt, NumSamples: 1,
						Params: &loopsv1.SamplingParams{MaxTokens: int32(tokens), Temperature: 1, TopP: 1, Seed: &seed}})
					if err != nil {
						t.Error(err)
						return
					}
					mu.Lock()
					total += len(res.Result.Sequences[0].Tokens)
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		return float64(total) / time.Since(start).Seconds()
	}
	for _, variant := range []string{"base model", "4 adapters"} {
		dirsOf := func(n int) []string {
			if variant == "base model" {
				return nil
			}
			return adapters[n]
		}
		for _, n := range counts { // warm-up: every replica has sampled (and loaded the adapters)
			measure(backends[n], dirsOf(n))
		}
		got := map[int][]float64{}
		for r := range rounds {
			for _, n := range counts {
				tps := measure(backends[n], dirsOf(n))
				got[n] = append(got[n], tps)
				t.Logf("%s, round %d: %d replica(s): %.1f tokens/s; load %s", variant, r+1, n, tps, loadavg())
			}
		}
		base := median(got[counts[0]])
		for _, n := range counts {
			m := median(got[n])
			t.Logf("%s: %d replica(s): median %.1f tokens/s = %.2f× one replica (goal ≥ %.1f×); %d torch thread(s) per worker, %d cores",
				variant, n, m, m/base, 0.8*float64(n), threads, runtime.NumCPU())
		}
	}
}

func median(v []float64) float64 {
	s := append([]float64(nil), v...)
	sort.Float64s(s)
	return s[len(s)/2]
}

func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Join(strings.Fields(string(b))[:3], " ")
}
