package gateway_test

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net"
	"net/http"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/core"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
	"github.com/loops-dev/loops/internal/errs"
)

func requireProtoEqual[M proto.Message](t *testing.T, want, got []M, msg string) {
	t.Helper()
	require.Empty(t, cmp.Diff(want, got, protocmp.Transform()), msg)
}

// refuseTrain runs one forward_backward of 12 tokens that its budget must refuse.
func refuseTrain(t *testing.T, cl *costClient) {
	t.Helper()
	in, tgt, w := tokens(12)
	_, err := cl.training.ForwardBackward(t.Context(), &loopsv1.ForwardBackwardRequest{TrainingRunId: cl.run, LossFn: "cross_entropy",
		Data: []*loopsv1.Datum{{Tokens: in, LossFnInputs: map[string]*loopsv1.Tensor{
			"target_tokens": {Dtype: loopsv1.Dtype_DTYPE_INT64, Int64Data: tgt},
			"weights":       {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Float32Data: w},
		}}}})
	require.Equal(t, errs.ReasonBudgetExceeded, errs.Reason(err), "%v", err)
}

// alertTargets waits until ws's audit log (read with key) holds at least n budget_alert
// events, then a little more to see that no other comes, and returns their targets.
func alertTargets(t *testing.T, url, key string, n int) []string {
	t.Helper()
	var out []string
	read := func() []string {
		out = out[:0]
		for _, e := range auditEvents(t, url, key, "budget_alert") {
			out = append(out, e.GetTarget())
		}
		return out
	}
	require.Eventually(t, func() bool { return len(read()) >= n }, 10*time.Second, 20*time.Millisecond, "%d alerts", n)
	time.Sleep(300 * time.Millisecond)
	return read()
}

// TestKeyBudgetAlerts: an API key's total budget of 50 µ$ at 12 µ$ a forward_backward (no
// workspace budget). Its spend and alerts show on the key (ListKeys, UpdateKey) and in
// GetWorkspace's key_budgets: 72% alerts 50%, 96% alerts 80%, a refusal at the cap 100%;
// each threshold writes one audit event naming the key, and the key's other figures are
// exact (hand computation: 12 tokens × $1/M = 12 µ$ a step).
func TestKeyBudgetAlerts(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {train: \"1.00\"}\n", time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	url := "http://" + startServerWith(t, func(c *gateway.Config) {
		c.Core.Prices = sheet
		require.NoError(t, c.Keys.AddOperatorKeys([]string{operatorKey}))
	})
	keys := loopsv1connect.NewKeyServiceClient(http.DefaultClient, url, withKey(operatorKey))
	capped := must(keys.CreateKey(t.Context(), &loopsv1.CreateKeyRequest{Workspace: "team-k", Name: "capped", BudgetUsdTotal: "0.00005"}))
	admin := must(keys.CreateKey(t.Context(), &loopsv1.CreateKeyRequest{Workspace: "team-k", Name: "admin", Role: loopsv1.KeyRole_KEY_ROLE_ADMIN}))
	kid := capped.GetKey().GetId()
	status := func() []*loopsv1.WorkspaceBudget {
		var got []*loopsv1.WorkspaceBudget
		for _, k := range must(keys.ListKeys(t.Context(), &loopsv1.ListKeysRequest{Workspace: "team-k"})).GetKeys() {
			if k.GetId() == kid {
				got = k.GetBudgetStatus()
			} else {
				require.Empty(t, k.GetBudgetStatus(), "a key without a budget has no status")
			}
		}
		ws := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(admin.GetSecret())).
			GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{}))
		require.Empty(t, ws.GetBudgets(), "the workspace has no budget of its own")
		requireProtoEqual(t, got, ws.GetKeyBudgets(), "GetWorkspace shows the key's budget as ListKeys does")
		return got
	}
	want := func(spent string, alerts ...int32) []*loopsv1.WorkspaceBudget {
		return []*loopsv1.WorkspaceBudget{{Name: "budget_usd_total", LimitUsd: "0.00005", SpentUsd: spent, ReservedUsd: "0", KeyId: kid, Alerts: alerts}}
	}
	requireProtoEqual(t, want("0"), status(), "loaded from the store before any work")

	cl := newCostClient(t, url, capped.GetSecret())
	cl.train(12)
	cl.train(12)
	requireProtoEqual(t, want("0.000024"), status(), "48%: no alert")
	cl.train(12)
	requireProtoEqual(t, want("0.000036", 50), status(), "72%")
	cl.train(12)
	requireProtoEqual(t, want("0.000048", 50, 80), status(), "96%")
	for range 2 {
		refuseTrain(t, cl)
	}
	requireProtoEqual(t, want("0.000048", 50, 80, 100), status(), "refused at the cap")
	requireProtoEqual(t, want("0.000048", 50, 80, 100),
		must(keys.UpdateKey(t.Context(), &loopsv1.UpdateKeyRequest{Id: kid, BudgetUsdTotal: proto.String("0.00005")})).GetBudgetStatus(),
		"UpdateKey answers with the status")
	require.ElementsMatch(t, []string{kid + " budget_usd_total 50%", kid + " budget_usd_total 80%", kid + " budget_usd_total 100%"},
		alertTargets(t, url, admin.GetSecret(), 3))
	for _, e := range auditEvents(t, url, admin.GetSecret(), "budget_alert") {
		require.Equal(t, kid, e.GetKeyId())
	}
}

