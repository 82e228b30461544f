package worker

import (
	"context"
	"math"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends/reference"
	"github.com/loops-dev/loops/backends/tiny"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestShardedReplica: a torch worker replica of 2 ranks (--world-size 2, FSDP2 over gloo)
// behind the one endpoint trains as the reference engine does (log-probs, losses, the
// adapter after an AdamW step) and samples as it does (seeded, with the adapter); then its rank 1 dies in the middle of a step (the
// __rank_crash__ test fault): the call fails as a lost worker, the replica is rebuilt, and
// the run goes on from its checkpoint with the same loss.
func TestShardedReplica(t *testing.T) {
	needTorch(t)
	ctx := context.Background()
	o := testOptions(t, t.TempDir())
	o.Args = append(o.Args, "--world-size", "2", "--threads", "1")
	b, err := New(ctx, o)
	require.NoError(t, err)
	defer b.Close()
	ref, err := reference.New(reference.Options{DataDir: o.DataDir})
	require.NoError(t, err)
	tr := b.Trainer()
	lora := &loopsv1.LoraConfig{Rank: 4, Seed: 5, TrainAttn: true, TrainMlp: true, TrainUnembed: true}
	step := &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
		{AdapterId: "run1", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 24, "cross_entropy"), datum(2, 17, "cross_entropy"), datum(3, 9, "cross_entropy")}}}}
	probe := &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{
		{AdapterId: "run1", LossFn: "ppo", ForwardOnly: true, Data: []*loopsv1.Datum{datum(4, 20, "ppo"), datum(5, 11, "ppo")}}}}
	adam := &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8, GradClipNorm: 1}
	dir := t.TempDir()
	// the start: an adapter with non-zero B and Adam moments (a first AdamW step from B = 0
	// is sign-like, so it would compare rounding noise, not the engines)
	_, err = ref.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "run1", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	for range 2 {
		_, err = ref.ForwardBackward(ctx, step)
		require.NoError(t, err)
		_, err = ref.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "run1", Adam: adam})
		require.NoError(t, err)
	}
	start := filepath.Join(dir, "start")
	_, err = ref.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "run1", Dir: start, IncludeOptimizer: true})
	require.NoError(t, err)
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "other", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	for _, be := range []struct {
		name string
		tr   interface {
			backendv1ServiceTrainer
			LoadAdapter(context.Context, *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error)
		}
	}{{"ref", ref}, {"sharded", tr}} {
		_, err := be.tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "run1", Dir: start, LoadOptimizer: true})
		require.NoError(t, err)
		res, err := be.tr.ForwardBackward(ctx, step)
		require.NoError(t, err)
		require.NotNil(t, res.Results[0].GetResult(), "%s: %v", be.name, res.Results[0].GetError())
		_, err = be.tr.OptimStep(ctx, &backendv1.OptimStepRequest{AdapterId: "run1", Adam: adam})
		require.NoError(t, err)
		_, err = be.tr.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: "run1", Dir: filepath.Join(dir, be.name), IncludeOptimizer: true})
		require.NoError(t, err)
	}
	ra, err := ref.ForwardBackward(ctx, probe)
	require.NoError(t, err)
	rb, err := tr.ForwardBackward(ctx, probe)
	require.NoError(t, err)
	lp, el, _ := maxAbsDiffOutputs(t, ra, rb)
	dw := maxAbsTensors(t, readTensors(t, filepath.Join(dir, "ref", "adapter_model.safetensors")), readTensors(t, filepath.Join(dir, "sharded", "adapter_model.safetensors")))
	t.Logf("2-rank replica vs reference: max |Δ| logprobs %.3g, elementwise_loss %.3g, adapter after AdamW %.3g", lp, el, dw)
	require.Less(t, lp, 1e-4)
	require.Less(t, el, 1e-4)
	require.Less(t, dw, 1e-5)

	// the replica samples (rank 0 announces each forward pass, every rank runs one, rank 0
	// answers) as the reference engine does, with the trained adapter and without
	for _, adapter := range []string{filepath.Join(dir, "ref"), ""} {
		sreq := &backendv1.SampleRequest{BaseModel: tiny.Name, Prompt: []int32{72, 101, 108, 108, 111, 32, 119}, NumSamples: 2,
			AdapterDir: adapter, PromptLogprobs: true, TopkPromptLogprobs: 3,
			Params: &loopsv1.SamplingParams{MaxTokens: 8, Temperature: 0.8, TopK: 50, TopP: 0.9, Seed: new(uint64(7))}}
		sa, err := ref.Sample(ctx, sreq)
		require.NoError(t, err)
		sb, err := b.Sampler().Sample(ctx, sreq)
		require.NoError(t, err)
		require.Len(t, sb.Result.Sequences, 2)
		var m float64
		for i, q := range sa.Result.Sequences {
			require.Equal(t, q.Tokens, sb.Result.Sequences[i].Tokens, "adapter %q sequence %d", adapter, i)
			for j, v := range q.Logprobs {
				m = math.Max(m, math.Abs(float64(v)-float64(sb.Result.Sequences[i].Logprobs[j])))
			}
		}
		for i, v := range sa.Result.PromptLogprobs[1:] {
			m = math.Max(m, math.Abs(float64(v)-float64(sb.Result.PromptLogprobs[i+1])))
		}
		require.Equal(t, sa.Result.TopkPromptLogprobs.TokenIds, sb.Result.TopkPromptLogprobs.TokenIds)
		t.Logf("2-rank replica sample vs reference (adapter %q): same tokens, max |Δ| logprobs %.3g", adapter, m)
		require.Less(t, m, 1e-4)
	}

	// rank 1 dies mid-step: the replica is lost and rebuilt; the run reloads its checkpoint
	pid := b.WorkerPID(0)
	kids, err := os.ReadFile(filepath.Join("/proc", strconv.Itoa(pid), "task", strconv.Itoa(pid), "children"))
	require.NoError(t, err)
	require.Len(t, strings.Fields(string(kids)), 1, "rank 0 starts one other rank")
	_, err = tr.CreateAdapter(ctx, &backendv1.CreateAdapterRequest{AdapterId: "__rank_crash__", BaseModel: tiny.Name, Lora: lora})
	require.NoError(t, err)
	crash := &backendv1.ForwardBackwardRequest{Items: []*backendv1.ForwardBackwardItem{step.Items[0],
		{AdapterId: "__rank_crash__", LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1, 4, "cross_entropy")}}}}
	_, err = tr.ForwardBackward(ctx, crash)
	t.Logf("in-flight call: %v", err)
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err), "%v", err)
	wctx, cancel := context.WithTimeout(ctx, 3*time.Minute)
	defer cancel()
	// the gateway's recovery: retry on Unavailable until the rebuilt replica answers
	for {
		require.NoError(t, b.WaitReady(wctx))
		_, err = tr.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: "run1", Dir: filepath.Join(dir, "sharded"), LoadOptimizer: true})
		if connect.CodeOf(err) != connect.CodeUnavailable || wctx.Err() != nil {
			break
		}
		time.Sleep(200 * time.Millisecond)
	}
	require.NoError(t, err)
	require.NotEqual(t, pid, b.WorkerPID(0), "a new replica")
	again, err := tr.ForwardBackward(ctx, probe)
	require.NoError(t, err)
	require.Equal(t, rb.Results[0].GetResult().Metrics["loss:sum"], again.Results[0].GetResult().Metrics["loss:sum"])
}
