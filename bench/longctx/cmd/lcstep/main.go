// Command lcstep runs one reference-engine training step (forward, loss, backward) of one
// long sequence and prints its time and the process's peak resident memory, as JSON: the
// Go half of bench/longctx (run.py runs it once per length and setting, each in its own
// process so that the peak is the step's).
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends/reference/nn"
)

type result struct {
	Engine        string  `json:"engine"`
	Tokens        int     `json:"tokens"`
	Checkpoint    bool    `json:"checkpoint"`
	StepSeconds   float64 `json:"step_s"`
	PeakRSSMiB    float64 `json:"peak_rss_mib"`
	RSSBeforeMiB  float64 `json:"rss_before_mib"`
	Loss          float64 `json:"loss"`
	Threads       int     `json:"threads"`
	CheckpointRow int     `json:"checkpoint_rows"`
}

func main() {
	model := flag.String("model", "", "model folder (config.json + *.safetensors)")
	tokens := flag.Int("tokens", 4096, "sequence length")
	ckpt := flag.Int("checkpoint-rows", 0, "Model.CheckpointRows: 0 the default, -1 never, N from N rows")
	rank := flag.Int("rank", 16, "LoRA rank (attention, MLP and lm_head)")
	threads := flag.Int("threads", runtime.NumCPU(), "kernel goroutines")
	flag.Parse()
	if err := run(*model, *tokens, *ckpt, *rank, *threads); err != nil {
		fmt.Fprintln(os.Stderr, "lcstep:", err)
		os.Exit(1)
	}
}

func run(dir string, n, ckpt, rank, threads int) error {
	nn.SetThreads(threads)
	m, err := nn.Load[float32](dir)
	if err != nil {
		return err
	}
	m.CheckpointRows = ckpt
	ad, err := nn.NewAdapter(m, nn.LoraConfig{Rank: rank, Seed: 1, Attn: true, MLP: true, Unembed: true})
	if err != nil {
		return err
	}
	r := rand.New(rand.NewPCG(1, 1))
	ids := make([]int, n+1)
	for i := range ids {
		ids[i] = r.IntN(m.Cfg.Vocab)
	}
	seq := []nn.Seq[float32]{{Tokens: ids[:n], Targets: ids[1:], K: 1, Adapter: ad}}
	ce := func(_, _, _ int, lp float64) (float64, float64) { return -lp, -1 }
	runtime.GC()
	before, err := status("VmRSS")
	if err != nil {
		return err
	}
	t0 := time.Now()
	out := m.ForwardBackward(seq, ce, true)
	dt := time.Since(t0)
	peak, err := status("VmHWM")
	if err != nil {
		return err
	}
	var loss float64
	for _, l := range out[0].Loss {
		loss += l
	}
	return json.NewEncoder(os.Stdout).Encode(result{Engine: "reference", Tokens: n, Checkpoint: (ckpt == 0 && n >= nn.DefaultCheckpointRows) || (ckpt > 0 && n >= ckpt),
		StepSeconds: dt.Seconds(), PeakRSSMiB: peak, RSSBeforeMiB: before, Loss: loss, Threads: threads, CheckpointRow: ckpt})
}

// status reads a /proc/self/status size (kB) as MiB.
func status(key string) (float64, error) {
	f, err := os.Open("/proc/self/status")
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), key+":"); ok {
			kb, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(v), " kB"), 64)
			return kb / 1024, err
		}
	}
	return 0, fmt.Errorf("no %s in /proc/self/status", key)
}
