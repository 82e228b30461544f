package console_test

import (
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway"
	"github.com/loops-dev/loops/gateway/console"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/prices"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/gen/go/loops/v1/loopsv1connect"
)

// TestConsoleShowsCost: under a price sheet the run page draws the run's cost beside its
// loss and the usage page shows costs and the workspace's month; without one neither does.
func TestConsoleShowsCost(t *testing.T) {
	file := filepath.Join(t.TempDir(), "prices.yaml")
	require.NoError(t, os.WriteFile(file, []byte("models:\n  loops/tiny: {train: \"0.40\"}\n"), 0o600))
	sheet, err := prices.Load(file, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	pol, err := policy.Parse([]byte("workspaces:\n  ws-a: {budget_usd_month: \"0.000008\"}\n"))
	require.NoError(t, err)
	var dataDir string
	base := startServerWith(t, func(c *gateway.Config) {
		c.Core.Prices, c.Core.Policy = sheet, pol
		require.NoError(t, c.Keys.AddOperatorKeys([]string{"tml-console-operator"}))
		dataDir = c.DataDir
	})
	// A key of ws-a with a total budget of 9 µ$ does the work: 4.8 µ$ is 53% of it.
	keys := loopsv1connect.NewKeyServiceClient(http.DefaultClient, base, withKey("tml-console-operator"))
	capped, err := keys.CreateKey(t.Context(), &loopsv1.CreateKeyRequest{Workspace: "ws-a", BudgetUsdTotal: "0.000009"})
	require.NoError(t, err)
	run, _ := train(t, base, capped.GetSecret(), 3) // 3 × 4 tokens × $0.40 / 1e6

	b := newBrowser(t, base)
	code, _, _ := b.post(console.SignInPath, url.Values{"api_key": {keyA}})
	require.Equal(t, 303, code)
	_, _, body := b.get("/console/runs/" + run)
	require.Contains(t, body, `id="chart-cost" data-points="3"`)
	require.Contains(t, body, "Cost so far, USD (0.0000048 in all)")
	require.NotContains(t, body, `id="run-costs"`, "no storage or pool time metered yet")
	_, _, body = b.get("/console/usage")
	require.Contains(t, body, `id="usage-month"`)
	require.Contains(t, body, "This month (UTC) so far: <strong>0.0000048 USD</strong>")
	require.Regexp(t, `training_tokens</td><td class="num">12</td><td class="num">0.0000048<`, body)
	// The workspace page: the budget, its spend (60%) and the alert crossed.
	_, _, body = b.get("/console/limits")
	require.Contains(t, body, `id="budgets"`)
	require.Regexp(t, `budget_usd_month \(\d{4}-\d{2}\)</th><td>0.0000048 of 0.000008 USD spent, 0 running; <strong class="alert">alerts: 50%</strong>`, body)
	// And the key's budget, its spend and its alert.
	require.Contains(t, body, `id="key-budgets"`)
	require.Contains(t, body, capped.GetKey().GetId()+` budget_usd_total</th><td>0.0000048 of 0.000009 USD spent, 0 running; <strong class="alert">alerts: 50%</strong>`)

	// The run's storage and pool time as metered (per run), beside its training cost;
	// another run's adds nothing, and so do rows of no run (of before runs were metered
	// apart) for this run of no session.
	st, err := sqlite.Open(t.Context(), filepath.Join(dataDir, "loops.db"))
	require.NoError(t, err)
	hour := time.Now().UTC().Truncate(time.Hour)
	res, err := loopsv1connect.NewTrainingServiceClient(http.DefaultClient, base, withKey(keyA)).GetTrainingRun(t.Context(), &loopsv1.GetTrainingRunRequest{Id: run})
	require.NoError(t, err)
	for _, u := range []store.UsageRecord{
		{RunID: run, Kind: store.UsageCheckpointByteSeconds, Amount: 7.2e12, PricedAmount: 7.2e12, Cost: 84931507},
		{RunID: "run-other", Kind: store.UsageCheckpointByteSeconds, Amount: 1, PricedAmount: 1, Cost: 5e11},
		{Kind: store.UsageCheckpointByteSeconds, Amount: 3.6e12, PricedAmount: 3.6e12, Cost: 42465753},
		{RunID: run, Kind: store.UsageDedicatedGPUSeconds, Amount: 3600, PricedAmount: 3600, Cost: 3e12},
	} {
		u.BucketStart, u.SessionID = hour, res.GetSessionId()
		require.NoError(t, st.AddUsage(t.Context(), "ws-a", u))
	}
	require.NoError(t, st.Close())
	_, _, body = b.get("/console/runs/" + run)
	_, costs, ok := strings.Cut(body, `<table class="facts" id="run-costs">`)
	require.True(t, ok)
	costs, _, _ = strings.Cut(costs, "</table>")
	require.Equal(t, `
<tr><th>Checkpoint storage, last 30 days</th><td class="num">0.000084931507 USD</td></tr>
<tr><th>Dedicated pool time, last 30 days</th><td class="num">3 USD</td></tr>
`, costs)

	// No price sheet: no cost anywhere on the pages.
	base = startServer(t)
	run, _ = train(t, base, keyA, 1)
	b = newBrowser(t, base)
	b.post(console.SignInPath, url.Values{"api_key": {keyA}})
	_, _, body = b.get("/console/runs/" + run)
	require.NotContains(t, body, "chart-cost")
	_, _, body = b.get("/console/usage")
	require.NotContains(t, body, "usage-month")
	require.NotContains(t, body, "Cost (USD)")
	_, _, body = b.get("/console/limits")
	require.NotContains(t, body, `id="budgets"`)
}
