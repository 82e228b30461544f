package postgres

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"

	"github.com/jackc/pgx/v5"
	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// insertStepMetrics writes one record unless a merged record of the run already covers its
// seq_id (a journal replay of a record that was committed and then downsampled; records of
// one kind never overlap); a record
// with the same (run, seq_id) of the same workspace is replaced.
const insertStepMetrics = `INSERT INTO step_metrics (run_id, seq_id, workspace, kind, last_seq_id, step, last_step, data)
	SELECT $1::text, $2::bigint, $3::text, $4::integer, $5::bigint, $6::bigint, $7::bigint, $8::bytea
	WHERE COALESCE((SELECT last_seq_id FROM step_metrics WHERE run_id = $1 AND kind = $4 AND seq_id < $2
	                ORDER BY seq_id DESC LIMIT 1), 0) < $2
	ON CONFLICT (run_id, kind, seq_id) DO UPDATE SET last_seq_id = excluded.last_seq_id,
	  step = excluded.step, last_step = excluded.last_step, data = excluded.data
	WHERE step_metrics.workspace = excluded.workspace`

const countStepMetrics = `SELECT COUNT(*) FROM step_metrics WHERE run_id = $1`

// stepMetricsArgs are insertStepMetrics' arguments for a record.
func stepMetricsArgs(workspace, runID string, m *loopsv1.StepMetrics) ([]any, error) {
	if runID == "" || m == nil || m.GetSeqId() <= 0 {
		return nil, errors.New("put step metrics: missing run id or seq_id")
	}
	data, err := proto.Marshal(m)
	if err != nil {
		return nil, fmt.Errorf("put step metrics %s/%d: encode: %w", runID, m.GetSeqId(), err)
	}
	return []any{runID, m.GetSeqId(), workspace, int32(m.GetKind()), max(m.GetLastSeqId(), m.GetSeqId()),
		m.GetStep(), max(m.GetLastStep(), m.GetStep()), data}, nil
}

// stepMetricsWrites returns the inserts of a batch's step metrics, in (run, seq_id) order
// (duplicates in their given order, so the later one wins; concurrent batches lock rows in
// the same order), and the runs whose records are to be counted now (check), sorted.
func stepMetricsWrites(check *store.StepMetricsCheck, ms []store.OwnedStepMetrics) (writes [][]any, runs []string, err error) {
	if len(ms) == 0 {
		return nil, nil, nil
	}
	ms = slices.Clone(ms)
	slices.SortStableFunc(ms, func(x, y store.OwnedStepMetrics) int {
		return cmp.Or(cmp.Compare(x.RunID, y.RunID), cmp.Compare(x.Metrics.GetSeqId(), y.Metrics.GetSeqId()))
	})
	for i, m := range ms {
		args, err := stepMetricsArgs(m.Workspace, m.RunID, m.Metrics)
		if err != nil {
			return nil, nil, err
		}
		writes = append(writes, args)
		if i == len(ms)-1 || ms[i+1].RunID != m.RunID {
			n := 1
			for j := i - 1; j >= 0 && ms[j].RunID == m.RunID; j-- {
				n++
			}
			if check.Due(m.RunID, n) {
				runs = append(runs, m.RunID)
			}
		}
	}
	return writes, runs, nil
}

// compactStepMetrics replaces the run's oldest store.StepMetricsCompactWindow records by
// their pairwise merge while it holds more than store.MaxStepMetricsPerRun (n now).
func compactStepMetrics(ctx context.Context, tx pgx.Tx, runID string, n int) error {
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
func compactOldest(ctx context.Context, tx pgx.Tx, runID string) (int, error) {
	rows, err := tx.Query(ctx, `SELECT workspace, data FROM step_metrics WHERE run_id = $1 ORDER BY seq_id LIMIT $2`,
		runID, store.StepMetricsCompactWindow)
	if err != nil {
		return 0, err
	}
	var ws string
	window, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*loopsv1.StepMetrics, error) {
		var data []byte
		if err := r.Scan(&ws, &data); err != nil {
			return nil, err
		}
		m := &loopsv1.StepMetrics{}
		return m, proto.Unmarshal(data, m)
	})
	if err != nil || len(window) == 0 {
		return 0, err
	}
	if _, err := tx.Exec(ctx, `DELETE FROM step_metrics WHERE run_id = $1 AND seq_id <= $2`,
		runID, window[len(window)-1].GetSeqId()); err != nil {
		return 0, err
	}
	merged := store.CompactStepMetrics(window)
	var pb pgx.Batch
	for _, m := range merged {
		args, err := stepMetricsArgs(ws, runID, m)
		if err != nil {
			return 0, err
		}
		pb.Queue(insertStepMetrics, args...)
	}
	if err := tx.SendBatch(ctx, &pb).Close(); err != nil {
		return 0, err
	}
	return len(window) - len(merged), nil
}

// ListStepMetrics lists the run's step metrics whose steps overlap [fromStep, toStep]
// (0: no bound), oldest first.
func (s *Store) ListStepMetrics(ctx context.Context, workspace, runID string, fromStep, toStep int64) ([]*loopsv1.StepMetrics, error) {
	if toStep <= 0 {
		toStep = 1<<63 - 1
	}
	rows, err := s.pool.Query(ctx,
		`SELECT data FROM step_metrics WHERE run_id = $1 AND workspace = $2 AND last_step >= $3 AND step <= $4
		 ORDER BY seq_id`, runID, workspace, fromStep, toStep)
	if err != nil {
		return nil, fmt.Errorf("store: list step metrics: %w", err)
	}
	out, err := pgx.CollectRows(rows, func(r pgx.CollectableRow) (*loopsv1.StepMetrics, error) {
		var data []byte
		if err := r.Scan(&data); err != nil {
			return nil, err
		}
		m := &loopsv1.StepMetrics{}
		return m, proto.Unmarshal(data, m)
	})
	if err != nil {
		return nil, fmt.Errorf("store: list step metrics: %w", err)
	}
	return out, nil
}
