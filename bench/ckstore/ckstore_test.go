package ckstore

import (
	"context"
	"crypto/rand"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/ckstore/s3test"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// qwen3LoraParams is the parameter count of a rank-32 LoRA on every attention and MLP
// projection of Qwen3-0.6B (28 layers; hidden 1024; 16×128 query and 8×128 key/value
// heads; MLP 3072): 20.2 M.
const qwen3LoraParams = 28 * 32 * ((1024 + 2048) + 2*(1024+1024) + (2048 + 1024) + 3*(1024+3072))

// shaped is the reference engine with SaveAdapter and LoadAdapter replaced: a save copies a
// Qwen3-0.6B-shaped rank-32 checkpoint (float32 adapter, 80.7 MB, and Adam moments, 161
// MB) from a template folder into the save's folder, as a backend writing its tensors
// would; a load reads every file through, as a safetensors loader would.
type shaped struct {
	backends.Backend
	template string
}

type shapedTrainer struct {
	backends.Trainer
	template string
}

func (s shaped) Trainer() backends.Trainer { return shapedTrainer{s.Backend.Trainer(), s.template} }

func (s shapedTrainer) SaveAdapter(_ context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	entries, err := os.ReadDir(s.template)
	if err != nil {
		return nil, err
	}
	if err := os.MkdirAll(req.GetDir(), 0o755); err != nil {
		return nil, err
	}
	for _, e := range entries {
		if e.Name() == "optimizer.safetensors" && !req.GetIncludeOptimizer() {
			continue
		}
		if err := copyFile(filepath.Join(s.template, e.Name()), filepath.Join(req.GetDir(), e.Name())); err != nil {
			return nil, err
		}
	}
	return &backendv1.SaveAdapterResponse{}, nil
}

func (s shapedTrainer) LoadAdapter(_ context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	entries, err := os.ReadDir(req.GetDir())
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		f, err := os.Open(filepath.Join(req.GetDir(), e.Name()))
		if err != nil {
			return nil, err
		}
		_, err = io.Copy(io.Discard, f)
		f.Close()
		if err != nil {
			return nil, err
		}
	}
	return &backendv1.LoadAdapterResponse{}, nil
}

func copyFile(src, dst string) error {
	in, err := os.Open(src)
	if err != nil {
		return err
	}
	defer in.Close()
	out, err := os.Create(dst)
	if err != nil {
		return err
	}
	if _, err := io.Copy(out, in); err != nil {
		out.Close()
		return err
	}
	return out.Close()
}

// writeTemplate writes the shaped checkpoint's files (random bytes) into dir.
func writeTemplate(t *testing.T, dir string) {
	t.Helper()
	require.NoError(t, os.MkdirAll(dir, 0o755))
	for name, size := range map[string]int64{"adapter_model.safetensors": 4 * qwen3LoraParams, "optimizer.safetensors": 2 * 4 * qwen3LoraParams} {
		f, err := os.Create(filepath.Join(dir, name))
		require.NoError(t, err)
		_, err = io.CopyN(f, rand.Reader, size)
		require.NoError(t, err)
		require.NoError(t, f.Close())
	}
	require.NoError(t, os.WriteFile(filepath.Join(dir, "adapter_config.json"), []byte(`{"peft_type":"LORA","r":32,"lora_alpha":32,"target_modules":["q_proj","k_proj","v_proj","o_proj","gate_proj","up_proj","down_proj"]}`), 0o644))
}

// result is one row: the times of iterations saves and loads.
type result struct {
	saves, cold, warm []time.Duration
	bytes             int64
}

// measure opens a core on the checkpoint store cks (nil: the local folder) with engine be,
// creates a run, and times n iterations of: save the run's training checkpoint (an
// overwrite after the first, so each is a new generation), load_state it (for S3 the first
// load of a generation fetches it into the cache: cold), load_state it again (warm).
func measure(t *testing.T, be backends.Backend, cks ckstore.Store, n int) result {
	t.Helper()
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	defer st.Close()
	c, err := core.New(t.Context(), st, be, core.Options{DataDir: dir, CheckpointStore: cks})
	require.NoError(t, err)
	defer c.Close()
	svc := c.Services()
	ctx := auth.WithWorkspace(t.Context(), "bench")
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(10 * time.Minute)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	run := wait(svc.Training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 8, Seed: 1, TrainAttn: true, TrainMlp: true},
	})).GetTrainingRunId()
	var r result
	// One untimed round first: the server's first write to a bucket allocates its storage
	// (seconds on weed), which is not what a save costs.
	for i := -1; i < n; i++ {
		start := time.Now()
		done := wait(svc.Training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "bench", Overwrite: i > -1}))
		if i < 0 {
			continue
		}
		r.saves = append(r.saves, time.Since(start))
		r.bytes = done.GetSaveWeights().GetCheckpoint().GetSizeBytes()
		path := done.GetSaveWeights().GetPath()
		for _, into := range []*[]time.Duration{&r.cold, &r.warm} {
			start = time.Now()
			wait(svc.Training.LoadWeights(ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path, WithOptimizer: true}))
			*into = append(*into, time.Since(start))
		}
	}
	return r
}

