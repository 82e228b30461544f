package core

import (
	"context"
	"io"
	"maps"
	"math"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
)

type harness struct {
	t    *testing.T
	dir  string
	fake *fakeBackend
	core *Core
	svc  Services
	ctx  context.Context
}

func newHarness(t *testing.T, dir string, opts Options) *harness {
	t.Helper()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	fake := newFakeBackend()
	opts.DataDir = dir
	c, err := New(t.Context(), st, fake, opts)
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	t.Cleanup(func() {
		_ = c.Close()
		_ = st.Close()
	})
	return h
}

// wait waits for op to finish: up to 30 s, a bound for a hang, not a timing (a loaded CI
// machine running -race can take seconds).
func (h *harness) wait(op *loopsv1.Operation) *loopsv1.Operation {
	h.t.Helper()
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Second)})
	require.NoError(h.t, err)
	require.True(h.t, isDone(got), "operation %s still %s", got.GetId(), got.GetState())
	return got
}

func (h *harness) newRun() string {
	h.t.Helper()
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
	require.NoError(h.t, err)
	done := h.wait(op)
	require.Equal(h.t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	return done.GetTrainingRunId()
}

func datum(tokens ...int32) *loopsv1.Datum {
	tt := make([]int64, len(tokens))
	w := make([]float32, len(tokens))
	for i := range tokens {
		tt[i] = int64(tokens[(i+1)%len(tokens)])
		w[i] = 1
	}
	return &loopsv1.Datum{Tokens: tokens, LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tt},
		"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
	}}
}

func (h *harness) fb(run string, seq int64, d ...*loopsv1.Datum) (*loopsv1.Operation, error) {
	return h.svc.Training.ForwardBackward(h.ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: seq, Data: d, LossFn: "cross_entropy"})
}

func TestOrderedExecutionAndDedupe(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	// Seq 3 and 2 arrive before 1, as the SDK's concurrent chunks do.
	op3, err := h.fb(run, 3, datum(1, 2, 3))
	require.NoError(t, err)
	op2, err := h.svc.Training.OptimStep(h.ctx, &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 2, Adam: &loopsv1.AdamParams{LearningRate: 1e-3, Beta1: 0.9, Beta2: 0.95, Eps: 1e-12}})
	require.NoError(t, err)
	op1, err := h.fb(run, 1, datum(4, 5))
	require.NoError(t, err)
	// A retry of seq 1 returns the same operation instead of doing the work twice.
	again, err := h.fb(run, 1, datum(4, 5))
	require.NoError(t, err)
	require.Equal(t, op1.GetId(), again.GetId())
	for _, op := range []*loopsv1.Operation{op1, op2, op3} {
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	}
	require.Equal(t, []string{run, "optim:" + run, run}, h.fake.calls)
}

func TestRejectedRequestDoesNotStallRun(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{GapTimeout: time.Hour})
	run := h.newRun()
	_, err := h.fb(run, 1, datum(1, 500)) // token 500 is outside the vocabulary of 100
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.Contains(t, err.Error(), "outside fake/model's vocabulary")
	op, err := h.fb(run, 2, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	// The rejected seq_id stays used.
	_, err = h.fb(run, 1, datum(1, 2))
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
}

func TestGapIsSkippedAfterTimeout(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{GapTimeout: 50 * time.Millisecond})
	run := h.newRun()
	op, err := h.fb(run, 2, datum(1, 2)) // seq 1 never arrives
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	_, err = h.fb(run, 1, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
}

