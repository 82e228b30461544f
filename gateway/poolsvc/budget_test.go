package poolsvc_test

import (
	"bytes"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/loops-dev/loops/backends/serve"
	"github.com/loops-dev/loops/backends/tiny"
	"github.com/loops-dev/loops/backends/worker"
	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/prices"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
)

// TestBusyDedicatedPoolStoppedAtItsBudget: a dedicated pool of real Go worker processes
// (local provider, one H100-kind replica at 3.6 USD a GPU-hour: 0.001 USD a second) in a
// workspace with a total budget of 0.07 USD, swept every second. Its lease holds the next
// minute (0.06 USD), so once the pool has run about 10 s the lease cannot be topped up, while
// a stream of long forward_backward calls keeps it busy. Through loops.v1 and Tinker's HTTP
// routes:
//   - the pool's worker processes are stopped (gone from /proc), the pool shows why
//     (PoolService) and the audit log has its pool_scale_to_zero event;
//   - the work queued or in flight and the next calls fail with the final budget error
//     naming the budget and the pool (ResourceExhausted, not retried; Tinker: 403,
//     X-Should-Retry false), none hangs or fails otherwise;
//   - the spend ends within the documented bound (docs/operations.md "Budgets": none past
//     the budget while the janitor sweeps on time) and stays put while the pool is stopped;
//   - the checkpoint saved before loads into another run and computes the same loss;
//   - once an operator raises the budget in the policy file (reloaded), the run's next
//     call scales its pool up again (a new worker process) and the run goes on from its
//     state: the same loss as before the stop, and its next optim_step the same as that of
//     the calls that succeeded on the other run; not corrupted.
func TestBusyDedicatedPoolStoppedAtItsBudget(t *testing.T) {
	dir := t.TempDir()
	t.Setenv(goWorkerEnv, "1") // the workers inherit it; this process is past init
	t.Setenv("HF_HUB_CACHE", filepath.Join(dir, "hub"))
	t.Setenv(serve.LogLevelEnv, "WARN")
	const key = "tml-pool-budget-key"
	keys, err := auth.ParseKeys([]string{key + "=team-a"})
	require.NoError(t, err)
	require.NoError(t, keys.AddOperatorKeys([]string{opKey}))
	file := filepath.Join(dir, "prices.yaml")
	require.NoError(t, os.WriteFile(file, []byte("gpu_hour: {H100: \"3.6\"}\n"), 0o600))
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	polFile := filepath.Join(dir, "policy.yaml")
	budget := func(usd string) { // as an operator edits the policy file
		require.NoError(t, os.WriteFile(polFile, []byte("workspaces:\n  team-a: {budget_usd_total: \""+usd+"\"}\n"), 0o600))
	}
	budget("0.07")
	pol, err := policy.Watch(polFile, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	_, url := startServer(t, gateway.Config{DataDir: dir, Backend: worker.Name, Keys: keys,
		// Each forward_backward below is one piece (docs/semantics.md, "Pieces"), so one
		// that fails leaves no gradient behind, and the state after the stop is exactly that
		// of the calls that succeeded.
		Core: core.Options{Prices: sheet, PolicyFile: pol, SweepInterval: time.Second, ChunkTokens: 8192},
		BackendConfig: backendsConfig(dir, map[string]string{"provider": "local", "replicas": "1",
			"gpus": "0,1", "gpus_per_replica": "1", "gpu_kind": "H100"})})
	ctx := t.Context()
	training := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, url, keyed(key))
	ops := loopsv1connect.NewOperationServiceClient(http.DefaultClient, url, keyed(key))
	wait := func(op *loopsv1.Operation) *loopsv1.Operation {
		t.Helper()
		got, err := ops.WaitOperation(ctx, &loopsv1.WaitOperationRequest{Id: op.GetId(), Timeout: durationpb.New(time.Minute)})
		require.NoError(t, err)
		require.Contains(t, []loopsv1.OperationState{loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, loopsv1.OperationState_OPERATION_STATE_FAILED}, got.GetState(), "operation %s did not end within a minute", op.GetId())
		return got
	}
	succeeded := func(op *loopsv1.Operation, err error) *loopsv1.Operation {
		t.Helper()
		require.NoError(t, err)
		got := wait(op)
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, got.GetState(), got.GetError().GetMessage())
		return got
	}
	probe := budgetDatum(0, 24)
	forward := func(run string) float64 {
		t.Helper()
		got := succeeded(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run, LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{probe}}))
		return got.GetForwardBackward().GetMetrics()["loss:sum"]
	}
	adam := &loopsv1.AdamParams{LearningRate: 1e-2, Beta1: 0.9, Beta2: 0.95, Eps: 1e-8}

	run := succeeded(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 1, TrainAttn: true}, Dedicated: &loopsv1.DedicatedPool{Replicas: 1}})).GetTrainingRun()
	pool := run.GetDedicatedPool()
	require.True(t, strings.HasPrefix(pool, "ded-"), "the run has a pool of its own: %q", pool)
	pids := poolPIDs(t, pool)
	require.NotEmpty(t, pids, "the pool's worker process runs")
	succeeded(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run.GetId(), LossFn: "cross_entropy", Data: []*loopsv1.Datum{budgetDatum(1, 24)}}))
	succeeded(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run.GetId(), Adam: adam}))
	saved := succeeded(training.SaveWeights(ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run.GetId(), Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, Name: "before"})).GetSaveWeights().GetPath()
	lossBefore := forward(run.GetId())

	// Busy: long forward_backward calls back to back, four submitted at a time (seconds of
	// work queued, more than the second to the sweep that stops the pool), until admission
	// refuses one. No optim_step, so the weights stay those saved.
	const depth = 4
	long := make([]*loopsv1.Datum, 24)
	for i := range long {
		long[i] = budgetDatum(i, 96)
	}
	start := time.Now()
	var (
		submitted []*loopsv1.Operation
		refusal   error
	)
	for time.Since(start) < 90*time.Second {
		op, err := training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run.GetId(), LossFn: "cross_entropy", Data: long})
		if err != nil {
			refusal = err
			break
		}
		submitted = append(submitted, op)
		if n := len(submitted); n >= depth {
			wait(submitted[n-depth])
		}
	}
	t.Logf("%d forward_backward calls admitted in %v before the refusal", len(submitted), time.Since(start).Round(time.Millisecond))
	requireBudgetError(t, refusal, pool)

	// Every call admitted ended: done, or failed with the error the pool was stopped with.
	stopped, done := 0, 0
	for _, op := range submitted {
		got := wait(op)
		if got.GetState() == loopsv1.OperationState_OPERATION_STATE_SUCCEEDED {
			done++
			continue
		}
		require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
		require.Contains(t, got.GetError().GetMessage(), "budget_usd_total", "failed with the stop, nothing else")
		require.Contains(t, got.GetError().GetMessage(), "so the pool is stopped")
		stopped++
	}
	t.Logf("%d of them failed with the stop", stopped)
	require.Positive(t, stopped, "work queued or running when the pool stopped fails with the stop")

	// The worker processes are gone; the pool shows why; audited once.
	require.Eventually(t, func() bool {
		for _, pid := range pids {
			if _, err := os.Stat("/proc/" + strconv.Itoa(pid)); !errors.Is(err, os.ErrNotExist) {
				return false // running, or exited and not yet waited for
			}
		}
		return len(poolPIDs(t, pool)) == 0
	}, 20*time.Second, 50*time.Millisecond, "the pool's worker processes exited")
	got, err := loopsv1connect.NewPoolServiceClient(http.DefaultClient, url, keyed(opKey)).GetPool(ctx, &loopsv1.GetPoolRequest{Id: pool})
	require.NoError(t, err)
	require.Zero(t, got.GetDesiredReplicas())
	require.Contains(t, got.GetZeroReason(), `workspace "team-a" has spent`)
	require.Contains(t, got.GetZeroReason(), "so the pool is stopped (scaled to zero)")
	var audit *loopsv1.ListAuditEventsResponse
	require.Eventually(t, func() bool { // written once the backend answered the stop
		audit, err = loopsv1connect.NewAuditServiceClient(http.DefaultClient, url, keyed(key)).ListAuditEvents(ctx, &loopsv1.ListAuditEventsRequest{Action: "pool_scale_to_zero"})
		require.NoError(t, err)
		return len(audit.GetEvents()) > 0
	}, 10*time.Second, 50*time.Millisecond, "the stop is audited")
	require.Len(t, audit.GetEvents(), 1)
	require.Equal(t, pool, audit.GetEvents()[0].GetTarget())
	require.Equal(t, got.GetZeroReason(), audit.GetEvents()[0].GetAction())

	// The spend ends within the bound (not past the budget) and stays put while stopped.
	spent, reserved := totalBudget(t, url, key)
	require.LessOrEqual(t, spent, usd(t, "0.07"), "spent %s of the budget", spent)
	require.Positive(t, spent)
	require.Zero(t, reserved, "the lease given back")
	time.Sleep(3 * time.Second) // three sweeps
	again, _ := totalBudget(t, url, key)
	require.Equal(t, spent, again, "a stopped pool bills nothing")
	t.Logf("spent %s USD of the 0.07 USD budget", spent)

	// The next calls are refused at once, on loops.v1 and on Tinker's routes.
	_, err = training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run.GetId(), LossFn: "cross_entropy", Data: []*loopsv1.Datum{probe}})
	requireBudgetError(t, err, pool)
	status, body, h := tinkerCall(t, url+"/api/v1/forward_backward", key, map[string]any{"model_id": run.GetId(), "type": "forward_backward",
		"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{tinkerDatumOf(probe)}}})
	require.Equal(t, 403, status, body)
	require.Equal(t, "false", h.Get("X-Should-Retry"))
	require.Contains(t, body["detail"], "budget_usd_total in its policy")
	require.Contains(t, body["detail"], "dedicated pool "+pool)

	// The checkpoint saved before is intact: another run (on the shared pool) loads it,
	// with its Adam state, and computes the same loss.
	other := succeeded(training.CreateTrainingRun(ctx, &loopsv1.CreateTrainingRunRequest{BaseModel: tiny.Name,
		Lora: &loopsv1.LoraConfig{Rank: 4, Seed: 2, TrainAttn: true}})).GetTrainingRun()
	require.Empty(t, other.GetDedicatedPool())
	succeeded(training.LoadWeights(ctx, &loopsv1.LoadWeightsRequest{TrainingRunId: other.GetId(), Path: saved, WithOptimizer: true}))
	require.Equal(t, lossBefore, forward(other.GetId()), "the checkpoint loads and computes as before")

	// An operator raises the budget: the run's next call scales its pool up and it goes on
	// from its state: its weights, and the gradients of the calls that succeeded (only
	// those), as the other run computes them from the checkpoint.
	budget("1")
	raised := time.Now()
	var first *loopsv1.Operation
	require.Eventually(t, func() bool { // the gateway reads the file within 2 s (filewatch.PollInterval)
		op, err := training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: run.GetId(), LossFn: "cross_entropy", ForwardOnly: true, Data: []*loopsv1.Datum{probe}})
		if err != nil {
			requireBudgetError(t, err, pool)
			return false
		}
		first = op
		return true
	}, 20*time.Second, 100*time.Millisecond, "admitted once the policy file is reloaded")
	require.Equal(t, lossBefore, succeeded(first, nil).GetForwardBackward().GetMetrics()["loss:sum"], "the run goes on from its weights")
	t.Logf("its first call after the raise took %v (the pool scaled up, the adapter rebuilt)", time.Since(raised).Round(time.Millisecond))
	require.NotEmpty(t, poolPIDs(t, pool), "a worker process of the pool runs again")
	succeeded(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: run.GetId(), Adam: adam}))
	for range done {
		succeeded(training.ForwardBackward(ctx, &loopsv1.ForwardBackwardRequest{TrainingRunId: other.GetId(), LossFn: "cross_entropy", Data: long}))
	}
	succeeded(training.OptimStep(ctx, &loopsv1.OptimStepRequest{TrainingRunId: other.GetId(), Adam: adam}))
	require.Equal(t, forward(other.GetId()), forward(run.GetId()), "the step after the stop is the step of the %d calls that succeeded", done)
	info, err := training.GetTrainingRun(ctx, &loopsv1.GetTrainingRunRequest{Id: run.GetId()})
	require.NoError(t, err)
	require.False(t, info.GetCorrupted())
	require.Equal(t, pool, info.GetDedicatedPool())
}

