package core

import (
	"io"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core/ckfiles"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

func ttlOf(d time.Duration) *int64 { s := int64(d / time.Second); return &s }

// codeOf requires an error and returns its code's name.
func codeOf(t *testing.T, err error) string {
	t.Helper()
	require.Error(t, err)
	return connect.CodeOf(err).String()
}

// checkpointBytes reads one file of a checkpoint record of workspace ws from the store.
func checkpointBytes(t *testing.T, h *harness, ws string, ck *loopsv1.Checkpoint, file string) []byte {
	t.Helper()
	key, err := ckfiles.RecordKey(ws, ck)
	require.NoError(t, err)
	r, _, err := h.core.CheckpointStore().Open(t.Context(), key, file)
	require.NoError(t, err)
	defer r.Close()
	b, err := io.ReadAll(r)
	require.NoError(t, err)
	return b
}

// TestCopyWeightsWithAccessToken: workspace A issues a token for one checkpoint; B copies
// it into a run of its own (project recorded), which survives A deleting the source; the
// token reads nothing else of A; revoked or expired, it is refused.
func TestCopyWeightsWithAccessToken(t *testing.T) {
	clock := newTestClock()
	h := newHarness(t, t.TempDir(), Options{Now: clock.Now})
	wa := h.svc.Weights
	ctxB := auth.WithWorkspace(t.Context(), "ws-b")
	run := h.newRun()
	shared, err := h.save(run, "shared", false)
	require.NoError(t, err)
	private, err := h.save(run, "private", false)
	require.NoError(t, err)

	issued, err := wa.CreateWeightsAccessToken(h.ctx, &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: shared, Description: "for ws-b"})
	require.NoError(t, err)
	secret := issued.GetToken()
	require.True(t, wellFormedAccessToken(secret), secret)
	require.Equal(t, shared, issued.GetWeightsAccessToken().GetCheckpointPath())
	require.WithinDuration(t, clock.Now().Add(DefaultWeightsAccessTTL), issued.GetWeightsAccessToken().GetExpireTime().AsTime(), time.Minute)

	// Without the token, B sees nothing of A's; with it, only the shared checkpoint.
	_, err = wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: shared})
	require.Equal(t, "not_found", codeOf(t, err))
	_, err = wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: private, WeightsAccessToken: secret})
	require.Equal(t, "not_found", codeOf(t, err), "a token for one checkpoint reads no other")
	_, err = wa.CreateWeightsAccessToken(ctxB, &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: shared})
	require.Equal(t, "not_found", codeOf(t, err), "only the owner issues tokens for a checkpoint")

	res, err := wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: shared, WeightsAccessToken: secret, DestinationProjectId: "proj-dest", TtlSeconds: ttlOf(2 * time.Hour)})
	require.NoError(t, err)
	cp := res.GetCheckpoint()
	require.Equal(t, cp.GetTinkerPath(), res.GetTinkerPath())
	require.NotEqual(t, run, cp.GetTrainingRunId())
	require.Equal(t, "weights/shared", cp.GetId())
	require.Equal(t, "proj-dest", cp.GetProjectId())
	require.Equal(t, shared, cp.GetCopiedFrom())
	require.WithinDuration(t, clock.Now().Add(2*time.Hour), cp.GetExpireTime().AsTime(), time.Minute)
	src, err := h.svc.Checkpoints.GetCheckpoint(h.ctx, &loopsv1.GetCheckpointRequest{Path: shared})
	require.NoError(t, err)
	require.Equal(t, src.GetSizeBytes(), cp.GetSizeBytes())
	want := checkpointBytes(t, h, "ws-a", src, "adapter_model.safetensors")
	require.Equal(t, want, checkpointBytes(t, h, "ws-b", cp, "adapter_model.safetensors"))

	// B lists its copy (and its run); A's listing does not show it, nor B's A's.
	listB, err := h.svc.Checkpoints.ListCheckpoints(ctxB, &loopsv1.ListCheckpointsRequest{})
	require.NoError(t, err)
	require.Len(t, listB.GetCheckpoints(), 1)
	require.Equal(t, cp.GetTinkerPath(), listB.GetCheckpoints()[0].GetTinkerPath())
	listA, err := h.svc.Checkpoints.ListCheckpoints(h.ctx, &loopsv1.ListCheckpointsRequest{})
	require.NoError(t, err)
	for _, ck := range listA.GetCheckpoints() {
		require.NotEqual(t, cp.GetTinkerPath(), ck.GetTinkerPath())
	}
	copyRun, err := h.svc.Training.GetTrainingRun(ctxB, &loopsv1.GetTrainingRunRequest{Id: cp.GetTrainingRunId()})
	require.NoError(t, err)
	require.Contains(t, copyRun.GetUnloadReason(), "copy of "+shared)
	_, err = h.svc.Training.GetTrainingRun(h.ctx, &loopsv1.GetTrainingRunRequest{Id: cp.GetTrainingRunId()})
	require.Equal(t, "not_found", codeOf(t, err))

	// A deletes the source: B's copy stays whole and trainable from.
	_, err = h.svc.Checkpoints.DeleteCheckpoint(h.ctx, &loopsv1.DeleteCheckpointRequest{Path: shared})
	require.NoError(t, err)
	require.Equal(t, want, checkpointBytes(t, h, "ws-b", cp, "adapter_model.safetensors"))
	op, err := h.svc.Training.CreateTrainingRun(ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: cp.GetTinkerPath()})
	require.NoError(t, err)
	got, err := h.svc.Operations.WaitOperation(ctxB, &loopsv1.WaitOperationRequest{Id: op.GetId()})
	require.NoError(t, err)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())

	// Revoked: refused. Another workspace cannot revoke A's token.
	shared2, err := h.save(run, "shared", false)
	require.NoError(t, err)
	issued2, err := wa.CreateWeightsAccessToken(h.ctx, &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: shared2, TtlSeconds: ttlOf(time.Hour)})
	require.NoError(t, err)
	_, err = wa.RevokeWeightsAccessToken(ctxB, &loopsv1.RevokeWeightsAccessTokenRequest{Id: issued2.GetWeightsAccessToken().GetId()})
	require.Equal(t, "not_found", codeOf(t, err))
	tokens, err := wa.ListWeightsAccessTokens(h.ctx, &loopsv1.ListWeightsAccessTokensRequest{})
	require.NoError(t, err)
	require.Len(t, tokens.GetWeightsAccessTokens(), 2)
	for _, tk := range tokens.GetWeightsAccessTokens() {
		require.NotContains(t, tk.String(), strings.TrimPrefix(issued2.GetToken(), weightsAccessPrefix), "listings never show a secret")
	}
	tokensB, err := wa.ListWeightsAccessTokens(ctxB, &loopsv1.ListWeightsAccessTokensRequest{})
	require.NoError(t, err)
	require.Empty(t, tokensB.GetWeightsAccessTokens())
	_, err = wa.RevokeWeightsAccessToken(h.ctx, &loopsv1.RevokeWeightsAccessTokenRequest{Id: issued.GetWeightsAccessToken().GetId()})
	require.NoError(t, err)
	_, err = wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: shared2, WeightsAccessToken: secret})
	require.Equal(t, "permission_denied", codeOf(t, err))
	require.Contains(t, err.Error(), "unknown, revoked or expired")

	// Expired: refused, then deleted by the janitor.
	_, err = wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: shared2, WeightsAccessToken: issued2.GetToken()})
	require.NoError(t, err)
	clock.add(time.Hour + time.Second)
	_, err = wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: shared2, WeightsAccessToken: issued2.GetToken()})
	require.Equal(t, "permission_denied", codeOf(t, err))
	h.core.expireWeightsAccessTokens(t.Context(), clock.Now())
	_, _, err = h.core.store.GetWeightsAccessToken(t.Context(), hashAccessToken(issued2.GetToken()))
	require.Error(t, err)

	// A malformed token is refused the same way, before any lookup.
	_, err = wa.CopyWeights(ctxB, &loopsv1.CopyWeightsRequest{SourcePath: shared2, WeightsAccessToken: "lwat_xyz"})
	require.Equal(t, "permission_denied", codeOf(t, err))
}