func TestBadInputIsRejectedAtSubmission(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	long := make([]int32, 65)
	short := datum(1, 2, 3)
	short.LossFnInputs["weights"].Float32Data = []float32{1}
	nanWeights := datum(1, 2)
	nanWeights.LossFnInputs["weights"].Float32Data[1] = float32(math.NaN())
	// A shape whose product wraps int64 to the value count (4 × (2^62+1) = 4 mod 2^64) once
	// passed validation and crashed the engine with makeslice.
	wrapped := datum(1, 2, 3, 4)
	wrapped.LossFnInputs["target_tokens"].Shape = []int64{4, 4611686018427387905}
	wrapped.LossFnInputs["weights"].Shape = []int64{4, 4611686018427387905}
	zeroDim := datum(1, 2)
	zeroDim.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: []int64{2, 0}}
	zeroDim.LossFnInputs["weights"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{2, 0}}
	wrongType := datum(1, 2)
	wrongType.LossFnInputs["target_tokens"] = &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: []float32{1, 2}}
	for name, tc := range map[string]struct {
		req  *loopsv1.ForwardBackwardRequest
		want string
	}{
		"unknown loss":   {&loopsv1.ForwardBackwardRequest{LossFn: "mse", Data: []*loopsv1.Datum{datum(1)}}, `unknown loss_fn "mse"`},
		"empty batch":    {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy"}, "data is empty"},
		"too long":       {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{{Tokens: long}}}, "over fake/model's limit of 64"},
		"wrong length":   {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{short}}, "has 1 rows but model_input has 3 tokens"},
		"wrong dtype":    {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{wrongType}}, "must be int64"},
		"missing input":  {&loopsv1.ForwardBackwardRequest{LossFn: "ppo", Data: []*loopsv1.Datum{datum(1, 2)}}, `lacks "logprobs"`},
		"not finite":     {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{nanWeights}}, "values must be finite"},
		"wrapped shape":  {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{wrapped}}, "needs more elements than the tensor's 4 values"},
		"zero dimension": {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", Data: []*loopsv1.Datum{zeroDim}}, "has a dimension of 0"},
		"unknown config": {&loopsv1.ForwardBackwardRequest{LossFn: "cross_entropy", LossFnConfig: map[string]float64{"beta": 1}, Data: []*loopsv1.Datum{datum(1)}}, "takes no config"},
		"inf config":     {&loopsv1.ForwardBackwardRequest{LossFn: "dro", LossFnConfig: map[string]float64{"beta": math.Inf(1)}, Data: []*loopsv1.Datum{datum(1)}}, "must be finite"},
	} {
		t.Run(name, func(t *testing.T) {
			tc.req.TrainingRunId = run
			_, err := h.svc.Training.ForwardBackward(h.ctx, tc.req)
			require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: -1, TrainMlp: true}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	// rank 0 is full fine-tuning, which fake/model's backend does not serve
	_, err = h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 0, TrainMlp: true}})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "full fine-tuning (lora rank 0) of fake/model is not served by its backend")
	_, err = h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 17, TrainMlp: true}})
	require.ErrorContains(t, err, "over fake/model's limit of 16")
	_, err = h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "nope", Lora: &loopsv1.LoraConfig{Rank: 1, TrainMlp: true}})
	require.ErrorContains(t, err, `unknown base model "nope"`)
}

