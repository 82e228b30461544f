// Command prefillbench measures the reference engine's prefill and forward pass against its
// own SGEMM in the same process: per round, a prefill of -prompt tokens (and a forward
// pass of forward_backward, without backward, over -fb-batch×-fb-seq tokens) of a
// Qwen3-0.6B-shaped model with random weights, then nn.MatMulT on every linear layer's
// shape at the same row counts; rounds alternate, and the report gives the medians and
// the end-to-end FLOP/s as a share of the kernel's.
//
//	go run ./bench/reference/cmd/prefillbench -layers 4 -rounds 5 [-cpuprofile f.prof]
package main

import (
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
)

func main() {
	var (
		layers   = flag.Int("layers", 4, "decoder layers (Qwen3-0.6B has 28)")
		prompt   = flag.Int("prompt", 700, "prompt tokens to prefill")
		fbBatch  = flag.Int("fb-batch", 4, "forward pass: sequences")
		fbSeq    = flag.Int("fb-seq", 128, "forward pass: tokens per sequence")
		rounds   = flag.Int("rounds", 5, "timed rounds (after one warm-up)")
		threads  = flag.Int("threads", runtime.NumCPU(), "kernel goroutines")
		modes    = flag.String("modes", "prefill,fwd", "prefill, fwd or both")
		cpuProf  = flag.String("cpuprofile", "", "write a CPU profile of the timed end-to-end runs (the kernel's runs are then left out)")
		kernProf = flag.String("kernelprofile", "", "write a CPU profile of the timed kernel runs (the end-to-end runs are then left out)")
	)
	flag.Parse()
	nn.SetThreads(*threads)
	cfg := nn.Config{Architectures: []string{"Qwen3ForCausalLM"}, ModelType: "qwen3", Vocab: 151936, Hidden: 1024,
		Layers: *layers, Heads: 16, KVHeads: 8, HeadDim: 128, Inter: 3072, MaxPos: 4096, RopeTheta: 1e6, Eps: 1e-6,
		Tied: true, HiddenAct: "silu"}
	m, err := nn.NewRandom[float32](cfg, nn.RandomOptions{QKNorm: true, Std: 0.02, Seed: 1})
	if err != nil {
		fail(err)
	}
	r := rand.New(rand.NewPCG(1, 1))
	toks := make([]int, *prompt)
	for i := range toks {
		toks[i] = r.IntN(cfg.Vocab)
	}
	var seqs []nn.Seq[float32]
	for range *fbBatch {
		t := make([]int, *fbSeq+1)
		for i := range t {
			t[i] = r.IntN(cfg.Vocab)
		}
		seqs = append(seqs, nn.Seq[float32]{Tokens: t[:*fbSeq], Targets: t[1:], K: 1})
	}
	want := map[string]bool{}
	for _, s := range strings.FieldsFunc(*modes, func(r rune) bool { return r == ',' }) {
		want[s] = true
	}
	prefill := func() {
		seed := uint64(1)
		g := m.NewGen(toks, nil, 1, nn.SampleParams{MaxTokens: 1, Temperature: 1, Seed: &seed}, false, 0)
		for !g.Prefilled() {
			g.Prefill()
		}
	}
	ce := func(_, _, _ int, lp float64) (float64, float64) { return -lp, -1 }
	fwd := func() { m.ForwardBackward(seqs, ce, false) }

	// The prefill runs its prompt in chunks of nn.PrefillChunk rows; the forward pass its
	// batch's rows at once.
	var chunks []int
	for p := 0; p < *prompt; p += nn.PrefillChunk {
		chunks = append(chunks, min(nn.PrefillChunk, *prompt-p))
	}
	fbRows := *fbBatch * *fbSeq
	kern := newKernelRef(cfg)

	// Each measure is taken in wall seconds and in CPU seconds of the process (user +
	// system): on a loaded machine the wall clock counts time other processes hold the
	// cores, the CPU time only this process's work (spinning workers included).
	type meas struct{ e2e, kern, e2eCPU, kernCPU []float64 }
	res := map[string]*meas{"prefill": {}, "fwd": {}}
	var prof *os.File
	for i := 0; i <= *rounds; i++ {
		if i == 1 && (*cpuProf != "" || *kernProf != "") {
			prof, _ = os.Create(*cpuProf + *kernProf)
			_ = pprof.StartCPUProfile(prof)
		}
		for _, name := range []string{"prefill", "fwd"} {
			if !want[name] {
				continue
			}
			e2e, rows, head := prefill, chunks, []int{1}
			if name == "fwd" {
				e2e, rows, head = fwd, []int{fbRows}, headChunks(fbRows)
			}
			d, dc := 1.0, 1.0
			if *kernProf == "" {
				d, dc = timeIt(e2e)
			}
			k, kc := 1.0, 1.0
			if *cpuProf == "" {
				k, kc = timeIt(func() { kern.run(rows, head) })
			}
			if i > 0 {
				ms := res[name]
				ms.e2e, ms.kern = append(ms.e2e, d), append(ms.kern, k)
				ms.e2eCPU, ms.kernCPU = append(ms.e2eCPU, dc), append(ms.kernCPU, kc)
			}
		}
	}
	if prof != nil {
		pprof.StopCPUProfile()
		prof.Close()
	}
	fmt.Printf("kernel %s, %d threads, %d layers\n", nn.KernelName(), *threads, *layers)
	report := func(name string, rows, head []int, lens []int) {
		ms := res[name]
		lin := kern.flops(rows, head)
		total := lin
		for _, n := range lens { // attention: scores and weighted sum over the keys seen, causal
			total += float64(cfg.Layers) * 4 * float64(cfg.Heads*cfg.HeadDim) * float64(n) * float64(n+1) / 2
		}
		var shares, sharesCPU []float64
		for i := range ms.e2e {
			shares = append(shares, (total/ms.e2e[i])/(lin/ms.kern[i]))
			sharesCPU = append(sharesCPU, (total/ms.e2eCPU[i])/(lin/ms.kernCPU[i]))
		}
		if *cpuProf != "" {
			fmt.Printf("%-8s %.2f GFLOP | wall %.3f s, cpu %.3f s (the kernel is not run while profiling)\n",
				name, total/1e9, median(ms.e2e), median(ms.e2eCPU))
			return
		}
		if *kernProf != "" {
			fmt.Printf("%-8s kernel %.2f GFLOP | wall %.3f s, cpu %.3f s (the end-to-end run is left out while profiling)\n",
				name, lin/1e9, median(ms.kern), median(ms.kernCPU))
			return
		}
		e, k := median(ms.e2e), median(ms.kern)
		ec, kc := median(ms.e2eCPU), median(ms.kernCPU)
		fmt.Printf("%-8s %.2f GFLOP | wall: %.3f s (%.1f GFLOP/s), kernel at the same shapes %.3f s (%.1f GFLOP/s), share %.0f%% %v\n",
			name, total/1e9, e, total/e/1e9, k, lin/k/1e9, 100*median(shares), pct(shares))
		fmt.Printf("%-8s %.2f GFLOP | cpu:  %.3f s (%.1f GFLOP/cpu-s), kernel %.3f s (%.1f GFLOP/cpu-s), share %.0f%% %v\n",
			name, total/1e9, ec, total/ec/1e9, kc, lin/kc/1e9, 100*median(sharesCPU), pct(sharesCPU))
	}
	if want["prefill"] {
		report("prefill", chunks, []int{1}, []int{*prompt})
	}
	if want["fwd"] {
		lens := make([]int, *fbBatch)
		for i := range lens {
			lens[i] = *fbSeq
		}
		report("fwd", []int{fbRows}, headChunks(fbRows), lens)
	}
}

