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

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

func TestSparkline(t *testing.T) {
	require.Equal(t, "▁▂▃▄▅▆▇█", sparkline([]float64{0, 1, 2, 3, 4, 5, 6, 7}))
	require.Equal(t, "▁▁▁", sparkline([]float64{2, 2, 2}))
	require.Equal(t, "█ ▁", sparkline([]float64{1, 0 / zero(), -1}))
}

func zero() float64 { return 0 }

// TestRunsShowAlerts checks that printRunShow prints runhealth's alerts for crafted steps,
// and none for a healthy run.
func TestRunsShowAlerts(t *testing.T) {
	run := &loopsv1.TrainingRun{Id: "r1", BaseModel: "loops/tiny", OptimSteps: 2}
	fb := func(step int64, loss, kl, zero float64) *loopsv1.StepMetrics {
		return &loopsv1.StepMetrics{Kind: loopsv1.OperationKind_OPERATION_KIND_FORWARD_BACKWARD, Step: step, LossFn: "ppo", LossMean: loss, LossSum: loss,
			LossTokens: 1, Rl: &loopsv1.RLStepMetrics{KlSampleTrainK3: kl, ZeroAdvantageFraction: zero}}
	}
	var out bytes.Buffer
	healthy := []*loopsv1.StepMetrics{fb(1, 1, 0.001, 0.5), fb(2, 0.9, 0.002, 0.25)}
	require.NoError(t, printRunShow(&out, run, healthy, healthy))
	require.NotContains(t, out.String(), "ALERT")

	out.Reset()
	bad := []*loopsv1.StepMetrics{fb(1, 0/zero(), 0.2, 1), fb(2, 1, 0.2, 1)}
	require.NoError(t, printRunShow(&out, run, bad, bad))
	text := out.String()
	require.Contains(t, text, "ALERT non_finite: loss is NaN at step 1\n      usually: divergence")
	require.Contains(t, text, "ALERT kl_sample_train: kl_sample_train 0.2 at step 2 is above 0.01")
	require.Contains(t, text, "ALERT zero_advantage: zero-advantage share 100% at step 2")
}