func TestWorkspaceIsolation(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	op, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	other := auth.WithWorkspace(t.Context(), "ws-b")
	_, err = h.svc.Training.GetTrainingRun(other, &loopsv1.GetTrainingRunRequest{Id: run})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Operations.GetOperation(other, &loopsv1.GetOperationRequest{Id: op.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Training.ForwardBackward(other, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", Data: []*loopsv1.Datum{datum(1)}})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	list, err := h.svc.Training.ListTrainingRuns(other, &loopsv1.ListTrainingRunsRequest{})
	require.NoError(t, err)
	require.Empty(t, list.GetTrainingRuns())
	_, err = h.svc.Training.GetTrainingRun(t.Context(), &loopsv1.GetTrainingRunRequest{Id: run})
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err))
}

func TestForwardBackwardOfSeveralRunsIsBatched(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	runs := []string{h.newRun(), h.newRun(), h.newRun()}
	h.fake.gate = make(chan struct{})
	h.fake.entered = make(chan struct{}, 10)
	// Occupy the lane with a first call, queue one item per run behind it, then release.
	first, err := h.fb(runs[0], 1, datum(1, 2))
	require.NoError(t, err)
	<-h.fake.entered
	var ops []*loopsv1.Operation
	for _, r := range runs[1:] {
		op, err := h.fb(r, 1, datum(1, 2))
		require.NoError(t, err)
		ops = append(ops, op)
	}
	op, err := h.fb(runs[0], 2, datum(1, 2))
	require.NoError(t, err)
	ops = append(ops, op)
	close(h.fake.gate)
	h.wait(first)
	for _, op := range ops {
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	}
	require.Equal(t, []int{1, 3}, h.fake.batches)
}

func TestLongPollIsWokenByCompletion(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	h.fake.gate = make(chan struct{})
	op, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	const waiters = 2000
	var wg sync.WaitGroup
	results := make(chan *loopsv1.Operation, waiters)
	for range waiters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(20 * time.Second)})
			if err == nil {
				results <- got
			}
		}()
	}
	require.Eventually(t, func() bool {
		return testutilGauge(h.core) == waiters
	}, 10*time.Second, 5*time.Millisecond)
	start := time.Now()
	close(h.fake.gate)
	wg.Wait()
	require.Less(t, time.Since(start), 10*time.Second)
	close(results)
	n := 0
	for r := range results {
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, r.GetState())
		n++
	}
	require.Equal(t, waiters, n)
}

func TestWaitTimesOutWithPendingState(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	h.fake.gate = make(chan struct{})
	defer close(h.fake.gate)
	op, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	got, err := h.svc.Operations.WaitOperation(h.ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(30 * time.Millisecond)})
	require.NoError(t, err)
	require.False(t, isDone(got))
}

func TestCheckpointsAndSamplers(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	save := func(kind loopsv1.CheckpointKind, name string, overwrite bool) *loopsv1.Operation {
		op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: kind, Name: name, Overwrite: overwrite})
		require.NoError(t, err)
		return h.wait(op)
	}
	done := save(loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, "step-1", false)
	require.Equal(t, "tinker://"+run+"/weights/step-1", done.GetSaveWeights().GetPath())
	// The same name again fails as the user's mistake, unless overwrite is set.
	again := save(loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, "step-1", false)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, again.GetState())
	require.Equal(t, loopsv1.ErrorCategory_ERROR_CATEGORY_USER, again.GetError().GetCategory())
	require.Contains(t, again.GetError().GetMessage(), "overwrite")
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, save(loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, "step-1", true).GetState())

	eph := save(loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, "", false)
	require.NotEmpty(t, eph.GetSaveWeights().GetSamplerId())
	sop, err := h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: eph.GetSaveWeights().GetSamplerId(), Prompt: []int32{1, 2}, NumSamples: 3})
	require.NoError(t, err)
	require.Len(t, h.wait(sop).GetSample().GetSequences(), 3)

	list, err := h.svc.Checkpoints.ListCheckpoints(h.ctx, &loopsv1.ListCheckpointsRequest{TrainingRunId: run})
	require.NoError(t, err)
	require.EqualValues(t, 2, list.GetTotalCount())

	load, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: "tinker://" + run + "/weights/step-1", WithOptimizer: true})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(load).GetState())
	_, err = h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: "tinker://" + run + "/weights/nope"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: "s3://x"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	// Another workspace cannot read it until it is published.
	other := auth.WithWorkspace(t.Context(), "ws-b")
	path := "tinker://" + run + "/weights/step-1"
	_, err = h.svc.Checkpoints.GetCheckpoint(other, &loopsv1.GetCheckpointRequest{Path: path})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: path, Public: true})
	require.NoError(t, err)
	_, err = h.svc.Checkpoints.GetCheckpoint(other, &loopsv1.GetCheckpointRequest{Path: path})
	require.NoError(t, err)
	_, err = h.svc.Checkpoints.DeleteCheckpoint(other, &loopsv1.DeleteCheckpointRequest{Path: path})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))

	// TTL expiry deletes it.
	_, err = h.svc.Checkpoints.SetCheckpointTTL(h.ctx, &loopsv1.SetCheckpointTTLRequest{Path: path, TtlSeconds: ptr(int64(1))})
	require.NoError(t, err)
	h.core.expireCheckpoints(h.ctx, time.Now().Add(2*time.Second))
	_, err = h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: path})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