// TestCopyWeightsIsIdempotentByKey: a retry with the same idempotency key answers the first
// copy; the key reused for another source is refused; without a key every copy is new.
func TestCopyWeightsIsIdempotentByKey(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	wa := h.svc.Weights
	run := h.newRun()
	a, err := h.save(run, "a", false)
	require.NoError(t, err)
	b, err := h.save(run, "b", false)
	require.NoError(t, err)

	first, err := wa.CopyWeights(h.ctx, &loopsv1.CopyWeightsRequest{SourcePath: a, IdempotencyKey: "k1"})
	require.NoError(t, err)
	again, err := wa.CopyWeights(h.ctx, &loopsv1.CopyWeightsRequest{SourcePath: a, IdempotencyKey: "k1"})
	require.NoError(t, err)
	require.Equal(t, first.GetTinkerPath(), again.GetTinkerPath())
	_, err = wa.CopyWeights(h.ctx, &loopsv1.CopyWeightsRequest{SourcePath: b, IdempotencyKey: "k1"})
	require.Equal(t, "invalid_argument", codeOf(t, err))
	other, err := wa.CopyWeights(h.ctx, &loopsv1.CopyWeightsRequest{SourcePath: a})
	require.NoError(t, err)
	require.NotEqual(t, first.GetTinkerPath(), other.GetTinkerPath())
	// The same key in another workspace is another copy (of a public checkpoint here).
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: a, Public: true})
	require.NoError(t, err)
	inB, err := wa.CopyWeights(auth.WithWorkspace(t.Context(), "ws-b"), &loopsv1.CopyWeightsRequest{SourcePath: a, IdempotencyKey: "k1"})
	require.NoError(t, err)
	require.NotEqual(t, first.GetTinkerPath(), inB.GetTinkerPath())
	// A copy of a copy names the copy as its source.
	cc, err := wa.CopyWeights(h.ctx, &loopsv1.CopyWeightsRequest{SourcePath: first.GetTinkerPath()})
	require.NoError(t, err)
	require.Equal(t, first.GetTinkerPath(), cc.GetCheckpoint().GetCopiedFrom())
}

