package worker

import (
	"context"
	"fmt"
	"math"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"go.uber.org/goleak"

	"github.com/loops-dev/loops/backends/pools/poolstest"
	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/reference/safetensors"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// These tests start real Python workers. They run only with LOOPS_TEST_TORCH=1 (make
// test-torch sets it), so `go test ./...` stays fast and Python-free. The interpreter is
// $LOOPS_WORKER_PYTHON (make test-torch builds a venv with scripts/pyenv.sh).

func repoRoot(t testing.TB) string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Clean(filepath.Join(filepath.Dir(file), "..", ".."))
}

func needTorch(t testing.TB) {
	t.Helper()
	if os.Getenv("LOOPS_TEST_TORCH") != "1" {
		t.Skip("set LOOPS_TEST_TORCH=1 (and LOOPS_WORKER_PYTHON) to run the torch worker tests; `make test-torch` does")
	}
	if os.Getenv("LOOPS_WORKER_PYTHON") == "" {
		t.Fatal("LOOPS_TEST_TORCH=1 needs LOOPS_WORKER_PYTHON, an interpreter with torch, transformers, peft, grpcio, safetensors")
	}
}

func testOptions(t testing.TB, dataDir string) Options {
	root := repoRoot(t)
	return Options{
		DataDir:        dataDir,
		PythonPath:     filepath.Join(root, "backends", "torch") + string(os.PathListSeparator) + filepath.Join(root, "gen", "python"),
		Args:           []string{"--device", "cpu", "--threads", "2"},
		Env:            []string{"HF_HUB_OFFLINE=1", "LOOPS_WORKER_TEST_FAULTS=1", "TOKENIZERS_PARALLELISM=false"},
		AllowDirs:      []string{os.TempDir()}, // the tests' adapter folders (t.TempDir)
		HealthInterval: 300 * time.Millisecond,
		HealthTimeout:  2 * time.Second,
		HealthFailures: 3,
		RestartBackoff: 100 * time.Millisecond,
	}
}

var (
	sharedOnce sync.Once
	shared     *Backend
	sharedErr  error
	sharedDir  string
)

// sharedBackend is one local CPU worker for the tests that do not break it.
func sharedBackend(t *testing.T) *Backend {
	needTorch(t)
	sharedOnce.Do(func() {
		sharedDir, sharedErr = os.MkdirTemp("", "loops-worker-test-")
		if sharedErr != nil {
			return
		}
		shared, sharedErr = New(context.Background(), testOptions(t, sharedDir))
	})
	require.NoError(t, sharedErr)
	return shared
}

// TestTorchStrangersGetNothing: the Python worker serves the gateway that issued its
// credentials and nobody else (poolstest.CheckStrangers: no client certificate, another
// gateway's, the worker's own, plaintext; and the gateway refuses it as another pool's).
func TestTorchStrangersGetNothing(t *testing.T) {
	b := sharedBackend(t)
	_, reg := b.Pools()
	ms := reg.Members(PoolID(tiny.Name))
	require.NotEmpty(t, ms)
	poolstest.CheckStrangers(t, b.auth, PoolID(tiny.Name), ms[0].Address, sharedDir)
}

// TestMain runs the tests, closes the shared worker, and fails the run if a goroutine the
// tests started is still running then (goleak): every worker, connection, registry and
// provider the backend starts must be gone when it is closed.
func TestMain(m *testing.M) {
	code := m.Run()
	if shared != nil {
		_ = shared.Close()
		_ = os.RemoveAll(sharedDir)
	}
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintf(os.Stderr, "goleak: goroutines left running after the tests: %v\n", err)
			code = 1
		}
	}
	os.Exit(code)
}

func f32(v ...float32) *loopsv1.Tensor {
	return &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{int64(len(v))}, Float32Data: v}
}

func i64(v ...int64) *loopsv1.Tensor {
	return &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{int64(len(v))}, Int64Data: v}
}

