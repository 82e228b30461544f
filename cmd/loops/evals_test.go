package main

import (
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

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestEvalsCommands drives loops evals create|attach|list|show, loops runs show's eval
// results and loops deploy create --require-eval against loops serve.
func TestEvalsCommands(t *testing.T) {
	t.Setenv("HF_HUB_CACHE", t.TempDir())
	url, _ := startServe(t, t.TempDir())
	const key = "tml-evals-a"
	a := []string{"--url", url, "--api-key", key}
	with := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", key)
			return next(ctx, req)
		}
	}))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, with)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, with)
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(60 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}

	data := filepath.Join(t.TempDir(), "heldout.jsonl")
	require.NoError(t, os.WriteFile(data, []byte("{\"prompt\": \"hello \", \"completion\": \"world\"}\n{\"prompt\": [65, 66], \"completion\": [67]}\n"), 0o600))
	bad := filepath.Join(t.TempDir(), "bad.jsonl")
	require.NoError(t, os.WriteFile(bad, []byte("{\"prompt\": \"a\", \"completion\": \"b\"}\n{\"prompt\": \"a\", \"answer\": 1}\n"), 0o600))
	out, err := runCLI(t, append([]string{"evals", "create", "bad", "--kind", "nll", "--file", bad}, a...)...)
	require.Error(t, err, out)
	require.Contains(t, err.Error(), "dataset line 2")
	out, err = runCLI(t, append([]string{"evals", "create", "heldout", "--kind", "nll", "--file", data}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "heldout")
	out, err = runCLI(t, append([]string{"evals", "list"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "heldout  nll")

	run := wait(training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}})).GetTrainingRunId()
	out, err = runCLI(t, append([]string{"evals", "attach", run, "heldout"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "attached eval heldout to run "+run)
	path := wait(training.SaveWeights(t.Context(), &loopsv1.SaveWeightsRequest{TrainingRunId: run, Name: "c1", Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER})).GetSaveWeights().GetPath()

	deadline := time.Now().Add(2 * time.Minute) // a bound for a hang, not a timing
	for {
		out, err = runCLI(t, append([]string{"evals", "show", "heldout"}, a...)...)
		require.NoError(t, err, out)
		if strings.Contains(out, "succeeded") {
			break
		}
		require.NotContains(t, out, "failed")
		require.True(t, time.Now().Before(deadline), out)
		time.Sleep(50 * time.Millisecond)
	}
	require.Contains(t, out, run+"  heldout")
	require.Contains(t, out, "sampler_weights/c1")
	require.Contains(t, out, "perplexity=")
	out, err = runCLI(t, append([]string{"runs", "show", run}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "heldout  sampler_weights/c1  0     succeeded")
	require.Contains(t, out, "storage:     1 checkpoints, ")

	out, err = runCLI(t, append([]string{"deploy", "create", "--name", "web", "--checkpoint", path, "--require-eval", "heldout<=0.001"}, a...)...)
	require.Error(t, err, out)
	require.Contains(t, err.Error(), "deploy gate: checkpoint "+path+" scores")
	require.Contains(t, err.Error(), "below the threshold <= 0.001")
	out, err = runCLI(t, append([]string{"deploy", "create", "--name", "web", "--checkpoint", path, "--require-eval", "heldout<=1000"}, a...)...)
	require.NoError(t, err, out)
	require.Contains(t, out, "  lineage   run "+run+", base model loops/tiny, step 0")
	require.Contains(t, out, "  eval      heldout = ")
	_, err = runCLI(t, append([]string{"deploy", "create", "--name", "x", "--checkpoint", path, "--require-eval", "heldout"}, a...)...)
	require.ErrorContains(t, err, "write NAME>=THRESHOLD or NAME<=THRESHOLD")
}
