// Command fbbench measures the reference engine's forward_backward and sampling throughput
// on one model folder, the way bench/reference/torch_compare.py measures PyTorch on the same
// folder. It prints one JSON object (with -json) or a short text report.
//
//	go run ./bench/reference/cmd/fbbench -model DIR -json
//	go run ./bench/reference/cmd/fbbench -write-tiny DIR   # writes loops/tiny and exits
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"runtime/pprof"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/loops-dev/loops/backends/reference/nn"
	"github.com/loops-dev/loops/backends/tiny"
)

type result struct {
	Model       string  `json:"model"`
	Params      int     `json:"params"`
	Kernel      string  `json:"kernel"`
	Threads     int     `json:"threads"`
	LoadSeconds float64 `json:"load_seconds"`

	FBBatch        int       `json:"fb_batch"`
	FBSeqLen       int       `json:"fb_seq_len"`
	FBSeconds      []float64 `json:"fb_seconds,omitempty"`
	FBTokensPerSec float64   `json:"fb_tokens_per_s,omitempty"`
	// FBCPUSeconds is the process's CPU time (user + system, all threads) of each timed
	// step; FBTokensPerCPUSec divides by their median (on a loaded machine the wall
	// clock counts the time other processes hold the cores, CPU time does not).
	FBCPUSeconds      []float64 `json:"fb_cpu_seconds,omitempty"`
	FBTokensPerCPUSec float64   `json:"fb_tokens_per_cpu_s,omitempty"`
	FBLoss            float64   `json:"fb_loss_sum,omitempty"`
	// FBFlopsPerToken counts a forward_backward token's floating-point operations: 4 per
	// weight of every linear layer and the lm_head (2 forward, 2 for the input gradient;
	// the base weights are frozen, and the rank-r LoRA terms are left out), plus attention:
	// 4·heads·head_dim per key forward (scores and weighted sum) and twice that backward,
	// over the (n+1)/2 keys a token of an n-token sequence sees on average.
	FBFlopsPerToken float64 `json:"fb_flops_per_token,omitempty"`
	// KernelGFLOPs is the SGEMM's own rate on this model's largest layer product (all the
	// batch's rows × the MLP width × the hidden size, A·Bᵀ), the roofline the share is of.
	KernelGFLOPs  float64 `json:"kernel_gflops,omitempty"`
	RooflineShare float64 `json:"fb_roofline_share,omitempty"`

	Samples            int       `json:"samples"`
	PromptLen          int       `json:"prompt_len"`
	NewTokens          int       `json:"new_tokens"`
	SampleSeconds      []float64 `json:"sample_seconds,omitempty"`
	SampleTokensPerSec float64   `json:"sample_tokens_per_s,omitempty"`
	// SampleCPUSeconds and SampleTokensPerCPUSec: as FBCPUSeconds, for sampling.
	SampleCPUSeconds      []float64 `json:"sample_cpu_seconds,omitempty"`
	SampleTokensPerCPUSec float64   `json:"sample_tokens_per_cpu_s,omitempty"`

	PeakRSSMiB float64 `json:"peak_rss_mib"`
}