// TestWeightsAccessBounds: bad input is InvalidArgument saying what to fix; a workspace
// holds at most MaxWeightsAccessTokens live tokens (then ResourceExhausted).
func TestWeightsAccessBounds(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	wa := h.svc.Weights
	run := h.newRun()
	path, err := h.save(run, "c", false)
	require.NoError(t, err)
	for name, req := range map[string]*loopsv1.CreateWeightsAccessTokenRequest{
		"no path":         {},
		"malformed path":  {CheckpointPath: "tinker://x"},
		"ttl too short":   {CheckpointPath: path, TtlSeconds: ttlOf(time.Second)},
		"ttl too long":    {CheckpointPath: path, TtlSeconds: ttlOf(400 * 24 * time.Hour)},
		"ttl negative":    {CheckpointPath: path, TtlSeconds: ttlOf(-time.Hour)},
		"long text":       {CheckpointPath: path, Description: strings.Repeat("x", maxTokenDescription+1)},
		"control in text": {CheckpointPath: path, Description: "a\x00b"},
	} {
		_, err := wa.CreateWeightsAccessToken(h.ctx, req)
		require.Equal(t, "invalid_argument", codeOf(t, err), name)
	}
	for name, req := range map[string]*loopsv1.CopyWeightsRequest{
		"no source":    {},
		"bad ttl":      {SourcePath: path, TtlSeconds: ttlOf(0)},
		"long project": {SourcePath: path, DestinationProjectId: strings.Repeat("p", maxProjectID+1)},
		"long key":     {SourcePath: path, IdempotencyKey: strings.Repeat("k", maxIdempotencyKey+1)},
	} {
		_, err := wa.CopyWeights(h.ctx, req)
		require.Equal(t, "invalid_argument", codeOf(t, err), name)
	}
	_, err = wa.RevokeWeightsAccessToken(h.ctx, &loopsv1.RevokeWeightsAccessTokenRequest{})
	require.Equal(t, "invalid_argument", codeOf(t, err))

	for range MaxWeightsAccessTokens {
		_, err := wa.CreateWeightsAccessToken(h.ctx, &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: path})
		require.NoError(t, err)
	}
	_, err = wa.CreateWeightsAccessToken(h.ctx, &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: path})
	require.Equal(t, "resource_exhausted", codeOf(t, err))
	require.Contains(t, err.Error(), "revoke one")
	// Another workspace's bound is its own.
	_, err = h.svc.Checkpoints.SetCheckpointPublic(h.ctx, &loopsv1.SetCheckpointPublicRequest{Path: path, Public: true})
	require.NoError(t, err)
	list, err := wa.ListWeightsAccessTokens(h.ctx, &loopsv1.ListWeightsAccessTokensRequest{})
	require.NoError(t, err)
	require.Len(t, list.GetWeightsAccessTokens(), MaxWeightsAccessTokens)
}

