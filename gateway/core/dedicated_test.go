package core_test

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestDedicatedRuns: over a pool-mode backend of Go workers (one shared replica), a run that
// asks for a dedicated pool (user_metadata loops.dedicated) gets one started for it and
// trains on it; when it ends the pool is kept warm and the next dedicated run binds it at
// once; idle, the pool is scaled to zero and the run's next call scales it up again and
// rebuilds its adapter (step recovery), losing nothing; released and past its keep-warm
// period, the pool is deleted. A workspace whose policy says dedicated: off is refused, and
// the replica-seconds are metered in the usage API.
func TestDedicatedRuns(t *testing.T) {
	dir := t.TempDir()
	require.NoError(t, tiny.Write(filepath.Join(dir, "models", "loops-tiny")))
	exe, err := os.Executable()
	require.NoError(t, err)
	b, err := worker.New(t.Context(), worker.Options{Command: []string{exe}, DataDir: dir,
		Args:           []string{"--data-dir", dir, "--threads", "1"},
		Env:            []string{goWorkerEnv + "=1", "HF_HUB_CACHE=" + filepath.Join(dir, "hub"), serve.LogLevelEnv + "=WARN"},
		HealthInterval: 200 * time.Millisecond, HealthTimeout: 2 * time.Second, StartTimeout: 30 * time.Second,
		Pool: &worker.PoolOptions{Provider: "local", Replicas: 1, HeartbeatTimeout: 6 * time.Second, KeepWarm: 2 * time.Second, IdleToZero: 1500 * time.Millisecond}})
	require.NoError(t, err)
	t.Cleanup(func() { _ = b.Close() })
	prov, reg := b.Pools()
	pol, err := policy.Parse([]byte(`{"default": {}, "workspaces": {"ws-off": {"dedicated": "off"}}}`))
	require.NoError(t, err)
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	metrics := prometheus.NewRegistry()
	c, err := core.New(t.Context(), st, b, core.Options{DataDir: dir, Policy: pol, Registerer: metrics})
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close(); _ = st.Close() })
	svc := c.Services()
	ctx := auth.WithWorkspace(t.Context(), "ws")
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := svc.Operations.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Minute)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	create := func() (string, string, time.Duration) {
		start := time.Now()
		run := wait(svc.Training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name,
			Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true}, UserMetadata: map[string]string{core.MetaDedicated: "true", core.MetaDedicatedSamplerReplicas: "1"}})).GetTrainingRun()
		took := time.Since(start)
		require.True(t, strings.HasPrefix(run.GetDedicatedPool(), "ded-"), "the run has a pool of its own: %q", run.GetDedicatedPool())
		p, _, ok := b.AdapterReplica(run.GetId())
		require.True(t, ok)
		require.Equal(t, run.GetDedicatedPool(), p, "its adapter is on its pool")
		return run.GetId(), run.GetDedicatedPool(), took
	}
	step := func(run string) float64 {
		fb := wait(svc.Training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datumOf(1, 0)}}))
		wait(svc.Training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, Adam: &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}}))
		return fb.GetForwardBackward().GetMetrics()["loss:sum"]
	}

	a, poolA, cold := create()
	step(a)
	wait(svc.Training.UnloadTrainingRun(ctx, &loopsv1.UnloadTrainingRunRequest{Id: a}))
	bRun, poolB, warm := create()
	require.Equal(t, poolA, poolB, "the released pool was bound warm")
	t.Logf("dedicated pool bind: cold %v, warm %v", cold, warm)
	first := step(bRun)

	// idle: scaled to zero, then up again by the next call, with the adapter rebuilt
	require.Eventually(t, func() bool { return len(reg.Members(poolB)) == 0 }, 20*time.Second, 50*time.Millisecond, "scaled to zero")
	second := step(bRun)
	require.Less(t, second, first, "training went on from the state before the pool idled to zero")
	info, err := svc.Training.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: bRun})
	require.NoError(t, err)
	require.False(t, info.GetCorrupted())

	// its checkpoints sample on its sampler replicas: with the shared pool and its own
	// trainer at zero, they still do
	// (its sampler pool, scaled to zero with the trainer's, starts again beside it: under
	// load it registers after the step above has answered)
	require.Eventually(t, func() bool { return len(reg.Members(poolB+"-s")) == 1 }, 20*time.Second, 50*time.Millisecond, "the run has a sampler replica of its own")
	require.NoError(t, prov.ScalePool(t.Context(), worker.PoolID(tiny.Name), 0))
	require.Eventually(t, func() bool { return len(reg.Members(worker.PoolID(tiny.Name))) == 0 }, 20*time.Second, 50*time.Millisecond)
	eph := wait(svc.Training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: bRun, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER}))
	require.NoError(t, prov.ScalePool(t.Context(), poolB, 0))
	require.Eventually(t, func() bool { return len(reg.Members(poolB)) == 0 }, 20*time.Second, 50*time.Millisecond)
	sample := wait(svc.Sampling.Sample(ctx, &loopsv1.SampleRequest{SamplerId: eph.GetSaveWeights().GetSamplerId(), Prompt: []int32{72, 105}, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 4}}))
	require.Len(t, sample.GetSample().GetSequences(), 1)
	require.NoError(t, prov.ScalePool(t.Context(), poolB, 1)) // its trainer back, for the unload below

	usage, err := svc.Usage.GetUsage(ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	var seconds int64
	for _, u := range usage.GetBuckets() {
		if u.GetKind() == loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS {
			seconds += u.GetAmount()
		}
	}
	require.Positive(t, seconds, "run A's replica-seconds were metered at its release")

	// released and past keep-warm: deleted
	wait(svc.Training.UnloadTrainingRun(ctx, &loopsv1.UnloadTrainingRunRequest{Id: bRun}))
	require.Eventually(t, func() bool {
		for _, p := range reg.Pools() {
			if p == poolB {
				return false
			}
		}
		return true
	}, 20*time.Second, 50*time.Millisecond, "the warm pool was deleted after its keep-warm period")

	// a workspace whose policy says off
	_, err = svc.Training.CreateTrainingRun(auth.WithWorkspace(t.Context(), "ws-off"), &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}, UserMetadata: map[string]string{core.MetaDedicated: "true"}})
	require.ErrorContains(t, err, "dedicated: off")
}

// datumOf is one 12-token cross_entropy datum.
func datumOf(i, step int) *loopsv1.Datum {
	d := &loopsv1.Datum{LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64}, "weights": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32}}}
	for j := range 12 {
		d.Tokens = append(d.Tokens, int32(65+(i*7+step*3+j)%26))
		d.LossFnInputs["target_tokens"].Int64Data = append(d.LossFnInputs["target_tokens"].Int64Data, int64(65+(i*7+step*3+j+1)%26))
		d.LossFnInputs["weights"].Float32Data = append(d.LossFnInputs["weights"].Float32Data, 1)
	}
	return d
}