// requireBudgetError checks err is the final budget error of the pool's lease.
func requireBudgetError(t *testing.T, err error, pool string) {
	t.Helper()
	require.Error(t, err, "refused at the budget")
	var ce *connect.Error
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, connect.CodeResourceExhausted, ce.Code(), "%v", err)
	require.Equal(t, errs.ReasonBudgetExceeded, errs.Reason(err))
	require.True(t, errs.IsFinal(err), "not retried: %v", err)
	require.ErrorContains(t, err, `workspace "team-a" has spent`)
	require.ErrorContains(t, err, "budget of 0.07 USD (budget_usd_total in its policy)")
	require.ErrorContains(t, err, "dedicated pool "+pool)
	require.ErrorContains(t, err, "raise budget_usd_total in the workspace policy")
}

// totalBudget is team-a's budget_usd_total spend and reservations (GetWorkspace).
func totalBudget(t *testing.T, url, key string) (spent, reserved money.USD) {
	t.Helper()
	ws, err := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, keyed(key)).GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{})
	require.NoError(t, err)
	for _, b := range ws.GetBudgets() {
		if b.GetName() == "budget_usd_total" {
			return usd(t, b.GetSpentUsd()), usd(t, b.GetReservedUsd())
		}
	}
	t.Fatalf("no budget_usd_total in %v", ws.GetBudgets())
	return 0, 0
}

