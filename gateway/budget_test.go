package gateway_test

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"

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

// TestBudgetHoldsUnderConcurrentClients: 8 clients of one workspace train as fast as they
// can against a total budget of 100 µ$ at 12 µ$ a forward_backward. Admission reserves each
// operation's estimate, so the workspace stops at 8 operations (96 µ$): never past its
// budget, and every client is refused with a final (not retried) error that names the
// budget, the spend and how to raise it. Another workspace is not affected.
func TestBudgetHoldsUnderConcurrentClients(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {train: \"1.00\", sample: \"1.00\", prefill: \"1.00\"}\n", time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	pol, err := policy.Parse([]byte("workspaces:\n  team-b: {budget_usd_total: \"0.0001\", budget_usd_month: 1}\n"))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices, c.Core.Policy = sheet, pol })

	const clients = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		done    int
		refusal []error
	)
	cls := make([]*costClient, clients)
	for i := range cls {
		cls[i] = newCostClient(t, url, keyB)
	}
	for _, cl := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				in, tgt, w := tokens(12)
				op, err := cl.training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: cl.run, LossFn: "cross_entropy",
					Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
						"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
						"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
					}}}})
				if err != nil {
					mu.Lock()
					refusal = append(refusal, err)
					mu.Unlock()
					return
				}
				cl.wait(op)
				mu.Lock()
				done++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 8, done, "96 µ$ of 100: a ninth operation would pass the budget")
	require.Len(t, refusal, clients)
	for _, err := range refusal {
		var ce *connect.Error
		require.True(t, errors.As(err, &ce), err)
		require.Equal(t, connect.CodeResourceExhausted, ce.Code())
		require.True(t, errs.IsFinal(err), "X-Should-Retry: false, so the SDK fails at once: %v", err)
		require.Regexp(t, `workspace "team-b" has spent 0\.0000\d+ USD in all \(and has 0(\.0000\d+)? USD of work running\)`, err.Error())
		require.Contains(t, err.Error(), "budget of 0.0001 USD (budget_usd_total in its policy)")
		require.Contains(t, err.Error(), "raise budget_usd_total in the workspace policy")
	}
	spent := must(money.ParseUSD(cls[0].costs()[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS][2], money.Digits))
	require.Equal(t, "0.000096", spent.String(), "spent, exactly, never past the budget")

	// Over Tinker's HTTP route: 403 with X-Should-Retry: false, so the tinker SDK fails at
	// once instead of retrying a 429 for 5 minutes (errs.ReasonBudgetExceeded).
	status, body, h := callHeaders(t, url, "/api/v1/forward_backward", keyB, map[string]any{"model_id": cls[0].run, "type": "forward_backward",
		"forward_backward_input": map[string]any{"loss_fn": "cross_entropy", "data": []any{tinkerDatum(12)}}})
	requireTinker(t, status, body, http.StatusForbidden, "(budget_usd_total in its policy)")
	require.Equal(t, "false", h.Get("X-Should-Retry"))

	// Sampling is refused too: its estimate (prompt + num_samples × max_tokens) would pass.
	_, err = cls[0].sampling.Sample(t.Context(), &loopsv1.SampleRequest{BaseModel: "loops/tiny", Prompt: []int32{1, 2}, NumSamples: 1,
		Params: &loopsv1.SamplingParams{MaxTokens: 4}})
	require.True(t, errs.IsFinal(err), "%v", err)

	// Another workspace has no budget.
	require.NotNil(t, newCostClient(t, url, keyA).train(12).GetCost())
}

// TestBudgetCountsSpendBeforeARestart: a workspace's spend is read back from the store
// after a restart, so a budget set then counts what was spent before it.
func TestBudgetCountsSpendBeforeARestart(t *testing.T) {
	dir := t.TempDir()
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {train: \"1.00\"}\n", time.Hour)
	start := func(budget string) (string, func()) {
		sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		pol, err := policy.Parse([]byte("workspaces:\n  team-b: {budget_usd_month: \"" + budget + "\"}\n"))
		require.NoError(t, err)
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		keys, err := auth.ParseKeys([]string{keyA, keyB + "=team-b"})
		require.NoError(t, err)
		srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dir, Keys: keys, Core: core.Options{Prices: sheet, Policy: pol}})
		require.NoError(t, err)
		go func() { _ = srv.Serve() }()
		return "http://" + ln.Addr().String(), func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			require.NoError(t, srv.Close(ctx))
		}
	}
	url, stop := start("0") // no budget yet
	cl := newCostClient(t, url, keyB)
	for range 3 {
		cl.train(12) // 3 × 12 µ$
	}
	stop()

	url, stop = start("0.00005") // 50 µ$ a month: 36 spent, one more 12 µ$ operation fits
	defer stop()
	cl = newCostClient(t, url, keyB)
	cl.train(12)
	in, tgt, w := tokens(12)
	_, err := cl.training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: cl.run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})
	require.True(t, errs.IsFinal(err), "%v", err)
	require.ErrorContains(t, err, "has spent 0.000048 USD this month (UTC)")
}

