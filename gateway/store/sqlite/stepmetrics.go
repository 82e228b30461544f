package sqlite

import (
	"context"
	"database/sql"
	"fmt"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// putStepMetrics writes a batch's step metrics (sqlstore.PlanStepMetrics) in its transaction
// (through the insert prepared once: compiling it is most of a write's cost), then
// downsamples each run of runs that holds more than store.MaxStepMetricsPerRun records.
func (s *Store) putStepMetrics(ctx context.Context, tx *sql.Tx, writes [][]any, runs []string) error {
	if len(writes) == 0 {
		return nil
	}
	ins := tx.StmtContext(ctx, s.insertMetrics)
	for _, args := range writes {
		if _, err := ins.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("put step metrics %s/%d: %w", args[0], args[1], err)
		}
	}
	for _, id := range runs {
		if err := compactStepMetrics(ctx, tx, id); err != nil {
			return fmt.Errorf("downsample step metrics of %s: %w", id, err)
		}
	}
	return nil
}

// compactStepMetrics merges the run's oldest records (sqlstore.CompactOldest) while it holds
// more than store.MaxStepMetricsPerRun.
func compactStepMetrics(ctx context.Context, tx *sql.Tx, runID string) error {
	var n int
	if err := tx.QueryRowContext(ctx, sqlstore.CountStepMetrics, runID).Scan(&n); err != nil {
		return err
	}
	for n > store.MaxStepMetricsPerRun {
		rows, err := tx.QueryContext(ctx, sqlstore.OldestStepMetrics, runID, store.StepMetricsCompactWindow)
		if err != nil {
			return err
		}
		c, ok, err := sqlstore.CompactOldest(runID, rows)
		if cerr := rows.Close(); err == nil {
			err = cerr
		}
		if err != nil || !ok || c.Removed == 0 {
			return err
		}
		if _, err := tx.ExecContext(ctx, sqlstore.DeleteStepMetricsThrough, runID, c.DeleteThrough); err != nil {
			return err
		}
		for _, args := range c.Inserts {
			if _, err := tx.ExecContext(ctx, sqlstore.SQLite.InsertStepMetrics, args...); err != nil {
				return err
			}
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
	err := s.query(ctx, "list step metrics", sqlstore.ListStepMetrics, []any{runID, workspace, fromStep, toStep}, func(rows *sql.Rows) error {
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
	err := s.query(ctx, "list receipt steps", sqlstore.ListReceiptSteps, []any{runID, workspace, fromSeq, sqlstore.ReceiptPageLimit(limit)}, func(rows *sql.Rows) error {
		var err error
		out, err = sqlstore.ScanData(rows, sqlstore.NewReceiptStep, nil)
		return err
	})
	if err != nil {
		return nil, 0, err
	}
	var n int64
	if err := s.r.QueryRowContext(ctx, sqlstore.CountReceiptSteps, runID, workspace).Scan(&n); err != nil {
		return nil, 0, fmt.Errorf("store: count receipt steps: %w", err)
	}
	return out, n, nil
}