// batch builds deterministic data for a loss: tokens of length n, targets shifted by one.
func datum(seed, n int, loss string) *loopsv1.Datum {
	toks := make([]int32, n)
	tg := make([]int64, n)
	w := make([]float32, n)
	q := make([]float32, n)
	adv := make([]float32, n)
	for i := range n {
		toks[i] = int32((seed*131 + i*37 + 7) % 509)
	}
	for i := range n {
		tg[i] = int64(toks[(i+1)%n])
		w[i] = float32((i%3)-1) * 0.7
		if i%4 == 0 {
			w[i] = 1
		}
		q[i] = -6.5 + 0.05*float32(i%7)
		adv[i] = float32(((i*seed)%5)-2) * 0.5
	}
	d := &loopsv1.Datum{Tokens: toks, LossFnInputs: map[string]*loopsv1.Tensor{"target_tokens": i64(tg...)}}
	if loss == "cross_entropy" {
		d.LossFnInputs["weights"] = f32(w...)
	} else {
		d.LossFnInputs["logprobs"] = f32(q...)
		d.LossFnInputs["advantages"] = f32(adv...)
	}
	if loss == "gspo" { // the first position stands for the prompt
		mask := make([]float32, n)
		for i := 1; i < n; i++ {
			mask[i] = 1
		}
		d.LossFnInputs["sequence_ratio_mask"] = f32(mask...)
	}
	return d
}

func maxAbsDiffOutputs(t *testing.T, a, b *backendv1.ForwardBackwardResponse) (lp, el, loss float64) {
	require.Len(t, b.Results, len(a.Results))
	for i := range a.Results {
		ra, rb := a.Results[i].GetResult(), b.Results[i].GetResult()
		require.NotNil(t, ra, "reference item %d: %v", i, a.Results[i].GetError())
		require.NotNil(t, rb, "worker item %d: %v", i, b.Results[i].GetError())
		loss = math.Max(loss, math.Abs(ra.Metrics["loss:sum"]-rb.Metrics["loss:sum"]))
		require.Len(t, rb.Outputs, len(ra.Outputs))
		for j := range ra.Outputs {
			for key, dst := range map[string]*float64{"logprobs": &lp, "elementwise_loss": &el} {
				x, y := ra.Outputs[j].Outputs[key], rb.Outputs[j].Outputs[key]
				require.NotNil(t, y, "worker output %q", key)
				require.Equal(t, x.Shape, y.Shape, key)
				for k := range x.Float32Data {
					*dst = math.Max(*dst, math.Abs(float64(x.Float32Data[k])-float64(y.Float32Data[k])))
				}
			}
		}
	}
	return
}

func readTensors(t *testing.T, path string) map[string][]float64 {
	f, err := safetensors.Open(path)
	require.NoError(t, err)
	defer f.Close()
	out := map[string][]float64{}
	for name := range f.Tensors {
		v, _, err := f.ReadFloat64(name)
		require.NoError(t, err)
		out[name] = v
	}
	return out
}

func maxAbsTensors(t *testing.T, a, b map[string][]float64) float64 {
	require.Equal(t, len(a), len(b), "tensor count")
	var m float64
	for k, x := range a {
		y, ok := b[k]
		require.True(t, ok, "missing tensor %s", k)
		require.Len(t, y, len(x), k)
		for i := range x {
			m = math.Max(m, math.Abs(x[i]-y[i]))
		}
	}
	return m
}

