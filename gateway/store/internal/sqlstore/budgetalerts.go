package sqlstore

import (
	"time"

	"github.com/loops-dev/loops/gateway/store"
)

// The budget alerts' statements (migration 0014_budget_alerts).
const (
	// InsertBudgetAlert records an alert unless its threshold is recorded: one row
	// affected when it records it.
	InsertBudgetAlert = `INSERT INTO budget_alerts (workspace, key_id, budget, period, percent, spent, limit_usd, time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING`
	// InsertBudgetAlertAudited is InsertBudgetAlert that also appends its audit event
	// ($9–$19, InsertAuditEvent's values) when it records the alert, in one statement
	// (PostgreSQL's data-modifying WITH).
	InsertBudgetAlertAudited = `WITH ins AS (INSERT INTO budget_alerts (workspace, key_id, budget, period, percent, spent, limit_usd, time)
		VALUES ($1, $2, $3, $4, $5, $6, $7, $8) ON CONFLICT DO NOTHING RETURNING 1)
		INSERT INTO audit_events (workspace, time, key_id, client_addr, surface, action, event, resource, target, status, code)
		SELECT $9::text, $10::bigint, $11::text, $12::text, $13::text, $14::text, $15::text, $16::text, $17::text, $18::integer, $19::text FROM ins`
	// ListBudgetAlerts lists the alerts of a workspace's ($1) budgets or a key's ($2) of
	// the month $3 and of the total.
	ListBudgetAlerts = `SELECT budget, period, percent, spent, limit_usd, time FROM budget_alerts
		WHERE workspace = $1 AND key_id = $2 AND (period = $3 OR period = '') ORDER BY budget, percent`
)

// BudgetAlertArgs are InsertBudgetAlert's arguments for a.
func BudgetAlertArgs(a store.BudgetAlert) []any {
	return []any{a.Workspace, a.KeyID, a.Budget, a.Period, int64(a.Percent), a.Spent, a.Limit, a.Time.UnixNano()}
}

// ScanBudgetAlerts reads ListBudgetAlerts' rows of workspace and keyID.
func ScanBudgetAlerts(rows Rows, workspace, keyID string) ([]store.BudgetAlert, error) {
	var out []store.BudgetAlert
	for rows.Next() {
		a := store.BudgetAlert{Workspace: workspace, KeyID: keyID}
		var percent, at int64
		if err := rows.Scan(&a.Budget, &a.Period, &percent, &a.Spent, &a.Limit, &at); err != nil {
			return nil, err
		}
		a.Percent, a.Time = int(percent), time.Unix(0, at).UTC()
		out = append(out, a)
	}
	return out, rows.Err()
}
