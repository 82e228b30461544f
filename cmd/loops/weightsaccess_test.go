package main

import (
	"context"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestCheckpointShareAndCopyCommands drives loops checkpoints share|share list|share
// revoke|copy against loops serve, with two keys (two workspaces).
func TestCheckpointShareAndCopyCommands(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	url, _ := startServe(t, t.TempDir())
	const keyA, keyB = "tml-share-a", "tml-share-b"
	withKey := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", keyA)
			return next(ctx, req)
		}
	}))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, withKey)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, withKey)
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(60 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	run := wait(training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})).GetTrainingRunId()
	path := wait(training.SaveWeights(t.Context(), &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "c1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING})).GetSaveWeights().GetPath()
	as := func(key string) []string { return []string{"--url", url, "--api-key", key} }

	out, err := runCLI(t, append([]string{"checkpoints", "share", path, "--ttl", "1h", "--description", "for b"}, as(keyA)...)...)
	require.NoError(t, err, out)
	secret := regexp.MustCompile(`lwat_[0-9a-f]{64}`).FindString(out)
	id := regexp.MustCompile(`wat-[0-9a-f]{16}`).FindString(out)
	require.NotEmpty(t, secret, out)
	require.NotEmpty(t, id, out)

	out, err = runCLI(t, append([]string{"checkpoints", "share", "list"}, as(keyA)...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, id)
	require.Contains(t, out, "for b")
	require.NotContains(t, out, secret)
	out, err = runCLI(t, append([]string{"checkpoints", "share", "list"}, as(keyB)...)...)
	require.NoError(t, err, out)
	require.NotContains(t, out, id)

	_, err = runCLI(t, append([]string{"checkpoints", "copy", path}, as(keyB)...)...)
	require.Error(t, err, "without the token the checkpoint is not B's to read")
	out, err = runCLI(t, append([]string{"checkpoints", "copy", path, "--token", secret, "--project", "p1"}, as(keyB)...)...)
	require.NoError(t, err, out)
	copied := strings.TrimSpace(out)
	require.True(t, strings.HasPrefix(copied, "tinker://") && copied != path, copied)
	withB := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", keyB)
			return next(ctx, req)
		}
	}))
	ck, err := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, withB).GetCheckpoint(t.Context(), &loopsv1.GetCheckpointRequest{Path: copied})
	require.NoError(t, err)
	require.Equal(t, "p1", ck.GetProjectId())
	require.Equal(t, path, ck.GetCopiedFrom())

	_, err = runCLI(t, append([]string{"checkpoints", "share", "revoke", id}, as(keyB)...)...)
	require.Error(t, err, "only the owner revokes")
	out, err = runCLI(t, append([]string{"checkpoints", "share", "revoke", id}, as(keyA)...)...)
	require.NoError(t, err, out)
	_, err = runCLI(t, append([]string{"checkpoints", "copy", path, "--token", secret}, as(keyB)...)...)
	require.ErrorContains(t, err, "revoked")
}