func TestRestartFailsInFlightOperationsAndRecoversRuns(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	fake := newFakeBackend()
	c, err := New(t.Context(), st, fake, Options{DataDir: dir})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, fake: fake, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	run := h.newRun()
	fake.gate = make(chan struct{})
	op, err := h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)
	// Its record is written behind (persister.go): let it reach the store first.
	require.Eventually(t, func() bool { _, err := st.GetOperation(t.Context(), "ws-a", op.GetId()); return err == nil }, 5*time.Second, time.Millisecond)
	// Crash with the operation still in flight: nothing more is journaled or written.
	c.ops.persist.Crash()
	require.NoError(t, st.Close())
	close(fake.gate)
	_ = c.Close()

	h2 := newHarness(t, dir, Options{})
	got, err := h2.svc.Operations.GetOperation(h2.ctx, &loopsv1.GetOperationRequest{Id: op.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
	require.Contains(t, got.GetError().GetMessage(), "server restarted")
	// The run carries on at the client's next seq_id with a fresh adapter, marked corrupted.
	op2, err := h2.fb(run, 2, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h2.wait(op2).GetState())
	info, err := h2.svc.Training.GetTrainingRun(h2.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.True(t, info.GetCorrupted())
}

func TestSessionsExpireWithoutHeartbeat(t *testing.T) {
	now := time.Now()
	var mu sync.Mutex
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	h := newHarness(t, t.TempDir(), Options{Now: clock, SessionTTL: time.Minute})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{Tags: []string{"b", "a", "b"}})
	require.NoError(t, err)
	require.Equal(t, []string{"a", "b"}, sess.GetTags())
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{SessionId: sess.GetId(), ClientSeqId: ptr(int64(0)), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 2, TrainMlp: true}})
	require.NoError(t, err)
	dup, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{SessionId: sess.GetId(), ClientSeqId: ptr(int64(0)), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 2, TrainMlp: true}})
	require.NoError(t, err)
	require.Equal(t, op.GetId(), dup.GetId())
	run := h.wait(op).GetTrainingRunId()

	mu.Lock()
	now = now.Add(50 * time.Second)
	mu.Unlock()
	_, err = h.svc.Sessions.HeartbeatSession(h.ctx, &loopsv1.HeartbeatSessionRequest{Id: sess.GetId()})
	require.NoError(t, err)
	h.core.sweep(h.ctx)
	_, err = h.fb(run, 1, datum(1, 2))
	require.NoError(t, err)

	mu.Lock()
	now = now.Add(2 * time.Minute)
	mu.Unlock()
	h.core.sweep(h.ctx)
	_, err = h.svc.Sessions.HeartbeatSession(h.ctx, &loopsv1.HeartbeatSessionRequest{Id: sess.GetId()})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	_, err = h.fb(run, 2, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "ended")
	_, err = h.svc.Sessions.HeartbeatSession(h.ctx, &loopsv1.HeartbeatSessionRequest{Id: "sess-nope"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

func ptr[T any](v T) *T { return &v }

func testutilGauge(c *Core) int { return int(gaugeValue(c.metrics.waiters)) }

func TestLoadChecksAdapterShapeNotSeed(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	mk := func(rank int32, seed uint64) string {
		op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: rank, Seed: seed, TrainAttn: true}})
		require.NoError(t, err)
		return h.wait(op).GetTrainingRunId()
	}
	src := mk(4, 1)
	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: src, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "c"})
	require.NoError(t, err)
	path := h.wait(op).GetSaveWeights().GetPath()
	// Another seed, same shape: loads.
	load, err := h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: mk(4, 2), Path: path, WithOptimizer: true})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(load).GetState())
	// Another rank: refused at submission with the reason.
	_, err = h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: mk(8, 1), Path: path})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	require.ErrorContains(t, err, "rank and train_* flags must be equal")
	// Creating a run from the checkpoint takes its config.
	op, err = h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: path, WithOptimizer: true})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	require.EqualValues(t, 4, done.GetTrainingRun().GetLora().GetRank())
}