func usd(t *testing.T, s string) money.USD {
	t.Helper()
	v, err := money.ParseUSD(s, money.Digits)
	require.NoError(t, err)
	return v
}

// poolPIDs lists the processes started for pool: their command line has --pool POOL.
func poolPIDs(t *testing.T, pool string) []int {
	t.Helper()
	ents, err := os.ReadDir("/proc")
	require.NoError(t, err)
	var pids []int
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		cmd, err := os.ReadFile(filepath.Join("/proc", e.Name(), "cmdline"))
		if err != nil {
			continue // exited meanwhile
		}
		args := strings.Split(string(bytes.TrimRight(cmd, "\x00")), "\x00")
		if i := slices.Index(args, "--pool"); i >= 0 && i+1 < len(args) && args[i+1] == pool {
			pids = append(pids, pid)
		}
	}
	return pids
}

// budgetDatum is an n-token cross_entropy datum.
func budgetDatum(i, n int) *loopsv1.Datum {
	d := &loopsv1.Datum{LossFnInputs: map[string]*loopsv1.Tensor{
		"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64}, "weights": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32}}}
	for j := range n {
		d.Tokens = append(d.Tokens, int32(65+(i*7+j)%26))
		d.LossFnInputs["target_tokens"].Int64Data = append(d.LossFnInputs["target_tokens"].Int64Data, int64(65+(i*7+j+1)%26))
		d.LossFnInputs["weights"].Float32Data = append(d.LossFnInputs["weights"].Float32Data, 1)
	}
	return d
}

// tinkerCall posts body as JSON to a Tinker route with key: the status, the JSON answer
// and its headers.
func tinkerCall(t *testing.T, url, key string, body any) (int, map[string]any, http.Header) {
	t.Helper()
	raw, err := json.Marshal(body)
	require.NoError(t, err)
	req, err := http.NewRequestWithContext(t.Context(), http.MethodPost, url, bytes.NewReader(raw))
	require.NoError(t, err)
	req.Header.Set(auth.HeaderName, key)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	var out map[string]any
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
	return resp.StatusCode, out, resp.Header
}

// tinkerDatumOf is d as a Tinker datum.
func tinkerDatumOf(d *loopsv1.Datum) map[string]any {
	n := len(d.GetTokens())
	return map[string]any{
		"model_input": map[string]any{"chunks": []any{map[string]any{"type": "encoded_text", "tokens": d.GetTokens()}}},
		"loss_fn_inputs": map[string]any{
			"target_tokens": map[string]any{"data": d.GetLossFnInputs()["target_tokens"].GetInt64Data(), "dtype": "int64", "shape": []int{n}},
			"weights":       map[string]any{"data": d.GetLossFnInputs()["weights"].GetFloat32Data(), "dtype": "float32", "shape": []int{n}},
		},
	}
}