// TestBudgetAlerts: a monthly budget of 50 µ$ at 12 µ$ a forward_backward. The third
// operation brings the spend to 72% (the 50% alert), the fourth to 96% (80%), the fifth is
// refused at the cap (100%); each threshold is written to the audit log once and shown by
// GetWorkspace, and more refusals write nothing more.
func TestBudgetAlerts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {train: \"1.00\"}\n", time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	pol, err := policy.Parse([]byte("workspaces:\n  team-b: {budget_usd_month: \"0.00005\"}\n"))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices, c.Core.Policy = sheet, pol })
	cl := newCostClient(t, url, keyB)
	wsClient := loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyB))
	budget := func() *loopsv1.WorkspaceBudget {
		ws := must(wsClient.GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{}))
		require.Len(t, ws.GetBudgets(), 1)
		return ws.GetBudgets()[0]
	}
	alertTargets := func(n int) []string {
		var out []string
		require.Eventually(t, func() bool {
			out = out[:0]
			for _, e := range auditEvents(t, url, keyB, "budget_alert") {
				out = append(out, e.GetTarget())
			}
			return len(out) >= n
		}, 10*time.Second, 20*time.Millisecond)
		return out
	}
	month := time.Now().UTC().Format("2006-01")

	cl.train(12)
	cl.train(12)
	b := budget()
	require.Equal(t, "0.000024", b.GetSpentUsd())
	require.Empty(t, b.GetAlerts(), "48%: no alert yet")
	cl.train(12)
	require.Equal(t, []int32{50}, budget().GetAlerts())
	cl.train(12)
	b = budget()
	require.Equal(t, []int32{50, 80}, b.GetAlerts())
	require.Equal(t, "budget_usd_month", b.GetName())
	require.Equal(t, "0.00005", b.GetLimitUsd())
	require.Equal(t, "0.000048", b.GetSpentUsd())
	require.Equal(t, month, b.GetPeriod())
	for range 3 { // refused at the cap: the 100% alert, once
		in, tgt, w := tokens(12)
		_, err := cl.training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: cl.run, LossFn: "cross_entropy",
			Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
				"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
				"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
			}}}})
		require.Equal(t, errs.ReasonBudgetExceeded, errs.Reason(err), "%v", err)
	}
	require.Equal(t, []int32{50, 80, 100}, budget().GetAlerts())
	got := alertTargets(3)
	time.Sleep(200 * time.Millisecond) // nothing more comes
	require.ElementsMatch(t, []string{"budget_usd_month " + month + " 50%", "budget_usd_month " + month + " 80%",
		"budget_usd_month " + month + " 100%"}, alertTargets(3))
	require.Len(t, got, 3)

	// Another workspace, without a budget, shows none.
	ws := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyA)).GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{}))
	require.Empty(t, ws.GetBudgets())
	require.Empty(t, auditEvents(t, url, keyA, "budget_alert"))
}

