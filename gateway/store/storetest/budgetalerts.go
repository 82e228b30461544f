package storetest

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
)

// testBudgetAlerts: an alert is recorded with its audit event once per threshold; a second
// record of the same threshold changes nothing (no second event); another period, key,
// budget or workspace is its own threshold; the list is a workspace's or a key's, of one
// month and the total.
func testBudgetAlerts(t *testing.T, open func(t *testing.T) store.Store) {
	st := open(t)
	ctx := t.Context()
	alert := func(ws, key, budget, period string, percent int) store.BudgetAlert {
		return store.BudgetAlert{Workspace: ws, KeyID: key, Budget: budget, Period: period, Percent: percent,
			Spent: int64(percent) * 1_000_000, Limit: 100_000_000, Time: base.Add(time.Duration(percent) * time.Minute)}
	}
	event := func(a store.BudgetAlert) store.OwnedAuditEvent {
		return store.OwnedAuditEvent{Workspace: a.Workspace, Event: store.AuditEvent{Time: a.Time, KeyID: a.KeyID, Surface: "budget",
			Action: "spent", Event: "budget_alert", Resource: "budget", Target: a.Budget + " " + a.Period, Status: 200, Code: "ok"}}
	}
	record := func(a store.BudgetAlert) bool {
		ok, err := st.RecordBudgetAlert(ctx, a, event(a))
		require.NoError(t, err)
		return ok
	}
	m50 := alert(wsA, "", "budget_usd_month", "2025-03", 50)
	require.True(t, record(m50))
	require.False(t, record(m50), "recorded once")
	again := m50
	again.Spent, again.Time = 77, base.Add(time.Hour)
	require.False(t, record(again), "the same threshold with other figures is the same alert")
	require.True(t, record(alert(wsA, "", "budget_usd_month", "2025-03", 80)))
	require.True(t, record(alert(wsA, "", "budget_usd_month", "2025-04", 50)), "another month")
	require.True(t, record(alert(wsA, "", "budget_usd_total", "", 50)))
	require.True(t, record(alert(wsA, "key-0123456789abcdef", "budget_usd_total", "", 50)), "a key's budget")
	require.True(t, record(alert(wsB, "", "budget_usd_month", "2025-03", 50)), "another workspace")

	events, err := st.ListAuditEvents(ctx, wsA, store.AuditQuery{})
	require.NoError(t, err)
	require.Len(t, events, 5, "one event per alert recorded, none for the repeats")

	list := func(ws, key, period string) []store.BudgetAlert {
		out, err := st.ListBudgetAlerts(ctx, ws, key, period)
		require.NoError(t, err)
		return out
	}
	require.Equal(t, []store.BudgetAlert{m50, alert(wsA, "", "budget_usd_month", "2025-03", 80), alert(wsA, "", "budget_usd_total", "", 50)},
		list(wsA, "", "2025-03"))
	require.Equal(t, []store.BudgetAlert{alert(wsA, "", "budget_usd_month", "2025-04", 50), alert(wsA, "", "budget_usd_total", "", 50)},
		list(wsA, "", "2025-04"))
	require.Equal(t, []store.BudgetAlert{alert(wsA, "key-0123456789abcdef", "budget_usd_total", "", 50)}, list(wsA, "key-0123456789abcdef", "2025-03"))
	require.Empty(t, list(wsB, "key-0123456789abcdef", "2025-03"), "another workspace's key")
	require.Empty(t, list("ws-none", "", "2025-03"))
}