// crashStore is a store whose gateway dies at a chosen step of recording a budget alert:
// once dead, every usage write and alert record fails, as if the process had stopped (what
// it wrote before stays). Reads still work, for the test to look.
type crashStore struct {
	store.Store
	mu sync.Mutex
	// dead: the gateway has stopped. failAlerts: it stops before it records an alert.
	// dieAfterAlert: it stops just after the store commits one.
	dead, failAlerts, dieAfterAlert bool
}

var errCrashed = errors.New("the gateway crashed (test)")

func (s *crashStore) die() {
	s.mu.Lock()
	s.dead = true
	s.mu.Unlock()
}

func (s *crashStore) AddUsage(ctx context.Context, ws string, u store.UsageRecord) error {
	s.mu.Lock()
	dead := s.dead
	s.mu.Unlock()
	if dead {
		return errCrashed
	}
	return s.Store.AddUsage(ctx, ws, u)
}

func (s *crashStore) RecordBudgetAlert(ctx context.Context, a store.BudgetAlert, ev store.OwnedAuditEvent) (bool, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.dead || s.failAlerts {
		return false, errCrashed
	}
	ok, err := s.Store.RecordBudgetAlert(ctx, a, ev)
	s.dead = s.dieAfterAlert
	return ok, err
}

// TestBudgetAlertsSurviveACrash: a monthly budget of 50 µ$ at 12 µ$ a forward_backward, and
// a gateway that crashes at each step between spend crossing an alert threshold and the
// alert being recorded. After a restart on the same database, every alert is in the audit
// log exactly once:
//   - crashed before the usage was written: the spend that crossed 50% is lost with it, so
//     nothing alerts; spend crossing 50% again alerts once;
//   - crashed after the usage was written, before the alerts were recorded: the restarted
//     gateway finds the spend past 50% and 80% with no alert recorded and records both, once
//     (a second restart adds none);
//   - crashed just after the 50% alert was recorded (its usage lost): the alert shows, and
//     spend crossing 50% again does not repeat it; 80% alerts once.
func TestBudgetAlertsSurviveACrash(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "models:\n  loops/tiny: {train: \"1.00\"}\n", time.Hour)
	month := time.Now().UTC().Format("2006-01")
	target := func(p string) string { return "budget_usd_month " + month + " " + p + "%" }
	start := func(t *testing.T, dir string, cs *crashStore) (string, func()) {
		sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		pol, err := policy.Parse([]byte("workspaces:\n  team-b: {budget_usd_month: \"0.00005\"}\n"))
		require.NoError(t, err)
		st, err := sqlite.Open(t.Context(), filepath.Join(dir, "loops.db"))
		require.NoError(t, err)
		cs.Store = st
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		keys, err := auth.ParseKeys([]string{keyB + "=team-b"})
		require.NoError(t, err)
		srv, err := gateway.New(t.Context(), ln, gateway.Config{DataDir: dir, Keys: keys, Store: cs, Core: core.Options{Prices: sheet, Policy: pol}})
		require.NoError(t, err)
		go func() { _ = srv.Serve() }()
		return "http://" + ln.Addr().String(), func() {
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_ = srv.Close(ctx) // a dead gateway's last writes fail
		}
	}
	budget := func(t *testing.T, url string) *loopsv1.WorkspaceBudget {
		ws := must(loopsv1connect.NewWorkspaceServiceClient(http.DefaultClient, url, withKey(keyB)).GetWorkspace(t.Context(), &loopsv1.GetWorkspaceRequest{}))
		require.Len(t, ws.GetBudgets(), 1)
		return ws.GetBudgets()[0]
	}
	flush := func(t *testing.T, cl *costClient) { // GetUsage writes the usage counters
		must(cl.usage.GetUsage(t.Context(), &loopsv1.GetUsageRequest{}))
	}

	t.Run("BeforeTheUsageIsWritten", func(t *testing.T) {
		dir := t.TempDir()
		url, stop := start(t, dir, &crashStore{dead: true}) // no usage or alert gets written
		cl := newCostClient(t, url, keyB)
		for range 3 {
			cl.train(12)
		}
		require.Equal(t, []int32{50}, budget(t, url).GetAlerts(), "crossed in memory")
		stop()

		url, stop = start(t, dir, &crashStore{})
		defer stop()
		b := budget(t, url)
		require.Equal(t, "0", b.GetSpentUsd(), "the usage was lost with the gateway")
		require.Empty(t, b.GetAlerts())
		require.Empty(t, auditEvents(t, url, keyB, "budget_alert"))
		cl = newCostClient(t, url, keyB)
		for range 3 {
			cl.train(12)
		}
		require.Equal(t, []string{target("50")}, alertTargets(t, url, keyB, 1))
	})

	t.Run("AfterTheUsageBeforeTheAlert", func(t *testing.T) {
		dir := t.TempDir()
		cs := &crashStore{failAlerts: true}
		url, stop := start(t, dir, cs)
		cl := newCostClient(t, url, keyB)
		for range 4 {
			cl.train(12)
		}
		flush(t, cl)
		require.Equal(t, []int32{50, 80}, budget(t, url).GetAlerts())
		cs.die()
		require.Empty(t, auditEvents(t, url, keyB, "budget_alert"), "no alert was recorded")
		stop()

		for range 2 { // the second restart records nothing more
			url, stop = start(t, dir, &crashStore{})
			b := budget(t, url)
			require.Equal(t, "0.000048", b.GetSpentUsd())
			require.Equal(t, []int32{50, 80}, b.GetAlerts())
			require.ElementsMatch(t, []string{target("50"), target("80")}, alertTargets(t, url, keyB, 2))
			for _, e := range auditEvents(t, url, keyB, "budget_alert") {
				require.Equal(t, "spent 0.000048 of 0.00005 USD", e.GetAction(), "the spend the restarted gateway found")
			}
			stop()
		}
	})

	t.Run("JustAfterTheAlert", func(t *testing.T) {
		dir := t.TempDir()
		cs := &crashStore{dieAfterAlert: true}
		url, stop := start(t, dir, cs)
		cl := newCostClient(t, url, keyB)
		for range 3 {
			cl.train(12)
		}
		require.Equal(t, []string{target("50")}, alertTargets(t, url, keyB, 1))
		stop() // dead since the alert: the usage flush fails

		url, stop = start(t, dir, &crashStore{})
		defer stop()
		b := budget(t, url)
		require.Equal(t, "0", b.GetSpentUsd(), "the usage was lost with the gateway")
		require.Equal(t, []int32{50}, b.GetAlerts(), "the recorded alert shows")
		cl = newCostClient(t, url, keyB)
		for range 3 {
			cl.train(12)
		}
		require.Equal(t, []string{target("50")}, alertTargets(t, url, keyB, 1), "50% again: not repeated")
		cl.train(12)
		require.ElementsMatch(t, []string{target("50"), target("80")}, alertTargets(t, url, keyB, 2))
	})
}

// TestCheckpointStorageRate: Tinker's checkpoint storage route answers the storage price the
// workspace is metered at (its own sheet's first), null without one.
func TestCheckpointStorageRate(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	writeSheet(t, file, "storage_gb_month: \"0.031\"\nworkspaces:\n  team-b: {storage_gb_month: \"0.02\"}\n", time.Hour)
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	rate := func(url, key string) string {
		req, err := http.NewRequestWithContext(t.Context(), http.MethodGet, url+"/api/v1/billing/usage/checkpoints/current", nil)
		require.NoError(t, err)
		req.Header.Set("X-API-Key", key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		var body struct {
			Rate json.RawMessage `json:"effective_rate_usd_per_gigabyte_month"`
		}
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&body))
		return string(body.Rate)
	}
	url := "http://" + startServerWith(t, func(c *gateway.Config) { c.Core.Prices = sheet })
	require.Equal(t, "0.031", rate(url, keyA))
	require.Equal(t, "0.02", rate(url, keyB))
	require.Equal(t, "null", rate(startServer(t), keyA))
}
