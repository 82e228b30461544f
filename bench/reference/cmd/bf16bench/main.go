// Command bf16bench measures what holding a bf16 checkpoint's linear weights as bfloat16
// (nn.HoldBF16) saves against holding them widened to float32, on a Qwen3-0.6B-shaped
// model with random weights rounded to bfloat16: resident memory (VmRSS after a GC) and
// decode tokens/s (one sequence, greedy over the engine's batched Decode). Each
// measurement runs in a child process of its own (so RSS is the model's alone), the two
// holdings alternating for -rounds rounds; it prints the medians and the ratios, in wall
// and in process CPU seconds (the CPU-second figure is steadier on a loaded machine).
//
//	go run ./bench/reference/cmd/bf16bench -layers 28 -rounds 3
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/loops-dev/loops/backends/reference/nn"
)

type result struct {
	Mode     string  `json:"mode"`
	RSSMiB   float64 `json:"rss_mib"`
	TokS     float64 `json:"tok_s"`
	TokCPUS  float64 `json:"tok_cpu_s"` // tokens per process CPU second
	Held     int     `json:"held"`
	Checksum float64 `json:"checksum"` // sum of the sampled log-probs: equal across modes
}

func main() {
	var (
		layers  = flag.Int("layers", 28, "decoder layers (Qwen3-0.6B has 28)")
		steps   = flag.Int("steps", 32, "decode steps timed (after 4 warm-up steps)")
		rounds  = flag.Int("rounds", 3, "rounds (each runs both holdings)")
		threads = flag.Int("threads", runtime.NumCPU(), "kernel goroutines")
		child   = flag.String("child", "", "internal: measure one holding (f32 or bf16)")
	)
	flag.Parse()
	if *child != "" {
		r := measure(*child, *layers, *steps, *threads)
		b, _ := json.Marshal(r)
		fmt.Println(string(b))
		return
	}
	self, err := os.Executable()
	if err != nil {
		fail(err)
	}
	load := func() string { b, _ := os.ReadFile("/proc/loadavg"); return strings.TrimSpace(string(b)) }
	fmt.Printf("cpus %d, threads %d, layers %d, load before: %s\n", runtime.NumCPU(), *threads, *layers, load())
	res := map[string][]result{}
	for i := range *rounds {
		order := []string{"f32", "bf16"}
		if i%2 == 1 {
			order = []string{"bf16", "f32"}
		}
		for _, mode := range order {
			out, err := exec.Command(self, "-child", mode, "-layers", strconv.Itoa(*layers), "-steps", strconv.Itoa(*steps), "-threads", strconv.Itoa(*threads)).Output()
			if err != nil {
				fail(fmt.Errorf("%s: %v", mode, err))
			}
			var r result
			sc := bufio.NewScanner(strings.NewReader(string(out)))
			for sc.Scan() {
				if json.Unmarshal(sc.Bytes(), &r) == nil && r.Mode != "" {
					break
				}
			}
			fmt.Printf("round %d %-4s rss %7.0f MiB  %6.2f tok/s  %6.2f tok/cpu-s  (held %d, checksum %.6f)\n", i, mode, r.RSSMiB, r.TokS, r.TokCPUS, r.Held, r.Checksum)
			res[mode] = append(res[mode], r)
		}
	}
	med := func(mode string, f func(result) float64) float64 {
		var v []float64
		for _, r := range res[mode] {
			v = append(v, f(r))
		}
		sort.Float64s(v)
		return v[len(v)/2]
	}
	rss := func(r result) float64 { return r.RSSMiB }
	tok := func(r result) float64 { return r.TokS }
	cpu := func(r result) float64 { return r.TokCPUS }
	fmt.Printf("median rss: f32 %.0f MiB, bf16 %.0f MiB (bf16/f32 %.3f)\n", med("f32", rss), med("bf16", rss), med("bf16", rss)/med("f32", rss))
	fmt.Printf("median decode: f32 %.2f tok/s, bf16 %.2f tok/s (bf16/f32 %.3f)\n", med("f32", tok), med("bf16", tok), med("bf16", tok)/med("f32", tok))
	fmt.Printf("median decode per CPU-s: f32 %.2f, bf16 %.2f (bf16/f32 %.3f)\n", med("f32", cpu), med("bf16", cpu), med("bf16", cpu)/med("f32", cpu))
	fmt.Printf("load after: %s\n", load())
}

// measure builds the model, holds it as mode, and times decoding.
func measure(mode string, layers, steps, threads int) result {
	nn.SetThreads(threads)
	cfg := nn.Config{Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3", Vocab: 151936, Hidden: 1024,
		Layers: layers, Heads: 16, KVHeads: 8, HeadDim: 128, Inter: 3072, MaxPos: 4096, RopeTheta: 1e6, Eps: 1e-6,
		Tied: true, HiddenAct: "silu"}
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.02, Seed: 1})
	if err != nil {
		fail(err)
	}
	for l := range m.Layers { // a bf16 checkpoint's values
		for t := range m.Layers[l].Lin {
			w := m.Layers[l].Lin[t].W
			for i, v := range w {
				w[i] = math.Float32frombits(math.Float32bits(v) &^ 0xffff)
			}
		}
	}
	held := 0
	if mode == "bf16" {
		held = nn.HoldBF16(m)
	}
	runtime.GC()
	debug.FreeOSMemory()
	r := rand.New(rand.NewPCG(2, 2))
	prompt := make([]int, 16)
	for i := range prompt {
		prompt[i] = r.IntN(cfg.Vocab)
	}
	g := m.NewGen(prompt, nil, 1, nn.SampleParams{MaxTokens: steps + 8}, false, 0)
	for !g.Prefilled() {
		g.Prefill()
	}
	seqs := []*nn.GenSeq[float32]{g.Start()}
	for range 4 {
		m.Decode(seqs)
	}
	rss := vmRSS()
	c0, t0 := cpuSeconds(), time.Now()
	for range steps {
		m.Decode(seqs)
	}
	wall, cpu := time.Since(t0).Seconds(), cpuSeconds()-c0
	sum := 0.0
	for _, s := range g.Out {
		for _, lp := range s.LogProbs {
			sum += lp
		}
	}
	return result{Mode: mode, RSSMiB: rss, TokS: float64(steps) / wall, TokCPUS: float64(steps) / cpu, Held: held, Checksum: sum}
}

func vmRSS() float64 {
	b, _ := os.ReadFile("/proc/self/status")
	for _, l := range strings.Split(string(b), "\n") {
		if f := strings.Fields(l); len(f) >= 2 && f[0] == "VmRSS:" {
			kb, _ := strconv.ParseFloat(f[1], 64)
			return kb / 1024
		}
	}
	return math.NaN()
}

func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "bf16bench:", err)
	os.Exit(1)
}