// baseline times n saves of a run's training checkpoint by the backend alone into a fresh
// folder, each file then fsynced: what a save cost before the checkpoint store, when the
// backend wrote the checkpoint's own folder.
func baseline(t *testing.T, be backends.Backend, n int) []time.Duration {
	t.Helper()
	ctx := t.Context()
	_, err := be.Trainer().CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "baseline", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 8, Seed: 1, TrainAttn: true, TrainMlp: true}})
	require.NoError(t, err)
	defer be.Trainer().DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: "baseline"})
	var out []time.Duration
	for i := -1; i < n; i++ {
		dir := filepath.Join(t.TempDir(), "ck")
		start := time.Now()
		_, err := be.Trainer().SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "baseline", Dir: dir, IncludeOptimizer: true})
		require.NoError(t, err)
		entries, err := os.ReadDir(dir)
		require.NoError(t, err)
		for _, e := range entries {
			f, err := os.Open(filepath.Join(dir, e.Name()))
			require.NoError(t, err)
			require.NoError(t, f.Sync())
			f.Close()
		}
		if i >= 0 {
			out = append(out, time.Since(start))
		}
	}
	return out
}

func p50(d []time.Duration) time.Duration {
	s := slices.Clone(d)
	slices.Sort(s)
	return s[len(s)/2]
}

func maxOf(d []time.Duration) time.Duration { return slices.Max(d) }

// TestCheckpointStore prints, for loops/tiny and the 0.6B-shaped checkpoint, the save and
// load times through the core on the local folder and on S3, side by side.
func TestCheckpointStore(t *testing.T) {
	if os.Getenv("LOOPS_BENCH") == "" {
		t.Skip("set LOOPS_BENCH=1 to run the checkpoint store benchmark")
	}
	iters := func(env string, def int) int {
		if v, err := strconv.Atoi(os.Getenv(env)); err == nil && v > 0 {
			return v
		}
		return def
	}
	srv := s3test.Start(t)
	srv.SetEnv(t)
	bucket := srv.NewBucket(t)
	models := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(models, "models", "loops-tiny")))
	eng, err := reference.New(reference.Options{DataDir: models, Threads: 1})
	require.NoError(t, err)
	template := filepath.Join(t.TempDir(), "qwen3-0.6b-r32")
	writeTemplate(t, template)

	var b strings.Builder
	fmt.Fprintf(&b, "\n| checkpoint | store | size | save p50 | save max | load p50 (first) | load max (first) | load p50 (again) |\n|---|---|---|---|---|---|---|---|\n")
	for _, m := range []struct {
		name string
		be   backends.Backend
		n    int
	}{
		{"loops/tiny rank 8", eng, iters("LOOPS_BENCH_TINY_ITERS", 20)},
		{"Qwen3-0.6B-shaped rank 32", shaped{eng, template}, iters("LOOPS_BENCH_LARGE_ITERS", 5)},
	} {
		base := baseline(t, m.be, m.n)
		ms := func(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d)/1e6) }
		fmt.Fprintf(&b, "| %s | baseline: backend writes a folder + fsync | | %s | %s | | | |\n", m.name, ms(p50(base)), ms(maxOf(base)))
		for _, where := range []string{"local folder", "S3 (weed)"} {
			var cks ckstore.Store
			if where != "local folder" {
				cks, err = ckstore.Open(t.Context(), fmt.Sprintf("s3://%s/%s", bucket, strings.NewReplacer("/", "-", " ", "-").Replace(m.name)), ckstore.Options{})
				require.NoError(t, err)
			}
			r := measure(t, m.be, cks, m.n)
			fmt.Fprintf(&b, "| %s | %s | %.1f MB | %s | %s | %s | %s | %s |\n", m.name, where, float64(r.bytes)/1e6,
				ms(p50(r.saves)), ms(maxOf(r.saves)), ms(p50(r.cold)), ms(maxOf(r.cold)), ms(p50(r.warm)))
		}
	}
	t.Log(b.String())
}
