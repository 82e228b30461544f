package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
)

// RecordBudgetAlert records a and appends ev in one transaction, unless a's threshold is
// recorded.
func (s *Store) RecordBudgetAlert(ctx context.Context, a store.BudgetAlert, ev store.OwnedAuditEvent) (bool, error) {
	tx, err := s.w.BeginTx(ctx, nil)
	if err != nil {
		return false, fmt.Errorf("store: record budget alert: %w", err)
	}
	defer func() { _ = tx.Rollback() }()
	res, err := tx.ExecContext(ctx, sqlstore.InsertBudgetAlert, sqlstore.BudgetAlertArgs(a)...)
	var n int64
	if err == nil {
		n, err = res.RowsAffected()
	}
	if err == nil && n == 1 {
		_, err = tx.ExecContext(ctx, sqlstore.InsertAuditEvent, sqlstore.AuditEventArgs(ev)...)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return false, fmt.Errorf("store: record budget alert: %w", err)
	}
	return n == 1, nil
}

// ListBudgetAlerts lists the alerts of a workspace's or a key's budgets of period and of
// the total.
func (s *Store) ListBudgetAlerts(ctx context.Context, workspace, keyID, period string) ([]store.BudgetAlert, error) {
	var out []store.BudgetAlert
	err := s.query(ctx, "list budget alerts", sqlstore.ListBudgetAlerts, []any{workspace, keyID, period}, func(rows *sql.Rows) error {
		var err error
		out, err = sqlstore.ScanBudgetAlerts(rows, workspace, keyID)
		return err
	})
	return out, err
}
