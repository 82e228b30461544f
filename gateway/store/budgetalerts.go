package store

import (
	"context"
	"time"
)

// BudgetAlert is one alert threshold of a budget crossed (docs/operations.md, "Budget
// alerts"), recorded once: a workspace's budget's (KeyID "") or one of its API keys'.
type BudgetAlert struct {
	Workspace string
	// KeyID is the API key whose budget it is; "" for the workspace's own.
	KeyID string
	// Budget is "budget_usd_month" or "budget_usd_total".
	Budget string
	// Period is the month ("2026-12") of a monthly budget, "" for the total.
	Period string
	// Percent is the threshold: 50, 80 or 100.
	Percent int
	// Spent and Limit are the spend when it was crossed and the budget, in pico-dollars.
	Spent, Limit int64
	// Time is when it was crossed.
	Time time.Time
}

// BudgetAlertStore records budget alerts exactly once (migration 0014_budget_alerts).
type BudgetAlertStore interface {
	// RecordBudgetAlert records a, and appends ev to the audit log, in one transaction, when
	// a's threshold (Workspace, KeyID, Budget, Period, Percent) is not recorded yet; it
	// reports whether it recorded it (false: it was, and nothing changed).
	RecordBudgetAlert(ctx context.Context, a BudgetAlert, ev OwnedAuditEvent) (bool, error)
	// ListBudgetAlerts lists the alerts recorded for the budgets of a workspace (keyID "")
	// or one of its API keys, of the month period and of the total budget, by budget and
	// percent.
	ListBudgetAlerts(ctx context.Context, workspace, keyID, period string) ([]BudgetAlert, error)
}