// TestMatchesReference loads the same adapter checkpoint into the reference engine and the
// worker and compares logprobs and losses of every loss function, one AdamW step, and the
// initial adapter drawn from a seed.
func TestMatchesReference(t *testing.T) {
	b := sharedBackend(t)
	ctx := context.Background()
	ref, err := reference.New(reference.Options{DataDir: sharedDir})
	require.NoError(t, err)
	tr := b.Trainer()
	dir := t.TempDir()
	lora := &loopsv1.LoraConfig{Rank: 8, Seed: 42, TrainAttn: true, TrainMlp: true, TrainUnembed: true}

	// 1. Same seed, same initial adapter (bit for bit).
	for _, be := range []struct {
		name string
		tr   interface {
			CreateAdapter(context.Context, *backendv1.CreateAdapterRequest) (*backendv1.CreateAdapterResponse, error)
			SaveAdapter(context.Context, *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error)
		}
	}{{"ref", ref}, {"worker", tr}} {
		_, err := be.tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "init", BaseModel: tiny.Name, Lora: lora})
		require.NoError(t, err)
		_, err = be.tr.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "init", Dir: filepath.Join(dir, "init-"+be.name)})
		require.NoError(t, err)
	}
	d := maxAbsTensors(t, readTensors(t, filepath.Join(dir, "init-ref", "adapter_model.safetensors")),
		readTensors(t, filepath.Join(dir, "init-worker", "adapter_model.safetensors")))
	t.Logf("initial adapter from seed: max |ref - worker| = %g", d)
	require.Zero(t, d, "the worker must draw the same initial A as the reference engine")
	_, _ = tr.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: "init"})

	// 2. Give the reference adapter non-zero B and Adam state, save it, load it into both.
	_, err = ref.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "a", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	for step := range 2 {
		_, err = ref.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{
			AdapterId: "a", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(step+1, 24, "cross_entropy"), datum(step+5, 17, "cross_entropy")}}}})
		require.NoError(t, err)
		_, err = ref.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a", Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}})
		require.NoError(t, err)
	}
	start := filepath.Join(dir, "start")
	_, err = ref.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Dir: start, IncludeOptimizer: true})
	require.NoError(t, err)
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "a", Dir: start, LoadOptimizer: true})
	require.NoError(t, err, "a reference checkpoint must load in the worker")

	// 3. Forward logprobs and losses of every loss, two adapters' rows in one request.
	_, err = ref.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "b", Dir: filepath.Join(dir, "init-ref")})
	require.NoError(t, err)
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "b", Dir: filepath.Join(dir, "init-ref")})
	require.NoError(t, err)
	var worstLP, worstEL, worstLoss float64
	cfgs := map[string]map[string]float64{"ppo": {"clip_low_threshold": 0.9, "clip_high_threshold": 1.1}, "dro": {"beta": 0.1}}
	for _, loss := range []string{"cross_entropy", "importance_sampling", "ppo", "cispo", "dro", "gspo"} {
		req := &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
			{AdapterId: "a", LossFn: loss, LossFnConfig: cfgs[loss], ForwardOnly: true, Data: []*loopsv1.Datum{datum(3, 31, loss), datum(4, 9, loss)}},
			{AdapterId: "b", LossFn: loss, LossFnConfig: cfgs[loss], ForwardOnly: true, Data: []*loopsv1.Datum{datum(7, 20, loss)}},
		}}
		ra, err := ref.ForwardBackward(ctx, req)
		require.NoError(t, err)
		rb, err := tr.ForwardBackward(ctx, req)
		require.NoError(t, err)
		lp, el, ls := maxAbsDiffOutputs(t, ra, rb)
		t.Logf("%-20s max |Δ| logprobs %.3g  elementwise_loss %.3g  loss:sum %.3g", loss, lp, el, ls)
		worstLP, worstEL, worstLoss = max(worstLP, lp), max(worstEL, el), max(worstLoss, ls)
	}
	// K = 2 targets per position (cross_entropy)
	d2 := datum(9, 12, "cross_entropy")
	tg := make([]int64, 24)
	w := make([]float32, 24)
	for i := range 12 {
		tg[2*i], tg[2*i+1] = int64(d2.Tokens[(i+1)%12]), int64((i*11)%509)
		w[2*i], w[2*i+1] = 1, 0.25
	}
	d2.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{12, 2}, Int64Data: tg}
	d2.LossFnInputs["weights"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{12, 2}, Float32Data: w}
	req2 := &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "a", LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{d2}}}}
	ra, err := ref.ForwardBackward(ctx, req2)
	require.NoError(t, err)
	rb, err := tr.ForwardBackward(ctx, req2)
	require.NoError(t, err)
	lp, el, ls := maxAbsDiffOutputs(t, ra, rb)
	t.Logf("%-20s max |Δ| logprobs %.3g  elementwise_loss %.3g  loss:sum %.3g", "cross_entropy K=2", lp, el, ls)
	worstLP, worstEL, worstLoss = max(worstLP, lp), max(worstEL, el), max(worstLoss, ls)

	// 4. forward_backward (two calls, accumulated) + one AdamW step with decay and clipping.
	for _, be := range []backendv1ServiceTrainer{ref, tr} {
		for _, loss := range []string{"cross_entropy", "ppo"} {
			_, err := be.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
				{AdapterId: "a", LossFn: loss, Data: []*loopsv1.Datum{datum(11, 28, loss), datum(12, 15, loss)}}}})
			require.NoError(t, err)
		}
		res, err := be.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "a", Adam: &loopsv1.AdamParams{
			LearningRate: 5e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, WeightDecay: 0.1, GradClipNorm: 0.5}})
		require.NoError(t, err)
		t.Logf("grad_norm:mean %.6g", res.Result.Metrics["grad_norm:mean"])
	}
	for _, be := range []struct {
		name string
		tr   backendv1ServiceTrainer
	}{{"ref", ref}, {"worker", tr}} {
		_, err := be.tr.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "a", Dir: filepath.Join(dir, "after-"+be.name), IncludeOptimizer: true})
		require.NoError(t, err)
	}
	dw := maxAbsTensors(t, readTensors(t, filepath.Join(dir, "after-ref", "adapter_model.safetensors")), readTensors(t, filepath.Join(dir, "after-worker", "adapter_model.safetensors")))
	do := maxAbsTensors(t, readTensors(t, filepath.Join(dir, "after-ref", "optimizer.safetensors")), readTensors(t, filepath.Join(dir, "after-worker", "optimizer.safetensors")))
	t.Logf("after 2 accumulated forward_backward + AdamW(wd 0.1, clip 0.5, lr 5e-3): max |Δ| weights %.3g, optimizer moments %.3g", dw, do)
	t.Logf("WORST: logprobs %.3g, elementwise_loss %.3g, loss:sum %.3g", worstLP, worstEL, worstLoss)
	require.Less(t, worstLP, 1e-4)
	require.Less(t, worstEL, 1e-4)
	require.Less(t, dw, 1e-5)

	// 5. The worker's checkpoint loads in the reference engine and gives the same logprobs.
	_, err = ref.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "c", Dir: filepath.Join(dir, "after-worker"), LoadOptimizer: true})
	require.NoError(t, err, "a worker checkpoint must load in the reference engine")
	for _, id := range []string{"a", "b"} {
		_, _ = tr.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: id})
	}
}

