package postgres

import (
	"context"
	"fmt"

	"github.com/jackc/pgx/v5"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// compactStepMetrics merges the run's oldest records (sqlstore.CompactOldest) while it holds
// more than store.MaxStepMetricsPerRun (n now).
func compactStepMetrics(ctx context.Context, tx *writeTx, runID string, n int) error {
	for n > store.MaxStepMetricsPerRun {
		rows, err := tx.Query(ctx, sqlstore.OldestStepMetrics, runID, store.StepMetricsCompactWindow)
		if err != nil {
			return err
		}
		c, ok, err := sqlstore.CompactOldest(runID, rows)
		rows.Close()
		if err != nil || !ok || c.Removed == 0 {
			return err
		}
		var pb pgx.Batch
		pb.Queue(sqlstore.DeleteStepMetricsThrough, runID, c.DeleteThrough)
		for _, args := range c.Inserts {
			pb.Queue(sqlstore.Postgres.InsertStepMetrics, args...)
		}
		if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
			return err
		}
		n -= c.Removed
	}
	return nil
}

// ListStepMetrics lists the run's step metrics whose steps overlap [fromStep, toStep]
// (0: no bound), oldest first.
func (s *Store) ListStepMetrics(ctx context.Context, workspace, runID string, fromStep, toStep int64) ([]*loopsv1.StepMetrics, error) {
	if toStep <= 0 {
		toStep = 1<<63 - 1
	}
	var out []*loopsv1.StepMetrics
	err := s.query(ctx, "list step metrics", sqlstore.ListStepMetrics, []any{runID, workspace, fromStep, toStep}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanData(rows, sqlstore.NewStepMetrics, nil)
		return err
	})
	return out, err
}

// ListReceiptSteps lists at most limit of the run's receipt steps from seq_id fromSeq, in
// seq_id order, and the count of all its steps.
func (s *Store) ListReceiptSteps(ctx context.Context, workspace, runID string, fromSeq int64, limit int) ([]*loopsv1.ReceiptStep, int64, error) {
	var out []*loopsv1.ReceiptStep
	err := s.query(ctx, "list receipt steps", sqlstore.ListReceiptSteps, []any{runID, workspace, fromSeq, sqlstore.ReceiptPageLimit(limit)}, func(rows pgx.Rows) error {
		var err error
		out, err = sqlstore.ScanData(rows, sqlstore.NewReceiptStep, nil)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	var n int64
	if err := s.pool.QueryRow(ctx, sqlstore.CountReceiptSteps, runID, workspace).Scan(&n); err != nil {
		return nil, 0, fmt.Errorf("store: count receipt steps: %w", err)
	}
	return out, n, nil
}
