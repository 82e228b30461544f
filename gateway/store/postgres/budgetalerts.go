package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
)

// RecordBudgetAlert records a and appends ev in one statement, unless a's threshold is
// recorded.
func (s *Store) RecordBudgetAlert(ctx context.Context, a store.BudgetAlert, ev store.OwnedAuditEvent) (bool, error) {
	args := append(sqlstore.BudgetAlertArgs(a), sqlstore.AuditEventArgs(ev)...)
	rows, err := s.exec(ctx, sqlstore.Query{SQL: sqlstore.InsertBudgetAlertAudited, Args: args})
	if err != nil {
		return false, fmt.Errorf("store: record budget alert: %w", err)
	}
	return rows[0] == 1, nil
}

// ListBudgetAlerts lists the alerts of a workspace's or a key's budgets of period and of
// the total.
func (s *Store) ListBudgetAlerts(ctx context.Context, workspace, keyID, period string) ([]store.BudgetAlert, error) {
	var out []store.BudgetAlert
	err := s.query(ctx, "list budget alerts", sqlstore.ListBudgetAlerts, []any{workspace, keyID, period}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanBudgetAlerts(rows, workspace, keyID)
		return err
	})
	return out, err
}