// headChunks is how ForwardBackward cuts rows for the lm_head (nn's headChunk = 256).
func headChunks(rows int) []int {
	var out []int
	for r := 0; r < rows; r += 256 {
		out = append(out, min(256, rows-r))
	}
	return out
}

// kernelRef holds operands for nn.MatMulT at a layer's linear shapes.
type kernelRef struct {
	cfg    nn.Config
	shapes [][2]int // N, K of each linear product of a layer
	a, c   []float32
	w      map[[2]int][]float32
	head   []float32 // [Vocab, Hidden]
}

func newKernelRef(cfg nn.Config) *kernelRef {
	qd, kvd, d, f := cfg.Heads*cfg.HeadDim, cfg.KVHeads*cfg.HeadDim, cfg.Hidden, cfg.Inter
	k := &kernelRef{cfg: cfg, shapes: [][2]int{{qd, d}, {kvd, d}, {kvd, d}, {d, qd}, {f, d}, {f, d}, {d, f}}, w: map[[2]int][]float32{}}
	r := rand.New(rand.NewPCG(2, 2))
	for _, s := range k.shapes {
		if k.w[s] == nil {
			w := make([]float32, s[0]*s[1])
			for i := range w {
				w[i] = float32(r.NormFloat64() * 0.02)
			}
			k.w[s] = w
		}
	}
	k.head = make([]float32, cfg.Vocab*d)
	for i := range k.head {
		k.head[i] = float32(r.NormFloat64() * 0.02)
	}
	return k
}

// run runs every layer's products for each row count once per layer (cfg.Layers times),
// then the lm_head's for each row count of head, and returns the seconds.
func (k *kernelRef) run(rows, head []int) {
	for _, M := range head {
		if len(k.c) < M*k.cfg.Vocab {
			k.c = make([]float32, M*k.cfg.Vocab)
		}
		if len(k.a) < M*k.cfg.Hidden {
			k.a = make([]float32, M*k.cfg.Hidden)
		}
		nn.MatMulT(k.c[:M*k.cfg.Vocab], k.a[:M*k.cfg.Hidden], k.head, M, k.cfg.Vocab, k.cfg.Hidden, false)
	}
	for _, M := range rows {
		maxK := max(k.cfg.Hidden, k.cfg.Inter, k.cfg.Heads*k.cfg.HeadDim)
		if len(k.a) < M*maxK {
			k.a = make([]float32, M*maxK)
			for i := range k.a {
				k.a[i] = float32(i%7) * 0.1
			}
			k.c = make([]float32, max(M*maxK, len(k.c)))
		}
		for range k.cfg.Layers {
			for _, s := range k.shapes {
				nn.MatMulT(k.c[:M*s[0]], k.a[:M*s[1]], k.w[s], M, s[0], s[1], false)
			}
		}
	}
}

func (k *kernelRef) flops(rows, head []int) float64 {
	var f float64
	for _, M := range rows {
		for _, s := range k.shapes {
			f += 2 * float64(M) * float64(s[0]) * float64(s[1])
		}
	}
	f *= float64(k.cfg.Layers)
	for _, M := range head {
		f += 2 * float64(M) * float64(k.cfg.Vocab) * float64(k.cfg.Hidden)
	}
	return f
}

// timeIt runs f and returns its wall seconds and the process's CPU seconds meanwhile.
func timeIt(f func()) (wall, cpu float64) {
	c0 := cpuSeconds()
	t := time.Now()
	f()
	return time.Since(t).Seconds(), cpuSeconds() - c0
}

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

func pct(x []float64) []string {
	out := make([]string, len(x))
	for i, v := range x {
		out[i] = fmt.Sprintf("%.0f%%", 100*v)
	}
	return out
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "prefillbench:", err)
	os.Exit(1)
}
