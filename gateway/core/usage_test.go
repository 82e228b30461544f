package core

import (
	"path/filepath"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// usageByKind sums a usage response's amounts per kind, checking each bucket's shape.
func usageByKind(t *testing.T, res *loopsv1.GetUsageResponse, model, session string) map[loopsv1.UsageKind]int64 {
	t.Helper()
	out := map[loopsv1.UsageKind]int64{}
	for _, b := range res.GetBuckets() {
		require.Equal(t, model, b.GetBaseModel())
		require.Equal(t, session, b.GetSessionId())
		require.Equal(t, time.Hour, b.GetEndTime().AsTime().Sub(b.GetStartTime().AsTime()))
		require.Equal(t, b.GetStartTime().AsTime().Truncate(time.Hour), b.GetStartTime().AsTime())
		out[b.GetKind()] += b.GetAmount()
	}
	return out
}

func TestUsageIsRecordedForSucceededWork(t *testing.T) {
	dir := t.TempDir()
	h := newHarness(t, dir, Options{})
	sess, err := h.svc.Sessions.CreateSession(h.ctx, &loopsv1.CreateSessionRequest{})
	require.NoError(t, err)
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		SessionId: sess.GetId(), BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true},
	})
	require.NoError(t, err)
	run := h.wait(op).GetTrainingRunId()

	// A training step of 3+2 tokens, a forward-only pass of 4, and a rejected request.
	op, err = h.fb(run, 1, datum(1, 2, 3), datum(4, 5))
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	op, err = h.svc.Training.ForwardBackward(h.ctx, &loopsv1.ForwardBackwardRequest{
		TrainingRunId: run, SeqId: 2, Data: []*loopsv1.Datum{datum(1, 2, 3, 4)}, LossFn: "cross_entropy", ForwardOnly: true,
	})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
	_, err = h.fb(run, 3, datum(1))
	require.NoError(t, err)

	// A save for the sampler (one checkpoint) and a sample of 3 sequences of 2 tokens from a
	// prompt of 4 tokens.
	op, err = h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{
		TrainingRunId: run, SeqId: 4, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER,
	})
	require.NoError(t, err)
	saved := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, saved.GetState(), saved.GetError().GetMessage())
	op, err = h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{
		SamplerId: saved.GetSaveWeights().GetSamplerId(), Prompt: []int32{1, 2, 3, 4}, NumSamples: 3,
	})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())

	res, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	want := map[loopsv1.UsageKind]int64{
		loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS:         3 + 2 + 4 + 1,
		loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS: 4,
		loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:  3 * 2,
		loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS:             1,
	}
	// The third forward_backward may still be running; wait for it through usage.
	require.Eventually(t, func() bool {
		res, err = h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{})
		require.NoError(t, err)
		return usageByKind(t, res, "fake/model", sess.GetId())[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS] == 10
	}, 5*time.Second, 10*time.Millisecond)
	require.Equal(t, want, usageByKind(t, res, "fake/model", sess.GetId()))

	// Another workspace sees none of it.
	other, err := h.svc.Usage.GetUsage(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	require.Empty(t, other.GetBuckets())

	// A range that ends before the work began holds none of it either.
	past, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{
		StartTime: timestamppb.New(time.Now().Add(-48 * time.Hour)), EndTime: timestamppb.New(time.Now().Add(-24 * time.Hour)),
	})
	require.NoError(t, err)
	require.Empty(t, past.GetBuckets())
}

func TestUsageIsFlushedOnClose(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "usage.db")
	st, err := sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	c, err := New(t.Context(), st, newFakeBackend(), Options{DataDir: dir})
	require.NoError(t, err)
	c.recordUsage("ws-a", "fake/model", "sess-1", store.UsageTraining, 7)
	c.recordUsage("ws-a", "fake/model", "sess-1", store.UsageTraining, 3)
	c.recordUsage("ws-a", "fake/model", "sess-1", store.UsageCheckpoint, 0) // ignored
	require.NoError(t, c.Close())
	require.NoError(t, st.Close())

	st, err = sqlite.Open(t.Context(), path)
	require.NoError(t, err)
	defer func() { require.NoError(t, st.Close()) }()
	recs, err := st.ListUsage(t.Context(), "ws-a", time.Now().Add(-2*time.Hour), time.Now().Add(time.Hour))
	require.NoError(t, err)
	require.Len(t, recs, 1)
	require.Equal(t, store.UsageTraining, recs[0].Kind)
	require.EqualValues(t, 10, recs[0].Amount)
}

func TestGetUsageValidatesTheRange(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	now := time.Now()
	_, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{
		StartTime: timestamppb.New(now), EndTime: timestamppb.New(now.Add(-time.Second)),
	})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	_, err = h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{
		StartTime: timestamppb.New(now.Add(-367 * 24 * time.Hour)), EndTime: timestamppb.New(now),
	})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	_, err = h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{
		StartTime: timestamppb.New(now.Add(-366 * 24 * time.Hour)), EndTime: timestamppb.New(now),
	})
	require.NoError(t, err)
	_, err = h.svc.Usage.GetUsage(t.Context(), &loopsv1.GetUsageRequest{})
	require.Equal(t, connect.CodeUnauthenticated, connect.CodeOf(err))
}
