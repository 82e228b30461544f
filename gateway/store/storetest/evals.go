package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// testEvals: evals (create, a taken name or id is ErrExists, get by id and name, the
// dataset, list by name, delete with its attachments), attachments (upsert, list per run)
// and results (upsert per run, checkpoint and eval; lists by run, by eval, newest first,
// limited; delete per checkpoint), all scoped to the workspace.
func testEvals(t *testing.T, open func(t *testing.T) store.Store) {
	ctx := t.Context()
	st := open(t)
	eb := &loopsv1.Eval{Id: "eval-b", Name: "beta", Kind: loopsv1.EvalKind_EVAL_KIND_NLL, Rows: 2, Sha256: "ab", CreateTime: ts(time.Second)}
	ea := &loopsv1.Eval{Id: "eval-a", Name: "alpha", Kind: loopsv1.EvalKind_EVAL_KIND_GENERATION, Stop: []string{"\n"}, CreateTime: ts(2 * time.Second)}
	require.Error(t, st.CreateEval(ctx, wsA, &loopsv1.Eval{Name: "x"}, nil), "an eval needs an id")
	require.NoError(t, st.CreateEval(ctx, wsA, eb, []byte("{\"prompt\":\"a\"}\n")))
	require.NoError(t, st.CreateEval(ctx, wsA, ea, []byte("x")))
	require.ErrorIs(t, st.CreateEval(ctx, wsA, &loopsv1.Eval{Id: "eval-c", Name: "beta"}, nil), store.ErrExists)
	require.ErrorIs(t, st.CreateEval(ctx, wsB, &loopsv1.Eval{Id: "eval-b", Name: "other"}, nil), store.ErrExists, "ids are unique across workspaces")
	require.NoError(t, st.CreateEval(ctx, wsB, &loopsv1.Eval{Id: "eval-bb", Name: "beta"}, nil), "names are per workspace")

	got, err := st.GetEval(ctx, wsA, "eval-b")
	require.NoError(t, err)
	requireProtoEqual(t, eb, got)
	got, err = st.GetEvalByName(ctx, wsA, "alpha")
	require.NoError(t, err)
	requireProtoEqual(t, ea, got)
	_, err = st.GetEval(ctx, wsB, "eval-b")
	requireNotFound(t, err)
	data, err := st.GetEvalDataset(ctx, wsA, "eval-b")
	require.NoError(t, err)
	require.Equal(t, "{\"prompt\":\"a\"}\n", string(data))
	_, err = st.GetEvalDataset(ctx, wsB, "eval-b")
	requireNotFound(t, err)
	list, err := st.ListEvals(ctx, wsA)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.Eval{ea, eb}, list)

	// Attachments.
	at := func(run, ev string, n int64, sec time.Duration) *loopsv1.EvalAttachment {
		return &loopsv1.EvalAttachment{TrainingRunId: run, EvalId: ev, EveryNSteps: n, CreateTime: ts(sec)}
	}
	require.Error(t, st.PutEvalAttachment(ctx, wsA, &loopsv1.EvalAttachment{EvalId: "eval-a"}))
	require.NoError(t, st.PutEvalAttachment(ctx, wsA, at("r1", "eval-b", 0, time.Second)))
	require.NoError(t, st.PutEvalAttachment(ctx, wsA, at("r1", "eval-a", 0, 2*time.Second)))
	require.NoError(t, st.PutEvalAttachment(ctx, wsA, at("r1", "eval-b", 5, 3*time.Second)), "replaces")
	require.Error(t, st.PutEvalAttachment(ctx, wsB, at("r1", "eval-b", 1, time.Second)), "another workspace's key")
	atts, err := st.ListEvalAttachments(ctx, wsA, "r1")
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalAttachment{at("r1", "eval-a", 0, 2*time.Second), at("r1", "eval-b", 5, 3*time.Second)}, atts)
	atts, err = st.ListEvalAttachments(ctx, wsB, "r1")
	require.NoError(t, err)
	require.Empty(t, atts)

	// Results.
	res := func(run, ck, ev string, sec time.Duration, score float64) *loopsv1.EvalResult {
		return &loopsv1.EvalResult{TrainingRunId: run, CheckpointId: ck, EvalId: ev, CreateTime: ts(sec), Score: score,
			State: loopsv1.EvalResultState_EVAL_RESULT_STATE_SUCCEEDED, Metrics: map[string]float64{"nll": score}}
	}
	require.Error(t, st.PutEvalResult(ctx, wsA, &loopsv1.EvalResult{TrainingRunId: "r1", EvalId: "eval-a"}))
	r1 := res("r1", "sampler_weights/s1", "eval-b", time.Second, 1.5)
	r2 := res("r1", "sampler_weights/s2", "eval-b", 2*time.Second, 1.2)
	r3 := res("r1", "sampler_weights/s2", "eval-a", 2*time.Second, 0.5)
	r4 := res("r2", "sampler_weights/s1", "eval-b", 3*time.Second, 0.9)
	for _, r := range []*loopsv1.EvalResult{r1, r2, r3, r4} {
		require.NoError(t, st.PutEvalResult(ctx, wsA, r))
	}
	r2.Score = 1.1
	require.NoError(t, st.PutEvalResult(ctx, wsA, r2), "replaces")
	require.Error(t, st.PutEvalResult(ctx, wsB, r1), "another workspace's key")
	got2, err := st.ListEvalResults(ctx, wsA, "r1", "", "", 100)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalResult{r2, r3, r1}, got2)
	got2, err = st.ListEvalResults(ctx, wsA, "", "", "eval-b", 100)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalResult{r4, r2, r1}, got2)
	got2, err = st.ListEvalResults(ctx, wsA, "r1", "", "eval-b", 1)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalResult{r2}, got2)
	got2, err = st.ListEvalResults(ctx, wsA, "r1", "sampler_weights/s2", "", 100)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalResult{r2, r3}, got2)
	got2, err = st.ListEvalResults(ctx, wsA, "", "", "", 100)
	require.NoError(t, err)
	require.Empty(t, got2, "no filter lists nothing")
	got2, err = st.ListEvalResults(ctx, wsB, "r1", "", "", 100)
	require.NoError(t, err)
	require.Empty(t, got2)

	require.NoError(t, st.DeleteEvalResults(ctx, wsB, "r1", "sampler_weights/s2"), "another workspace's: nothing")
	require.NoError(t, st.DeleteEvalResults(ctx, wsA, "r1", "sampler_weights/s2"))
	got2, err = st.ListEvalResults(ctx, wsA, "r1", "", "", 100)
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalResult{r1}, got2)

	// Delete an eval: its attachments go, its results stay.
	requireNotFound(t, st.DeleteEval(ctx, wsB, "eval-b"))
	require.NoError(t, st.DeleteEval(ctx, wsA, "eval-b"))
	requireNotFound(t, st.DeleteEval(ctx, wsA, "eval-b"))
	_, err = st.GetEval(ctx, wsA, "eval-b")
	requireNotFound(t, err)
	atts, err = st.ListEvalAttachments(ctx, wsA, "r1")
	require.NoError(t, err)
	requireProtoEqual(t, []*loopsv1.EvalAttachment{at("r1", "eval-a", 0, 2*time.Second)}, atts)
	got2, err = st.ListEvalResults(ctx, wsA, "", "", "eval-b", 100)
	require.NoError(t, err)
	require.Len(t, got2, 2)
}