type backendv1ServiceTrainer interface {
	ForwardBackward(context.Context, *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error)
	OptimStep(context.Context, *backendv1.OptimStepRequest) (*backendv1.OptimStepResponse, error)
	SaveAdapter(context.Context, *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error)
}

func TestSampleMatchesReferenceGreedy(t *testing.T) {
	b := sharedBackend(t)
	ctx := context.Background()
	ref, err := reference.New(reference.Options{DataDir: sharedDir})
	require.NoError(t, err)
	prompt := []int32{72, 101, 108, 108, 111, 32, 119}
	req := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: prompt, NumSamples: 2, PromptLogprobs: true, TopkPromptLogprobs: 3,
		Params: &loopsv1.SamplingParams{MaxTokens: 6, Temperature: 0, TopP: 1}}
	ra, err := ref.Sample(ctx, req)
	require.NoError(t, err)
	rb, err := b.Sampler().Sample(ctx, req)
	require.NoError(t, err)
	require.Len(t, rb.Result.Sequences, 2)
	require.Equal(t, ra.Result.Sequences[0].Tokens, rb.Result.Sequences[0].Tokens)
	var m float64
	for i, v := range ra.Result.PromptLogprobs[1:] {
		m = math.Max(m, math.Abs(float64(v)-float64(rb.Result.PromptLogprobs[i+1])))
	}
	for i, v := range ra.Result.Sequences[0].Logprobs {
		m = math.Max(m, math.Abs(float64(v)-float64(rb.Result.Sequences[0].Logprobs[i])))
	}
	require.True(t, math.IsNaN(float64(rb.Result.PromptLogprobs[0])))
	require.Equal(t, ra.Result.TopkPromptLogprobs.TokenIds, rb.Result.TopkPromptLogprobs.TokenIds)
	t.Logf("greedy sampling: same tokens; max |Δ| prompt/sampled logprobs %.3g", m)
	require.Less(t, m, 1e-4)
	// seeded sampling is reproducible
	req.Params = &loopsv1.SamplingParams{MaxTokens: 8, Temperature: 0.8, TopK: 50, TopP: 0.9, Seed: new(uint64(7))}
	x, err := b.Sampler().Sample(ctx, req)
	require.NoError(t, err)
	y, err := b.Sampler().Sample(ctx, req)
	require.NoError(t, err)
	require.Equal(t, x.Result.Sequences[1].Tokens, y.Result.Sequences[1].Tokens)
}