func TestFinishSessionUnloadsItsRuns(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{SessionId: sess.GetId(), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 2, TrainMlp: true}})
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	done, err := h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess.GetId(), Reason: "success"})
	require.NoError(t, err)
	require.True(t, done.GetExpired())
	require.Equal(t, "finished: success", done.GetEndReason())
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: sess.GetId()})
	require.NoError(t, err, "finishing twice is a no-op")
	_, err = h.fb(run, 1, datum(1, 2))
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.Error(t, h.fake.has(run), "the adapter was freed")
	got, err := h.svc.Sessions.GetSession(h.ctx, &loopsv1.GetSessionRequest{Id: sess.GetId()})
	require.NoError(t, err)
	require.Equal(t, []string{run}, got.GetTrainingRunIds())
}

func TestLostAdapterIsRecreatedAndRunMarkedCorrupted(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "c"})
	require.NoError(t, err)
	path := h.wait(op).GetSaveWeights().GetPath()
	// A worker restart: the backend forgets the adapter.
	_, err = h.fake.DeleteAdapter(h.ctx, &backendv1.DeleteAdapterRequest{AdapterId: run})
	require.NoError(t, err)
	op, err = h.fb(run, 0, datum(1, 2))
	require.NoError(t, err)
	failed := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, failed.GetState())
	require.Contains(t, failed.GetError().GetMessage(), "lost training run")
	require.Equal(t, loopsv1.ErrorCategory_ERROR_CATEGORY_SERVER, failed.GetError().GetCategory())
	// The next request recreates the adapter; the run is corrupted until a checkpoint loads.
	op, err = h.fb(run, 0, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	info, err := h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.True(t, info.GetCorrupted())
	op, err = h.svc.Training.LoadWeights(h.ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: run, Path: path, WithOptimizer: true})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	info, err = h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	require.False(t, info.GetCorrupted())
}

func TestExternalWeightsDownloadFileByFile(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	run := h.newRun()
	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_EXTERNAL, Name: "export"})
	require.NoError(t, err)
	path := h.wait(op).GetSaveWeights().GetPath()
	require.Equal(t, "tinker://"+run+"/external_weights/export", path)
	urls, err := h.svc.Checkpoints.GetCheckpointFileURLs(h.ctx, &loopsv1.GetCheckpointFileURLsRequest{Path: path})
	require.NoError(t, err)
	require.ElementsMatch(t, []string{"adapter_config.json", "adapter_model.safetensors"}, slices.Collect(maps.Keys(urls.GetUrls())), "no optimizer state, no marker")
	srv := httptest.NewServer(archiveHandler(h.core))
	defer srv.Close()
	resp, err := http.Get(srv.URL + urls.GetUrls()["adapter_config.json"])
	require.NoError(t, err)
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, run, string(body)) // what the fake backend wrote
	tok := strings.TrimPrefix(strings.TrimSuffix(urls.GetUrls()["adapter_config.json"], "/adapter_config.json"), ArchivePathPrefix)
	for _, bad := range []string{"/../../loops.db", "/..%2f..%2floops.db", "/", "/nope"} {
		resp, err := http.Get(srv.URL + ArchivePathPrefix + tok + bad)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusNotFound, resp.StatusCode, bad)
	}
	// Another workspace gets nothing.
	_, err = h.svc.Checkpoints.GetCheckpointFileURLs(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.GetCheckpointFileURLsRequest{Path: path})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
}

