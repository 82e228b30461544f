// Command slotbench measures adapter offload and restore through the loops.backend.v1
// trainer protocol on the reference engine: offload = SaveAdapter(include_optimizer,
// include_gradients) into a folder + DeleteAdapter; restore = LoadAdapter(load_optimizer,
// load_gradients) of the same id (re-created from the folder). Each is timed with a
// gradient pending (one forward_backward before it), next to the median forward_backward
// of the same adapter, and the restored state is checked bit for bit (weights, moments,
// gradient) against the state before the offload.
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends/reference"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

type spill struct {
	Root          string  `json:"root"`
	Bytes         int64   `json:"state_bytes"`
	OffloadMillis float64 `json:"offload_ms"`
	RestoreMillis float64 `json:"restore_ms"`
	RatioToFB     float64 `json:"offload_plus_restore_over_fb"`
}

type result struct {
	Model      string  `json:"model"`
	Rank       int     `json:"rank"`
	Targets    string  `json:"targets"`
	Tokens     int     `json:"fb_tokens"`
	Threads    int     `json:"threads"`
	FBMillis   float64 `json:"fb_ms"`
	Spills     []spill `json:"spills"`
	Iterations int     `json:"iterations"`
}

func main() {
	var (
		model   = flag.String("model", "loops/tiny", "model: loops/tiny or a Hugging Face folder (config.json + *.safetensors)")
		dataDir = flag.String("data-dir", "", "engine data folder (default: a temp folder)")
		roots   = flag.String("spill", "/dev/shm,"+os.TempDir(), "comma-separated folders to offload into (tmpfs = host memory; a disk folder = disk, read back from the page cache)")
		batch   = flag.Int("batch", 4, "forward_backward sequences")
		seqLen  = flag.Int("seq", 128, "forward_backward tokens per sequence")
		rank    = flag.Int("rank", 16, "LoRA rank")
		unembed = flag.Bool("unembed", false, "also train lm_head")
		iters   = flag.Int("iters", 5, "timed iterations (medians are reported)")
		threads = flag.Int("threads", runtime.NumCPU(), "kernel goroutines")
		jsonOut = flag.Bool("json", false, "print JSON")
	)
	flag.Parse()
	ctx := context.Background()
	dd := *dataDir
	if dd == "" {
		d, err := os.MkdirTemp("", "slotbench-")
		check(err)
		defer os.RemoveAll(d)
		dd = d
	}
	e, err := reference.New(reference.Options{DataDir: dd, Models: []string{*model}, Threads: *threads, MaxLoraRank: max(64, *rank)})
	check(err)
	caps, err := e.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	check(err)
	vocab := int(caps.GetModels()[0].GetVocabSize())
	const id = "slotbench"
	lc := &loopsv1.LoraConfig{Rank: int32(*rank), Seed: 1, TrainAttn: true, TrainMlp: true, TrainUnembed: *unembed}
	_, err = e.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: id, BaseModel: *model, Lora: lc})
	check(err)

	r := rand.New(rand.NewPCG(1, 1))
	item := &backendv1.ForwardBackwardItem{AdapterId: id, LossFn: "cross_entropy"}
	for range *batch {
		t := make([]int32, *seqLen+1)
		for i := range t {
			t[i] = int32(r.IntN(vocab))
		}
		tg := make([]int64, *seqLen)
		w := make([]float32, *seqLen)
		for i := range tg {
			tg[i], w[i] = int64(t[i+1]), 1
		}
		item.Data = append(item.Data, &loopsv1.Datum{Tokens: t[:*seqLen], LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{int64(*seqLen)}, Int64Data: tg},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{int64(*seqLen)}, Float32Data: w},
		}})
	}
	fb := func() time.Duration {
		t0 := time.Now()
		resp, err := e.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{item}})
		check(err)
		if er := resp.GetResults()[0].GetError(); er != nil {
			check(fmt.Errorf("forward_backward: %s", er.GetMessage()))
		}
		return time.Since(t0)
	}
	// one step first, so the Adam moments are not zero
	fb()
	_, err = e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: &loopsv1.AdamParams{LearningRate: 1e-4}})
	check(err)

	res := result{Model: *model, Rank: *rank, Targets: "attn,mlp", Tokens: *batch * *seqLen, Threads: *threads, Iterations: *iters}
	if *unembed {
		res.Targets += ",lm_head"
	}
	var fbs []float64
	for range *iters {
		fbs = append(fbs, ms(fb()))
	}
	res.FBMillis = median(fbs)
	n := 0
	for _, root := range strings.Split(*roots, ",") {
		if root == "" {
			continue
		}
		base, err := os.MkdirTemp(root, "slotbench-spill-")
		check(err)
		sp := spill{Root: root}
		var offs, ress []float64
		for range *iters {
			fb() // a pending gradient: the state to move is complete
			n++
			dir := filepath.Join(base, fmt.Sprintf("%d", n))
			before := snapshot(ctx, e, id, filepath.Join(base, fmt.Sprintf("before-%d", n)))
			t0 := time.Now()
			sr, err := e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: dir, IncludeOptimizer: true, IncludeGradients: true})
			check(err)
			_, err = e.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: id})
			check(err)
			t1 := time.Now()
			_, err = e.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: id, Dir: dir, LoadOptimizer: true, LoadGradients: true})
			check(err)
			t2 := time.Now()
			offs, ress = append(offs, ms(t1.Sub(t0))), append(ress, ms(t2.Sub(t1)))
			sp.Bytes = sr.GetSizeBytes()
			if after := snapshot(ctx, e, id, filepath.Join(base, fmt.Sprintf("after-%d", n))); !bytes.Equal(before, after) {
				check(fmt.Errorf("the restored state differs from the offloaded one"))
			}
			// the step zeroes the gradient; the next iteration accumulates a fresh one
			_, err = e.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: id, Adam: &loopsv1.AdamParams{LearningRate: 1e-4}})
			check(err)
		}
		_ = os.RemoveAll(base)
		sp.OffloadMillis, sp.RestoreMillis = median(offs), median(ress)
		sp.RatioToFB = (sp.OffloadMillis + sp.RestoreMillis) / res.FBMillis
		res.Spills = append(res.Spills, sp)
	}
	if *jsonOut {
		b, _ := json.MarshalIndent(res, "", "  ")
		fmt.Println(string(b))
		return
	}
	fmt.Printf("model %s, LoRA rank %d on %s, forward_backward %d tokens, %d threads, median of %d\n",
		res.Model, res.Rank, res.Targets, res.Tokens, res.Threads, res.Iterations)
	fmt.Printf("forward_backward: %.1f ms\n", res.FBMillis)
	fmt.Printf("%-14s %12s %12s %12s %18s\n", "spill folder", "state MiB", "offload ms", "restore ms", "(off+restore)/fb")
	for _, s := range res.Spills {
		fmt.Printf("%-14s %12.2f %12.2f %12.2f %18.3f\n", s.Root, float64(s.Bytes)/(1<<20), s.OffloadMillis, s.RestoreMillis, s.RatioToFB)
	}
}

// snapshot returns the adapter's weights, moments and gradient as saved bytes (untimed).
func snapshot(ctx context.Context, e *reference.Engine, id, dir string) []byte {
	_, err := e.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: id, Dir: dir, IncludeOptimizer: true, IncludeGradients: true})
	check(err)
	var out []byte
	for _, f := range []string{"adapter_model.safetensors", "optimizer.safetensors", "gradients.safetensors"} {
		b, err := os.ReadFile(filepath.Join(dir, f))
		check(err)
		out = append(out, b...)
	}
	check(os.RemoveAll(dir))
	return out
}

func ms(d time.Duration) float64 { return float64(d.Microseconds()) / 1e3 }

func median(x []float64) float64 {
	s := append([]float64(nil), x...)
	sort.Float64s(s)
	if len(s) == 0 {
		return 0
	}
	if len(s)%2 == 1 {
		return s[len(s)/2]
	}
	return (s[len(s)/2-1] + s[len(s)/2]) / 2
}

func check(err error) {
	if err != nil {
		fmt.Fprintln(os.Stderr, "slotbench:", err)
		os.Exit(1)
	}
}