func TestModelNotServed(t *testing.T) {
	b := sharedBackend(t)
	_, err := b.Trainer().CreateAdapter(context.Background(), &backendv1.CreateAdapterRequest{AdapterId: "x", BaseModel: "Qwen/Qwen3-8B",
		Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Contains(t, err.Error(), "not served")
	require.Contains(t, err.Error(), tiny.Name)
	_, err = b.Sampler().Sample(context.Background(), &backendv1.SampleRequest{BaseModel: "Qwen/Qwen3-8B", Prompt: []int32{1}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	// the worker itself refuses too (a remote worker reached directly)
	b.mu.Lock()
	w := b.workers[0]
	b.mu.Unlock()
	_, _, cl, err := w.acquire()
	require.NoError(t, err)
	_, err = cl.tc.CreateAdapter(context.Background(), &backendv1.CreateAdapterRequest{AdapterId: "x", BaseModel: "Qwen/Qwen3-8B", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Contains(t, err.Error(), "--model Qwen/Qwen3-8B")
}

// TestWorkerDies: a crash fails the in-flight call with "worker … died", the worker is
// restarted, its adapters are NotFound, and the run continues from its saved checkpoint.
func TestWorkerDies(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	b, err := New(ctx, testOptions(t, t.TempDir()))
	require.NoError(t, err)
	defer b.Close()
	tr := b.Trainer()
	lora := &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true}
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "run1", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	fb := func() (*backendv1.ForwardBackwardResponse, error) {
		return tr.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "run1", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 16, "cross_entropy")}}}})
	}
	_, err = fb()
	require.NoError(t, err)
	_, err = tr.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "run1", Adam: &loopsv1.AdamParams{LearningRate: 1e-2}})
	require.NoError(t, err)
	ck := filepath.Join(t.TempDir(), "ck")
	_, err = tr.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "run1", Dir: ck, IncludeOptimizer: true})
	require.NoError(t, err)
	before, err := tr.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "run1", LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{datum(2, 16, "cross_entropy")}}}})
	require.NoError(t, err)

	// An in-flight call on a worker that is killed (kill -9 while it hangs).
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "__hang__", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	pid := b.WorkerPID(0)
	errc := make(chan error, 1)
	go func() {
		_, err := tr.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "__hang__", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 4, "cross_entropy")}}}})
		errc <- err
	}()
	time.Sleep(500 * time.Millisecond)
	require.NoError(t, exec.Command("kill", "-9", itoa(pid)).Run())
	select {
	case err = <-errc:
	case <-time.After(10 * time.Second):
		t.Fatal("the in-flight call did not fail after the worker died")
	}
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)
	// The call says the worker died when its liveness answers within dropWait; on a loaded
	// machine the probe can time out first, and the call then says the worker is unreachable
	// (the same Unavailable, the same recovery; the worker's death is asserted below).
	require.Regexp(t, `died|is unreachable`, err.Error())
	t.Logf("in-flight call: %v", err)

	// It comes back; its adapters are gone (NotFound), and the run reloads its checkpoint.
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	// (the supervisor sees the exit and starts a new process; only then is WaitReady about
	// the new worker, not the dead one it may not have noticed yet)
	require.Eventually(t, func() bool { p := b.WorkerPID(0); return p != 0 && p != pid }, 2*time.Minute, 50*time.Millisecond)
	require.NoError(t, b.WaitReady(wctx))
	require.NotEqual(t, pid, b.WorkerPID(0))
	res, err := fb()
	require.NoError(t, err)
	ie := res.Results[0].GetError()
	require.NotNil(t, ie, "the lost adapter must fail its item")
	require.EqualValues(t, connect.CodeNotFound, ie.Code)
	require.Contains(t, ie.Message, "load the run's last checkpoint")
	t.Logf("after restart: %s", ie.Message)
	_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "run1", Dir: ck, LoadOptimizer: true})
	require.NoError(t, err)
	after, err := tr.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "run1", LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{datum(2, 16, "cross_entropy")}}}})
	require.NoError(t, err)
	require.Equal(t, before.Results[0].GetResult().Metrics["loss:sum"], after.Results[0].GetResult().Metrics["loss:sum"])
	_, err = fb()
	require.NoError(t, err)
}