func TestRunAnswersToItsSessionAliasAcrossRestarts(t *testing.T) {
	dir := t.TempDir()
	st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
	require.NoError(t, err)
	c, err := New(t.Context(), st, newFakeBackend(), Options{DataDir: dir})
	require.NoError(t, err)
	h := &harness{t: t, dir: dir, fake: nil, core: c, svc: c.Services(), ctx: auth.WithWorkspace(t.Context(), "ws-a")}
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{SessionId: sess.GetId(), ClientSeqId: ptr(int64(3)), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 2, TrainMlp: true}})
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	alias := sess.GetId() + ":train:3"
	got, err := h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: alias})
	require.NoError(t, err)
	require.Equal(t, run, got.GetId())
	op, err = h.fb(alias, 1, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, run, h.wait(op).GetTrainingRunId())
	_, err = h.svc.Training.GetTrainingRun(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.GetTrainingRunRequest{Id: alias})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	// Checkpoint paths and listings take the alias too.
	op, err = h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: alias, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "c"})
	require.NoError(t, err)
	require.Equal(t, "tinker://"+run+"/weights/c", h.wait(op).GetSaveWeights().GetPath())
	_, err = h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: "tinker://" + alias + "/weights/c"})
	require.NoError(t, err)
	list, err := h.svc.Checkpoints.ListCheckpoints(h.ctx, &loopsv1.ListCheckpointsRequest{TrainingRunId: alias})
	require.NoError(t, err)
	require.EqualValues(t, 1, list.GetTotalCount())
	require.NoError(t, c.Close())
	require.NoError(t, st.Close())

	h2 := newHarness(t, dir, Options{})
	op, err = h2.fb(alias, 2, datum(1, 2))
	require.NoError(t, err)
	done := h2.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
	require.Equal(t, run, done.GetTrainingRunId())
}

// TestSessionSurvivesARestart: a live session is revived after a restart (heartbeats, new
// runs and samplers in it work, its runs carry on); a finished one stays ended; another
// workspace cannot revive it.
func TestSessionSurvivesARestart(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, Options{})
	live, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	ended, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{SessionId: live.GetId(), ClientSeqId: ptr(int64(0)), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 2, TrainMlp: true}})
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()
	_, err = h.svc.Sessions.FinishSession(h.ctx, &loopsv1.FinishSessionRequest{Id: ended.GetId()})
	require.NoError(t, err)
	require.NoError(t, h.core.Close())

	h2 := newHarness(t, dir, Options{})
	_, err = h2.svc.Sessions.HeartbeatSession(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.HeartbeatSessionRequest{Id: live.GetId()})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err), "another workspace's session")
	_, err = h2.svc.Sessions.HeartbeatSession(h2.ctx, &loopsv1.HeartbeatSessionRequest{Id: live.GetId()})
	require.NoError(t, err, "a live session survives the restart")
	_, err = h2.svc.Sessions.HeartbeatSession(h2.ctx, &loopsv1.HeartbeatSessionRequest{Id: ended.GetId()})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
	require.ErrorContains(t, err, "finished")

	op, err = h2.fb(live.GetId()+":train:0", 1, datum(1, 2))
	require.NoError(t, err)
	require.Equal(t, run, h2.wait(op).GetTrainingRunId(), "the session's run carries on")
	op, err = h2.svc.Training.CreateTrainingRun(h2.ctx, &loopsv1.CreateTrainingRunRequest{SessionId: live.GetId(), ClientSeqId: ptr(int64(1)), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 2, TrainMlp: true}})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h2.wait(op).GetState())
	sess, err := h2.svc.Sessions.GetSession(h2.ctx, &loopsv1.GetSessionRequest{Id: live.GetId()})
	require.NoError(t, err)
	require.Len(t, sess.GetTrainingRunIds(), 2)

	// Finishing it ends it for good, across another restart.
	_, err = h2.svc.Sessions.FinishSession(h2.ctx, &loopsv1.FinishSessionRequest{Id: live.GetId()})
	require.NoError(t, err)
	require.NoError(t, h2.core.Close())
	h3 := newHarness(t, dir, Options{})
	_, err = h3.svc.Sessions.HeartbeatSession(h3.ctx, &loopsv1.HeartbeatSessionRequest{Id: live.GetId()})
	require.Equal(t, connect.CodeFailedPrecondition, connect.CodeOf(err))
}
