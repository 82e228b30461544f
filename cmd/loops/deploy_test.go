package main

import (
	"bytes"
	"context"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// runCLI runs the loops command line with args and returns what it printed.
func runCLI(t *testing.T, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetErr(&out)
	cmd.SetArgs(args)
	err := cmd.ExecuteContext(t.Context())
	return out.String(), err
}

// TestDeployAndCheckpointCommands drives loops deploy create|list|show|grant|revoke|delete
// and loops checkpoints export|import against loops serve.
func TestDeployAndCheckpointCommands(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	url, _ := startServe(t, t.TempDir())
	const keyA, keyB = "tml-deploy-a", "tml-deploy-b"
	with := func(key string) connect.ClientOption {
		return connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
			return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
				req.Header().Set("X-API-Key", key)
				return next(ctx, req)
			}
		}))
	}
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, with(keyA))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, with(keyA))
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(60 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	run := wait(training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})).GetTrainingRunId()
	path := wait(training.SaveWeights(t.Context(), &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "c1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})).GetSaveWeights().GetPath()
	wsInfo, err := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, with(keyB)).GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{})
	require.NoError(t, err)
	wsB := wsInfo.GetName()
	a := []string{"--url", url, "--api-key", keyA}

	out, err := runCLI(t, append([]string{"deploy", "create", "--name", "web", "--checkpoint", path, "--replicas", "2"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "model       web\n")
	require.Contains(t, out, "model       web/c1\n")
	require.Contains(t, out, "replicas    2\n")
	out, err = runCLI(t, append([]string{"deploy", "list"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "web ")
	out, err = runCLI(t, append([]string{"deploy", "grant", "web", wsB}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "shared with  "+wsB)
	out, err = runCLI(t, "deploy", "list", "--url", url, "--api-key", keyB)
	require.NoError(t, err, out)
	require.Contains(t, out, "web ")
	owner := strings.Fields(strings.Split(out, "\n")[1])[1]
	out, err = runCLI(t, "deploy", "show", owner+":web", "--url", url, "--api-key", keyB)
	require.NoError(t, err, out)
	require.Contains(t, out, "model       "+owner+":web/c1")
	out, err = runCLI(t, append([]string{"deploy", "revoke", "web", wsB}, a...)...)
	require.NoError(t, err, out)
	_, err = runCLI(t, "deploy", "show", owner+":web", "--url", url, "--api-key", keyB)
	require.Error(t, err)

	// Export both formats, then import the PEFT folder back.
	dir := t.TempDir()
	out, err = runCLI(t, append([]string{"checkpoints", "export", path, "--format", "peft", "-o", filepath.Join(dir, "peft")}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "wrote 2 files")
	out, err = runCLI(t, append([]string{"checkpoints", "export", path, "--format", "merged", "-o", filepath.Join(dir, "merged")}, a...)...)
	require.NoError(t, err, out)
	for _, f := range []string{"config.json", "model.safetensors", "tokenizer.json"} {
		_, err := os.Stat(filepath.Join(dir, "merged", f))
		require.NoError(t, err, f)
	}
	_, err = runCLI(t, append([]string{"checkpoints", "export", path, "--format", "gguf", "-o", dir}, a...)...)
	require.ErrorContains(t, err, "want peft or merged")
	out, err = runCLI(t, append([]string{"checkpoints", "import", filepath.Join(dir, "peft"), "--base-model", "loops/tiny", "--name", "back"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "imported tinker://")
	require.Contains(t, out, "/weights/back (base model loops/tiny, rank 4")
	_, err = runCLI(t, append([]string{"checkpoints", "import", filepath.Join(dir, "merged"), "--base-model", "loops/tiny"}, a...)...)
	require.ErrorContains(t, err, "is a merged model folder")

	// The deployed checkpoint cannot be deleted; the deployment can.
	cks := loopsv1connect.NewCheckpointServiceClient(http.DefaultClient, url, with(keyA))
	_, err = cks.DeleteCheckpoint(t.Context(), &loopsv1.DeleteCheckpointRequest{Path: path})
	require.ErrorContains(t, err, "deployment web")
	out, err = runCLI(t, append([]string{"deploy", "delete", "web"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "deleted deployment web")
	_, err = cks.DeleteCheckpoint(t.Context(), &loopsv1.DeleteCheckpointRequest{Path: path})
	require.NoError(t, err)
}

// TestPrintUsageWithDeployments: usage through a deployment gets a DEPLOYMENT column.
func TestPrintUsageWithDeployments(t *testing.T) {
	h := timestamppb.New(time.Date(2026, 1, 2, 3, 0, 0, 0, time.UTC))
	var out strings.Builder
	require.NoError(t, printUsage(&out, []*loopsv1.UsageBucket{
		{StartTime: h, BaseModel: "loops/tiny", Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: 5},
		{StartTime: h, BaseModel: "loops/tiny", Deployment: "ws-a:web", Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: 7},
		{StartTime: h, BaseModel: "loops/tiny", Deployment: "ws-a:web", SessionId: "s", Kind: loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS, Amount: 1},
	}, usageView{}))
	require.Equal(t, strings.Join([]string{
		"BUCKET (UTC)      MODEL       DEPLOYMENT  KIND                    AMOUNT",
		"2026-01-02 03:00  loops/tiny  -           sampling_sample_tokens  5",
		"2026-01-02 03:00  loops/tiny  ws-a:web    sampling_sample_tokens  8",
		"TOTAL                                     sampling_sample_tokens  13",
		"",
	}, "\n"), out.String())
}
