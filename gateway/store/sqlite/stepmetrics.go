package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// insertStepMetrics writes one record unless a merged record of the run already covers its
// seq_id (a journal replay of a record that was committed and then downsampled; records of
// one kind never overlap); a record
// with the same (run, seq_id) of the same workspace is replaced.
const insertStepMetrics = `INSERT INTO step_metrics (run_id, seq_id, workspace, kind, last_seq_id, step, last_step, data)
	SELECT ?1, ?2, ?3, ?4, ?5, ?6, ?7, ?8
	WHERE COALESCE((SELECT last_seq_id FROM step_metrics WHERE run_id = ?1 AND kind = ?4 AND seq_id < ?2
	                ORDER BY seq_id DESC LIMIT 1), 0) < ?2
	ON CONFLICT (run_id, kind, seq_id) DO UPDATE SET last_seq_id = excluded.last_seq_id,
	  step = excluded.step, last_step = excluded.last_step, data = excluded.data
	WHERE step_metrics.workspace = excluded.workspace`

// stepMetricsArgs are insertStepMetrics' arguments for a record.
func stepMetricsArgs(workspace, runID string, m *loopsv1.StepMetrics) ([]any, error) {
	if runID == "" || m == nil || m.GetSeqId() <= 0 {
		return nil, errors.New("store: put step metrics: missing run id or seq_id")
	}
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("store: put step metrics %s/%d: encode: %w", runID, m.GetSeqId(), err)
	}
	return []any{runID, m.GetSeqId(), workspace, int64(m.GetKind()), max(m.GetLastSeqId(), m.GetSeqId()),
		m.GetStep(), max(m.GetLastStep(), m.GetStep()), data}, nil
}

// putStepMetrics writes a batch's step metrics in its transaction (through insertStepMetrics
// prepared once: compiling it is most of a write's cost), then downsamples each run that
// holds more than store.MaxStepMetricsPerRun records (counted when metricsCheck says).
func (s *Store) putStepMetrics(ctx context.Context, tx *sql.Tx, ms []store.OwnedStepMetrics) error {
	if len(ms) == 0 {
		return nil
	}
	ins := tx.StmtContext(ctx, s.insertMetrics)
	runs := map[string]int{}
	for _, m := range ms {
		args, err := stepMetricsArgs(m.Workspace, m.RunID, m.Metrics)
		if err != nil {
			return err
		}
		if _, err := ins.ExecContext(ctx, args...); err != nil {
			return fmt.Errorf("store: put step metrics %s/%d: %w", m.RunID, m.Metrics.GetSeqId(), err)
		}
		runs[m.RunID]++
	}
	for id, n := range runs {
		if !s.metricsCheck.Due(id, n) {
			continue
		}
		if err := compactStepMetrics(ctx, tx, id); err != nil {
			return fmt.Errorf("store: downsample step metrics of %s: %w", id, err)
		}
	}
	return nil
}

// compactStepMetrics replaces the run's oldest store.StepMetricsCompactWindow records by
// their pairwise merge while it holds more than store.MaxStepMetricsPerRun.
func compactStepMetrics(ctx context.Context, tx *sql.Tx, runID string) error {
	var n int
	if err := tx.QueryRowContext(ctx, `SELECT COUNT(*) FROM step_metrics WHERE run_id = ?`, runID).Scan(&n); err != nil {
		return err
	}
	for n > store.MaxStepMetricsPerRun {
		removed, err := compactOldest(ctx, tx, runID)
		if err != nil || removed == 0 {
			return err
		}
		n -= removed
	}
	return nil
}

// compactOldest merges the run's oldest store.StepMetricsCompactWindow records in pairs and
// returns how many records fewer the run holds.
func compactOldest(ctx context.Context, tx *sql.Tx, runID string) (int, error) {
	rows, err := tx.QueryContext(ctx, `SELECT workspace, data FROM step_metrics WHERE run_id = ? ORDER BY seq_id LIMIT ?`,
		runID, store.StepMetricsCompactWindow)
	if err != nil {
		return 0, err
	}
	var (
		ws     string
		window []*loopsv1.StepMetrics
	)
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&ws, &data); err != nil {
			_ = rows.Close()
			return 0, err
		}
		m := &loopsv1.StepMetrics{}
		if err := proto.Unmarshal(data, m); err != nil {
			_ = rows.Close()
			return 0, err
		}
		window = append(window, m)
	}
	if err := rows.Close(); err != nil {
		return 0, err
	}
	if err := rows.Err(); err != nil || len(window) == 0 {
		return 0, err
	}
	if _, err := tx.ExecContext(ctx, `DELETE FROM step_metrics WHERE run_id = ? AND seq_id <= ?`,
		runID, window[len(window)-1].GetSeqId()); err != nil {
		return 0, err
	}
	merged := store.CompactStepMetrics(window)
	for _, m := range merged {
		args, err := stepMetricsArgs(ws, runID, m)
		if err != nil {
			return 0, err
		}
		if _, err := tx.ExecContext(ctx, insertStepMetrics, args...); err != nil {
			return 0, err
		}
	}
	return len(window) - len(merged), nil
}

// ListStepMetrics lists the run's step metrics whose steps overlap [fromStep, toStep]
// (0: no bound), oldest first.
func (s *Store) ListStepMetrics(ctx context.Context, workspace, runID string, fromStep, toStep int64) ([]*loopsv1.StepMetrics, error) {
	if toStep <= 0 {
		toStep = 1<<63 - 1
	}
	rows, err := s.r.QueryContext(ctx,
		`SELECT data FROM step_metrics WHERE run_id = ? AND workspace = ? AND last_step >= ? AND step <= ?
		 ORDER BY seq_id`, runID, workspace, fromStep, toStep)
	if err != nil {
		return nil, fmt.Errorf("store: list step metrics: %w", err)
	}
	defer func() { _ = rows.Close() }()
	var out []*loopsv1.StepMetrics
	for rows.Next() {
		var data []byte
		if err := rows.Scan(&data); err != nil {
			return nil, fmt.Errorf("store: list step metrics: %w", err)
		}
		m := &loopsv1.StepMetrics{}
		if err := proto.Unmarshal(data, m); err != nil {
			return nil, fmt.Errorf("store: list step metrics: decode: %w", err)
		}
		out = append(out, m)
	}
	if err := rows.Err(); err != nil {
		return nil, fmt.Errorf("store: list step metrics: %w", err)
	}
	return out, nil
}