// TestKeyBudgetHoldsUnderConcurrentClients: 8 clients share one API key with a total budget
// of 100 µ$ at 12 µ$ a forward_backward (the workspace has no budget). Admission reserves
// each operation's estimate against the key's budget, so the key stops at 8 operations (96
// µ$) and every client is refused with a final error that names the key's budget, its spend
// and the command that raises it. Another key of the workspace is not affected; raising
// the budget (UpdateKey, admin only) admits work again at once.
func TestKeyBudgetHoldsUnderConcurrentClients(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {train: \"1.00\"}\n", time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) {
		c.Core.Prices = sheet
		require.NoError(t, c.Keys.AddOperatorKeys([]string{operatorKey}))
	})
	keys := loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(operatorKey))
	create := func(req *loopsv1.CreateKeyRequest) *loopsv1.CreateKeyResponse {
		req.Workspace = "team-k"
		return must(keys.CreateKey(t.Context(), req))
	}
	_, err = keys.CreateKey(t.Context(), &loopsv1.CreateKeyRequest{Workspace: "team-k", BudgetUsdTotal: "-1"})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	budgeted := create(&loopsv1.CreateKeyRequest{Name: "capped", BudgetUsdTotal: "0.0001"})
	require.Equal(t, "0.0001", budgeted.GetKey().GetBudgetUsdTotal())
	other := create(&loopsv1.CreateKeyRequest{Name: "free"})
	kid := budgeted.GetKey().GetId()

	const clients = 8
	var (
		wg      sync.WaitGroup
		mu      sync.Mutex
		done    int
		refusal []error
	)
	cls := make([]*costClient, clients)
	for i := range cls {
		cls[i] = newCostClient(t, url, budgeted.GetSecret())
	}
	for _, cl := range cls {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				in, tgt, w := tokens(12)
				op, err := cl.training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: cl.run, LossFn: "cross_entropy",
					Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
						"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
						"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
					}}}})
				if err != nil {
					mu.Lock()
					refusal = append(refusal, err)
					mu.Unlock()
					return
				}
				cl.wait(op)
				mu.Lock()
				done++
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	require.Equal(t, 8, done, "96 µ$ of 100: a ninth operation would pass the key's budget")
	require.Len(t, refusal, clients)
	for _, err := range refusal {
		require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err), "%v", err)
		require.Equal(t, errs.ReasonBudgetExceeded, errs.Reason(err), "%v", err)
		require.True(t, errs.IsFinal(err), "%v", err)
		require.Regexp(t, `API key `+kid+` has spent 0\.0000\d+ USD in all \(and has 0(\.0000\d+)? USD of work running\)`, err.Error())
		require.Contains(t, err.Error(), "budget of 0.0001 USD (budget_usd_total of the key)")
		require.Contains(t, err.Error(), "loops keys update "+kid+" --budget-usd-total USD")
	}
	spent := must(money.ParseUSD(cls[0].costs()[loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS][2], money.Digits))
	require.Equal(t, "0.000096", spent.String(), "the workspace's spend, all of it the key's: never past its budget")

	// Another key of the workspace is not affected.
	require.NotNil(t, newCostClient(t, url, other.GetSecret()).train(12).GetCost())

	// Only an admin raises it; the new budget holds at once.
	_, err = loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(other.GetSecret())).
		UpdateKey(t.Context(), &loopsv1.UpdateKeyRequest{Id: kid, BudgetUsdTotal: proto.String("1")})
	require.Equal(t, connect.CodePermissionDenied, connect.CodeOf(err), "%v", err)
	_, err = keys.UpdateKey(t.Context(), &loopsv1.UpdateKeyRequest{Id: kid})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	_, err = keys.UpdateKey(t.Context(), &loopsv1.UpdateKeyRequest{Id: kid, BudgetUsdMonth: proto.String("1.0000001")})
	require.Equal(t, connect.CodeInvalidArgument, connect.CodeOf(err), "%v", err)
	rec := must(keys.UpdateKey(t.Context(), &loopsv1.UpdateKeyRequest{Id: kid, BudgetUsdTotal: proto.String("0.000110"), BudgetUsdMonth: proto.String("5")}))
	require.Equal(t, "0.00011", rec.GetBudgetUsdTotal())
	require.Equal(t, "5", rec.GetBudgetUsdMonth())
	cls[0].train(12) // 108 µ$ of 110
	in, tgt, w := tokens(12)
	_, err = cls[0].training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: cls[0].run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})
	require.ErrorContains(t, err, "has spent 0.000108 USD in all")
	rec = must(keys.UpdateKey(t.Context(), &loopsv1.UpdateKeyRequest{Id: kid, BudgetUsdTotal: proto.String("0")}))
	require.Empty(t, rec.GetBudgetUsdTotal(), "0 removes the budget")
	require.Equal(t, "5", rec.GetBudgetUsdMonth(), "an unset budget stays")
	cls[0].train(12)
}
