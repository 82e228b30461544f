package core

import (
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/auth"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// TestEvalResultStates: a result left running by an earlier process reads as interrupted; one
// running now keeps the deploy gate closed, saying so, as does a failed one; bad requests are
// clear 4xx.
func TestEvalResultStates(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	ws := auth.Workspace(h.ctx)
	ev := h.svc.Evals
	e, err := ev.CreateEval(h.ctx, &loopsv1.CreateEvalRequest{Name: "heldout", Kind: loopsv1.EvalKind_EVAL_KIND_NLL,
		Dataset: []byte(`{"prompt": [1, 2], "completion": [3]}`)})
	require.NoError(t, err)
	for _, tc := range []struct {
		req  *loopsv1.CreateEvalRequest
		want string
	}{
		{&loopsv1.CreateEvalRequest{Name: "x", Dataset: []byte(`{}`)}, "kind must be"},
		{&loopsv1.CreateEvalRequest{Name: "bad name!", Kind: loopsv1.EvalKind_EVAL_KIND_NLL}, "eval name"},
		{&loopsv1.CreateEvalRequest{Name: "x", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, MaxTokens: 3}, "generation and reward evals only"},
		{&loopsv1.CreateEvalRequest{Name: "x", Kind: loopsv1.EvalKind_EVAL_KIND_GENERATION, MaxTokens: 257}, "max_tokens must be 1 to 256"},
		{&loopsv1.CreateEvalRequest{Name: "x", Kind: loopsv1.EvalKind_EVAL_KIND_GENERATION, Match: 9}, "match must be"},
		{&loopsv1.CreateEvalRequest{Name: "x", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, Dataset: []byte("{\"prompt\": [1], \"completion\": [2]}\n[]")}, "dataset line 2"},
	} {
		_, err := ev.CreateEval(h.ctx, tc.req)
		require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
		require.ErrorContains(t, err, tc.want)
	}
	run := h.newRun()
	_, err = ev.AttachEval(h.ctx, &loopsv1.AttachEvalRequest{TrainingRunId: run, EvalId: "heldout", EveryNSteps: -1})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
	_, err = ev.AttachEval(h.ctx, &loopsv1.AttachEvalRequest{TrainingRunId: run, EvalId: "nope"})
	require.Equal(t, connect.CodeNotFound, connect.CodeOf(err))
	_, err = ev.ListEvalResults(h.ctx, &loopsv1.ListEvalResultsRequest{})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))

	op, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "s1"})
	require.NoError(t, err)
	path := h.wait(op).GetSaveWeights().GetPath()
	put := func(state loopsv1.EvalResultState, created time.Time, msg string) {
		require.NoError(t, h.core.store.PutEvalResult(h.ctx, ws, &loopsv1.EvalResult{EvalId: e.GetId(), EvalName: "heldout", TrainingRunId: run,
			CheckpointId: "sampler_weights/s1", TinkerPath: path, State: state, Error: msg, CreateTime: timestamppb.New(created)}))
	}
	gate := func() error {
		_, err := h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{path},
			RequireEvals: []*loopsv1.EvalRequirement{{Eval: "heldout", Op: "<=", Threshold: 10}}})
		return err
	}
	put(loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING, time.Now().Add(time.Hour), "")
	require.ErrorContains(t, gate(), "eval heldout on checkpoint "+path+" is still running")
	put(loopsv1.EvalResultState_EVAL_RESULT_STATE_RUNNING, time.Now().Add(-time.Hour), "") // before this core started
	res, err := ev.ListEvalResults(h.ctx, &loopsv1.ListEvalResultsRequest{TrainingRunId: run})
	require.NoError(t, err)
	require.Equal(t, loopsv1.EvalResultState_EVAL_RESULT_STATE_FAILED, res.GetResults()[0].GetState())
	require.Contains(t, res.GetResults()[0].GetError(), "interrupted")
	require.ErrorContains(t, gate(), "eval heldout failed on checkpoint "+path+" (interrupted")
	_, err = h.svc.Deployments.CreateDeployment(h.ctx, &loopsv1.CreateDeploymentRequest{Name: "d", Checkpoints: []string{path},
		RequireEvals: []*loopsv1.EvalRequirement{{Eval: "heldout", Op: "=="}}})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err))
}