func main() {
	var (
		model     = flag.String("model", "", "model folder (config.json + *.safetensors)")
		writeTiny = flag.String("write-tiny", "", "write the loops/tiny model folder to this directory and exit")
		tokFile   = flag.String("tokens", "", "JSON file {\"fb\": [[ids]...], \"prompt\": [ids]} (default: random ids from seed 1)")
		batch     = flag.Int("batch", 4, "forward_backward sequences")
		seqLen    = flag.Int("seq", 128, "forward_backward tokens per sequence")
		samples   = flag.Int("samples", 4, "samples per sampling request")
		promptLen = flag.Int("prompt", 32, "prompt tokens")
		newTok    = flag.Int("new", 64, "new tokens per sample")
		rank      = flag.Int("rank", 16, "LoRA rank (attn + mlp)")
		iters     = flag.Int("iters", 3, "timed iterations of each measurement")
		warmup    = flag.Int("warmup", 1, "untimed iterations first")
		threads   = flag.Int("threads", runtime.NumCPU(), "kernel goroutines")
		modes     = flag.String("modes", "fb,sample", "what to measure: fb, sample or both")
		jsonOut   = flag.Bool("json", false, "print JSON")
		cpuProf   = flag.String("cpuprofile", "", "write a CPU profile of the timed iterations")
	)
	flag.Parse()
	if *writeTiny != "" {
		if err := tiny.Write(*writeTiny); err != nil {
			fail(err)
		}
		return
	}
	if *model == "" {
		fail(fmt.Errorf("-model is required"))
	}
	nn.SetThreads(*threads)
	t0 := time.Now()
	m, err := nn.Load[float32](*model)
	if err != nil {
		fail(err)
	}
	runtime.GC()
	res := result{Model: *model, Params: m.ParamCount(), Kernel: nn.KernelName(), Threads: *threads,
		LoadSeconds: time.Since(t0).Seconds(), FBBatch: *batch, FBSeqLen: *seqLen,
		Samples: *samples, PromptLen: *promptLen, NewTokens: *newTok}
	V := m.Cfg.Vocab
	var fbTok [][]int
	var prompt []int
	if *tokFile != "" {
		b, err := os.ReadFile(*tokFile)
		if err != nil {
			fail(err)
		}
		var tf struct {
			FB     [][]int `json:"fb"`
			Prompt []int   `json:"prompt"`
		}
		if err := json.Unmarshal(b, &tf); err != nil {
			fail(err)
		}
		fbTok, prompt = tf.FB, tf.Prompt
		res.FBBatch, res.PromptLen = len(fbTok), len(prompt)
		if len(fbTok) > 0 {
			res.FBSeqLen = len(fbTok[0]) - 1
		}
	} else {
		r := rand.New(rand.NewPCG(1, 1))
		for s := 0; s < *batch; s++ {
			t := make([]int, *seqLen+1)
			for i := range t {
				t[i] = r.IntN(V)
			}
			fbTok = append(fbTok, t)
		}
		for i := 0; i < *promptLen; i++ {
			prompt = append(prompt, r.IntN(V))
		}
	}
	ad, err := nn.NewAdapter(m, nn.LoraConfig{Rank: *rank, Seed: 1, Attn: true, MLP: true})
	if err != nil {
		fail(err)
	}
	if *cpuProf != "" {
		f, err := os.Create(*cpuProf)
		if err != nil {
			fail(err)
		}
		_ = pprof.StartCPUProfile(f)
		defer pprof.StopCPUProfile()
	}
	want := map[string]bool{}
	for _, s := range strings.FieldsFunc(*modes, func(r rune) bool { return r == ',' }) {
		want[s] = true
	}
	if want["fb"] {
		// Sequence s of n+1 ids: inputs ids[:n], targets ids[1:] (next-token prediction).
		var seqs []nn.Seq[float32]
		tokens := 0
		for _, t := range fbTok {
			n := len(t) - 1
			seqs = append(seqs, nn.Seq[float32]{Tokens: t[:n], Targets: t[1:], K: 1, Adapter: ad})
			tokens += n
		}
		ce := func(_, _, _ int, lp float64) (float64, float64) { return -lp, -1 }
		for i := 0; i < *warmup+*iters; i++ {
			t, c := time.Now(), cpuSeconds()
			outs := m.ForwardBackward(seqs, ce, true)
			d, dc := time.Since(t).Seconds(), cpuSeconds()-c
			ad.ZeroGrad()
			if i == 0 {
				for _, o := range outs {
					for _, l := range o.Loss {
						res.FBLoss += l
					}
				}
			}
			if i >= *warmup {
				res.FBSeconds = append(res.FBSeconds, d)
				res.FBCPUSeconds = append(res.FBCPUSeconds, dc)
			}
		}
		res.FBTokensPerSec = float64(tokens) / median(res.FBSeconds)
		res.FBTokensPerCPUSec = float64(tokens) / median(res.FBCPUSeconds)
		res.FBFlopsPerToken = fbFlopsPerToken(m.Cfg, float64(res.FBSeqLen))
		res.KernelGFLOPs = kernelGFLOPs(tokens, m.Cfg.Inter, m.Cfg.Hidden)
		res.RooflineShare = res.FBTokensPerSec * res.FBFlopsPerToken / (res.KernelGFLOPs * 1e9)
	}
	if want["sample"] {
		seed := uint64(1)
		for i := 0; i < *warmup+*iters; i++ {
			t, c := time.Now(), cpuSeconds()
			out, _ := m.Sample(prompt, ad, *samples, nn.SampleParams{MaxTokens: *newTok, Temperature: 1, TopP: 1, Seed: &seed}, false, 0)
			d, dc := time.Since(t).Seconds(), cpuSeconds()-c
			gen := 0
			for _, s := range out {
				gen += len(s.Tokens)
			}
			if i >= *warmup {
				res.SampleSeconds = append(res.SampleSeconds, d)
				res.SampleTokensPerSec = float64(gen) / median(res.SampleSeconds)
				res.SampleCPUSeconds = append(res.SampleCPUSeconds, dc)
				res.SampleTokensPerCPUSec = float64(gen) / median(res.SampleCPUSeconds)
			}
		}
	}
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	res.PeakRSSMiB = float64(ru.Maxrss) / 1024 // Linux: KiB
	if *jsonOut {
		b, _ := json.Marshal(res)
		fmt.Println(string(b))
		return
	}
	fmt.Printf("model %s (%d params), kernel %s, %d threads, load %.1fs\n", res.Model, res.Params, res.Kernel, res.Threads, res.LoadSeconds)
	if want["fb"] {
		fmt.Printf("forward_backward %dx%d: %.1f tokens/s (steps %v s), loss sum %.4f\n", res.FBBatch, res.FBSeqLen, res.FBTokensPerSec, res.FBSeconds, res.FBLoss)
		fmt.Printf("  %.3f GFLOP/token, kernel %.1f GFLOP/s: %.0f%% of the kernel's roofline\n", res.FBFlopsPerToken/1e9, res.KernelGFLOPs, 100*res.RooflineShare)
	}
	if want["sample"] {
		fmt.Printf("sample %d x %d (prompt %d): %.1f tokens/s (runs %v s)\n", res.Samples, res.NewTokens, res.PromptLen, res.SampleTokensPerSec, res.SampleSeconds)
	}
	fmt.Printf("peak RSS %.0f MiB\n", res.PeakRSSMiB)
}

