package core

import (
	"slices"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestRetention: with keep_newest 1 and keep_best 2 by an eval, the sweep keeps each
// kind's newest checkpoint, the two best-scoring sampler checkpoints (lower NLL), the public
// one and the deployed one, marks the others with a deletion time one grace ahead (kept in
// the store), and deletes them once the grace has passed, after a restart too.
func TestRetention(t *testing.T) {
	dir := t.TempDir()
	clock := newTestClock()
	pol, err := policy.Parse([]byte(`default: {checkpoint_keep_newest: 1, checkpoint_keep_best: 2, checkpoint_keep_best_eval: heldout, checkpoint_retention_grace_seconds: 3600}`))
	require.NoError(t, err)
	opts := Options{Policy: pol, Now: clock.Now, SweepInterval: time.Hour}
	h := newHarness(t, dir, opts)
	ws := auth.Workspace(h.ctx)
	run := h.newRun()
	save := func(kind loopsv1.CheckpointKind, name string) string {
		op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: kind, Name: name})
		require.NoError(t, err)
		done := h.wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
		clock.add(time.Second)
		return done.GetSaveWeights().GetCheckpoint().GetId()
	}
	sampler, training := loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING
	t1, t2 := save(training, "t1"), save(training, "t2")
	s := []string{save(sampler, "s1"), save(sampler, "s2"), save(sampler, "s3"), save(sampler, "s4"), save(sampler, "s5"), save(sampler, "s6")}
	st := h.core.store
	e := &loopsv1.Eval{Id: "eval-x", Name: "heldout", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, CreateTime: timestamppb.New(clock.Now())}
	require.NoError(t, st.CreateEval(h.ctx, ws, e, []byte("x")))
	for i, score := range []float64{3, 1, 2.5, 0.5, 4, 9} { // best (lowest): s4, s2
		require.NoError(t, st.PutEvalResult(h.ctx, ws, &loopsv1.EvalResult{EvalId: e.Id, TrainingRunId: run, CheckpointId: s[i], Score: score,
			State: loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED, CreateTime: timestamppb.New(clock.Now())}))
	}
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: "tinker://" + run + "/sampler_weights/s1", Public: true})
	require.NoError(t, err)
	_, err = h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{"tinker://" + run + "/sampler_weights/s3"}})
	require.NoError(t, err)

	marked := func() (out []string) {
		list, _, err := st.ListCheckpoints(h.ctx, ws, run, store.Page{})
		require.NoError(t, err)
		for _, ck := range list {
			if ck.GetRetentionDeleteTime() != nil {
				require.Equal(t, clock.Now().Add(time.Hour).Unix(), ck.GetRetentionDeleteTime().AsTime().Unix(), ck.GetId())
				out = append(out, ck.GetId())
			}
		}
		slices.Sort(out)
		return out
	}
	present := func(st store.Store) (out []string) {
		list, _, err := st.ListCheckpoints(h.ctx, ws, run, store.Page{})
		require.NoError(t, err)
		for _, ck := range list {
			out = append(out, ck.GetId())
		}
		slices.Sort(out)
		return out
	}
	h.core.sweepRetention(h.ctx, clock.Now())
	// Kept: t2 (newest training), s6 (newest sampler), s4 and s2 (best), s1 (public), s3 (deployed).
	require.Equal(t, []string{s[4], t1}, marked())
	clock.add(30 * time.Minute)
	h.core.sweepRetention(h.ctx, clock.Now())
	require.Len(t, present(st), 8, "within the grace nothing is deleted")

	// A restart: the marks are in the store; past the grace the new process deletes them.
	require.NoError(t, h.core.Close())
	require.NoError(t, st.Close())
	clock.add(31 * time.Minute)
	h2 := newHarness(t, dir, opts)
	h2.core.sweepRetention(h.ctx, clock.Now())
	require.Equal(t, []string{s[0], s[1], s[2], s[3], s[5], t2}, present(h2.core.store))
}