// TestLoadWithAccessToken: a weights-access token also lets the other workspace create a run
// from the checkpoint, or load it into a run of its own (Tinker's load_weights with
// weights_access_token), and nothing else of the owner's.
func TestLoadWithAccessToken(t *testing.T) {
	h := newHarness(t, t.TempDir(), Options{})
	ctxB := auth.WithWorkspace(t.Context(), "ws-b")
	run := h.newRun()
	shared, err := h.save(run, "shared", false)
	require.NoError(t, err)
	private, err := h.save(run, "private", false)
	require.NoError(t, err)
	issued, err := h.svc.Weights.CreateWeightsAccessToken(h.ctx, &loopsv1.CreateWeightsAccessTokenRequest{CheckpointPath: shared})
	require.NoError(t, err)
	secret := issued.GetToken()
	waitB := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := h.svc.Operations.WaitOperation(ctxB, &loopsv1.WaitOperationRequest{Id: op.GetId()})
		require.NoError(t, err)
		return got
	}

	_, err = h.svc.Training.CreateTrainingRun(ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: shared})
	require.Equal(t, "not_found", codeOf(t, err))
	_, err = h.svc.Training.CreateTrainingRun(ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: private, WeightsAccessToken: secret})
	require.Equal(t, "not_found", codeOf(t, err))
	_, err = h.svc.Training.CreateTrainingRun(ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: shared, WeightsAccessToken: "lwat_bad"})
	require.Equal(t, "permission_denied", codeOf(t, err))
	made := waitB(h.svc.Training.CreateTrainingRun(ctxB, &loopsv1.CreateTrainingRunRequest{FromCheckpoint: shared, WithOptimizer: true, WeightsAccessToken: secret}))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, made.GetState(), made.GetError().GetMessage())

	loaded := waitB(h.svc.Training.LoadWeights(ctxB, &loopsv1.LoadWeightsRequest{TrainingRunId: made.GetTrainingRunId(), SeqId: 1, Path: shared, WeightsAccessToken: secret}))
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, loaded.GetState(), loaded.GetError().GetMessage())
	_, err = h.svc.Weights.RevokeWeightsAccessToken(h.ctx, &loopsv1.RevokeWeightsAccessTokenRequest{Id: issued.GetWeightsAccessToken().GetId()})
	require.NoError(t, err)
	_, err = h.svc.Training.LoadWeights(ctxB, &loopsv1.LoadWeightsRequest{TrainingRunId: made.GetTrainingRunId(), SeqId: 2, Path: shared, WeightsAccessToken: secret})
	require.Equal(t, "permission_denied", codeOf(t, err))
}