// fbFlopsPerToken is result.FBFlopsPerToken for sequences of n tokens.
func fbFlopsPerToken(c nn.Config, n float64) float64 {
	qd, kvd := float64(c.Heads*c.HeadDim), float64(c.KVHeads*c.HeadDim)
	d, f := float64(c.Hidden), float64(c.Inter)
	var linear float64
	for l := range c.Layers {
		mlp := 3 * d * f
		if c.SparseLayer(l) { // the router and the top-k experts a token goes through
			mlp = float64(c.NumExperts)*d + float64(c.TopK)*3*d*float64(c.MoEInter)
		}
		linear += d*(qd+2*kvd) + qd*d + mlp
	}
	linear += float64(c.Vocab) * d
	attn := float64(c.Layers) * 12 * float64(c.Heads*c.HeadDim) * (n + 1) / 2
	return 4*linear + attn
}

// kernelGFLOPs times nn.MatMulT on rows×inter×hidden (the median of five after one
// warm-up) and returns its GFLOP/s.
func kernelGFLOPs(rows, inter, hidden int) float64 {
	r := rand.New(rand.NewPCG(2, 2))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	a, b, c := fill(rows*hidden), fill(inter*hidden), make([]float32, rows*inter)
	var secs []float64
	for i := range 6 {
		t := time.Now()
		nn.MatMulT(c, a, b, rows, inter, hidden, false)
		if i > 0 {
			secs = append(secs, time.Since(t).Seconds())
		}
	}
	return 2 * float64(rows) * float64(inter) * float64(hidden) / median(secs) / 1e9
}

// cpuSeconds is the process's CPU time so far, user + system, all threads.
func cpuSeconds() float64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano()).Seconds()
}

func median(x []float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "fbbench:", err)
	os.Exit(1)
}