// TestRunsShow trains two RL steps through loops serve (the reference engine) and checks
// what `loops runs show` prints: the run, loss and KL sparklines and a row per step.
func TestRunsShow(t *testing.T) {
	sheet := filepath.Join(t.TempDir(), "prices.yaml")
	require.NoError(t, os.WriteFile(sheet, []byte("models:\n  loops/tiny: {train: \"0.40\"}\n"), 0o600))
	url, _ := startServe(t, t.TempDir(), "--prices", sheet)
	key := connect.WithInterceptors(connect.UnaryInterceptorFunc(func(next connect.UnaryFunc) connect.UnaryFunc {
		return func(ctx context.Context, req connect.AnyRequest) (connect.AnyResponse, error) {
			req.Header().Set("X-API-Key", "tml-serve-test")
			return next(ctx, req)
		}
	}))
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, key)
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, key)
	wait := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got, err := ops.WaitOperation(t.Context(), &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(60 * time.Second)})
		require.NoError(t, err)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	created := wait(training.CreateTrainingRun(t.Context(), &loopsv1.CreateTrainingRunRequest{BaseModel: "loops/tiny", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}}))
	run := created.GetTrainingRunId()
	f := func(v ...float32) *loopsv1.Tensor {
		return &loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: v}
	}
	for step := int64(1); step <= 2; step++ {
		wait(training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: 2*step - 1, LossFn: "ppo",
			Data: []*loopsv1.Datum{{Tokens: []int32{72, 105, 33, 10}, LossFnInputs: map[string]*loopsv1.Tensor{
				"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: []int64{105, 33, 10, 72}},
				"logprobs":      f(0, -3, -4, -5),
				"advantages":    f(0, 1, 1, 1),
			}}}}))
		wait(training.OptimStep(t.Context(), &loopsv1.OptimStepRequest{TrainingRunId: run, SeqId: 2 * step, Adam: &loopsv1.AdamParams{LearningRate: 1e-3}}))
	}

	var out bytes.Buffer
	cmd := rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"runs", "show", run, "--url", url, "--api-key", "tml-serve-test"})
	require.NoError(t, cmd.ExecuteContext(t.Context()))
	text := out.String()
	require.Contains(t, text, "run:         "+run)
	require.Contains(t, text, "optim steps: 2")
	var lossLine, klLine string
	for _, l := range strings.Split(text, "\n") {
		switch {
		case strings.HasPrefix(l, "loss  "):
			lossLine = l
		case strings.HasPrefix(l, "kl    "):
			klLine = l
		}
	}
	require.Equal(t, 2, strings.Count(lossLine, "▁")+strings.Count(lossLine, "█")+strings.Count(lossLine, "▄"), lossLine)
	require.NotEmpty(t, klLine)
	require.Regexp(t, `(?m)^STEP\s+FB\s+LOSS FN\s+LOSS/TOKEN`, text)
	require.Regexp(t, `(?m)^1\s+1\s+ppo\s+-?\d+\.\d{4}\s+4\s+1\s+\S+\s+\S+±\S+\s+0%\s+\d+\.\d%\s+0\.001\s`, text)
	require.Regexp(t, `(?m)^2\s+1\s+ppo\s`, text)
	// Under the price sheet: 4 tokens × $0.40 / 1e6 a step, two steps.
	require.Contains(t, text, "cost:        0.0000032 USD of training tokens")
	require.Regexp(t, `(?m)^STEP\s.*BACKEND\s+COST \(USD\)$`, text)
	require.Regexp(t, `(?m)^1\s+1\s+ppo\s.*s\s+0\.0000016$`, text)

	out.Reset()
	cmd = rootCmd()
	cmd.SetOut(&out)
	cmd.SetArgs([]string{"usage", "--cost", "--url", url, "--api-key", "tml-serve-test"})
	require.NoError(t, cmd.ExecuteContext(t.Context()))
	require.Regexp(t, `(?m)^TOTAL\s+training_tokens\s+8\s+0\.0000032$`, out.String())
	require.Regexp(t, `(?m)^TOTAL COST\s+0\.0000032$`, out.String())
	// The sampler logprobs sent are far from the tiny model's: the KL alert is raised.
	require.Regexp(t, `(?m)^ALERT kl_sample_train: kl_sample_train \S+ at step 2 is above 0.01 .*\n      usually: off-policy data`, text)

	// Another workspace's key: not found.
	cmd = rootCmd()
	cmd.SetOut(&bytes.Buffer{})
	cmd.SetErr(&bytes.Buffer{})
	cmd.SetArgs([]string{"runs", "show", run, "--url", url, "--api-key", "tml-someone-else"})
	require.Error(t, cmd.ExecuteContext(t.Context()))
}

// TestStorageCost sums the priced checkpoint storage of one session exactly, leaving out
// other sessions, other kinds and unpriced rows.
// TestStorageCost: loops runs show sums the run's own storage rows, says apart its session's
// rows metered before storage was metered per run, and sums its pool time; unpriced rows and
// other runs' and kinds' rows add nothing, and nothing priced prints nothing.
func TestStorageCost(t *testing.T) {
	b := func(kind loopsv1.UsageKind, session, run, cost string) *loopsv1.UsageBucket {
		u := &loopsv1.UsageBucket{Kind: kind, SessionId: session, TrainingRunId: run, Amount: 1, CostUsd: cost}
		if cost != "" {
			u.PricedAmount = 1
		}
		return u
	}
	const storage = loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS
	var out strings.Builder
	require.NoError(t, printRunCosts(&out, []*loopsv1.UsageBucket{
		b(storage, "s1", "run-1", "0.000084931507"), b(storage, "s1", "run-1", "0.000000235921"), b(storage, "s1", "run-2", "1"),
		b(storage, "s1", "", "0.000042465753"), b(storage, "s2", "", "2"),
		b(loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS, "s1", "", "1"), b(storage, "s1", "run-1", ""),
		b(loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS, "s1", "run-1", "3"),
		b(loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS, "s1", "run-1", "0.25"),
		b(loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS, "s1", "run-2", "7"),
	}, "run-1", "s1"))
	require.Equal(t, `storage cost: 0.000085167428 USD for the run's checkpoints held in the last 30 days (metered by the hour)
              and 0.000042465753 USD for its session's checkpoints metered before storage was metered per run
pool cost:    3.25 USD for its dedicated pool's time in the last 30 days
`, out.String())
	out.Reset()
	require.NoError(t, printRunCosts(&out, []*loopsv1.UsageBucket{b(storage, "s1", "run-1", "")}, "run-1", "s1"))
	require.Empty(t, out.String(), "nothing priced")
}