// TestWorkerHangs: a worker that stops answering (SIGSTOP) is declared dead by the health
// checks, its in-flight calls fail, and it is killed and restarted.
func TestWorkerHangs(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	b, err := New(ctx, testOptions(t, t.TempDir()))
	require.NoError(t, err)
	defer b.Close()
	tr := b.Trainer()
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "r", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 4, TrainMlp: true}})
	require.NoError(t, err)
	pid := b.WorkerPID(0)
	require.NoError(t, exec.Command("kill", "-STOP", itoa(pid)).Run())
	t0 := time.Now()
	_, err = tr.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "r", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 8, "cross_entropy")}}}})
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "health checks")
	t.Logf("hung worker noticed after %v: %v", time.Since(t0).Round(time.Millisecond), err)
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	require.NoError(t, b.WaitReady(wctx))
	_, err = tr.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "r", Adam: &loopsv1.AdamParams{LearningRate: 1e-3}})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	caps, err := tr.GetCapabilities(ctx, &backendv1.GetCapabilitiesRequest{})
	require.NoError(t, err)
	require.Equal(t, "torch", caps.Implementation)
}

// TestRemoteWorker connects to a worker started separately, by address.
func TestRemoteWorker(t *testing.T) {
	needTorch(t)
	dir := t.TempDir()
	tinyDir := filepath.Join(dir, "tiny")
	require.NoError(t, tiny.Write(tinyDir))
	o := testOptions(t, dir)
	// credentials as loops pools credentials issues them, from the backend's data dir
	creds, err := authority(t, dir).Issue(PoolID(tiny.Name), 0)
	require.NoError(t, err)
	files, err := creds.Write(filepath.Join(t.TempDir(), "creds"))
	require.NoError(t, err)
	addr, _ := poolstest.StartWorkerProcess(t, []string{"PYTHONPATH=" + o.PythonPath, "HF_HUB_OFFLINE=1"}, os.Getenv("LOOPS_WORKER_PYTHON"),
		append([]string{"-m", "loops_worker", "--listen", "127.0.0.1:0", "--device", "cpu", "--model", "loops/tiny=" + tinyDir}, files.Args()...)...)
	o.Workers = []string{addr}
	b, err := New(context.Background(), o)
	require.NoError(t, err)
	defer b.Close()
	res, err := b.Sampler().Sample(context.Background(), &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: []int32{1, 2, 3},
		Params: &loopsv1.SamplingParams{MaxTokens: 3, Temperature: 1, TopP: 1, Seed: new(uint64(1))}})
	require.NoError(t, err)
	require.Len(t, res.Result.Sequences[0].Tokens, len(res.Result.Sequences[0].Logprobs))
}

func itoa(i int) string { return strconv.Itoa(i) }

// TestBrokenEngineIsReplaced: a Python worker whose engine a device error broke (the
// __device_error__ test fault raises torch.AcceleratorError, as an illegal memory access
// does on a GPU) answers NOT_SERVING; the health checks declare it dead and it is killed
// and restarted, serving again.
func TestBrokenEngineIsReplaced(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	b, err := New(ctx, testOptions(t, t.TempDir()))
	require.NoError(t, err)
	defer b.Close()
	tr := b.Trainer()
	pid := b.WorkerPID(0)
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "__device_error__", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}})
	require.NoError(t, err)
	_, err = tr.ForwardBackward(ctx, &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{{AdapterId: "__device_error__", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 4, "cross_entropy")}}}})
	require.Equal(t, connect.CodeInternal, connect.CodeOf(err), "%v", err)
	require.Contains(t, err.Error(), "illegal memory access")
	require.Eventually(t, func() bool { p := b.WorkerPID(0); return p != 0 && p != pid }, 2*time.Minute, 50*time.Millisecond, "replaced")
	wctx, cancel := context.WithTimeout(ctx, 2*time.Minute)
	defer cancel()
	require.NoError(t, b.WaitReady(wctx))
	up, down := b.WorkerHealth()
	require.Equal(t, [2]int{1, 0}, [2]int{up, down})
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "r", BaseModel: tiny.Name, Lora: &loopsv1.LoraConfig{Rank: 2, TrainAttn: true}})
	require.NoError(t, err)
}
