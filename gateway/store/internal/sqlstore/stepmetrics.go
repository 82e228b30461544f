package sqlstore

import (
	"cmp"
	"errors"
	"fmt"
	"slices"

	"google.golang.org/protobuf/proto"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// insertStepMetrics is the step metrics insert, with the SELECT list values (casts where a
// database needs them). It writes one record unless a merged record of the run already
// covers its seq_id (a journal replay of a record that was committed and then downsampled;
// records of one kind never overlap); a record with the same (run, seq_id) of the same
// workspace is replaced.
func insertStepMetrics(values string) string {
	return `INSERT INTO step_metrics (run_id, seq_id, workspace, kind, last_seq_id, step, last_step, data)
	SELECT ` + values + `
	WHERE COALESCE((SELECT last_seq_id FROM step_metrics WHERE run_id = $1 AND kind = $4 AND seq_id < $2
	                ORDER BY seq_id DESC LIMIT 1), 0) < $2
	ON CONFLICT (run_id, kind, seq_id) DO UPDATE SET last_seq_id = excluded.last_seq_id,
	  step = excluded.step, last_step = excluded.last_step, data = excluded.data
	WHERE step_metrics.workspace = excluded.workspace`
}

// Statements of the step metrics bound (store.MaxStepMetricsPerRun).
const (
	// CountStepMetrics counts a run's records.
	CountStepMetrics = `SELECT count(*) FROM step_metrics WHERE run_id = $1`
	// OldestStepMetrics selects (workspace, data) of a run's oldest $2 records.
	OldestStepMetrics = `SELECT workspace, data FROM step_metrics WHERE run_id = $1 ORDER BY seq_id LIMIT $2`
	// DeleteStepMetricsThrough deletes a run's records up to a seq_id.
	DeleteStepMetricsThrough = `DELETE FROM step_metrics WHERE run_id = $1 AND seq_id <= $2`
)

// StepMetricsArgs are the step metrics insert's arguments for a record.
func StepMetricsArgs(workspace, runID string, m *loopsv1.StepMetrics) ([]any, error) {
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

// PlanStepMetrics returns the insert arguments of a batch's step metrics, in (run, seq_id)
// order (duplicates in their given order, so the later one wins; concurrent batches lock
// rows in the same order), and the runs whose records are to be counted now (check), sorted.
func PlanStepMetrics(check *store.StepMetricsCheck, ms []store.OwnedStepMetrics) (writes [][]any, runs []string, err error) {
	if len(ms) == 0 {
		return nil, nil, nil
	}
	ms = slices.Clone(ms)
	slices.SortStableFunc(ms, func(x, y store.OwnedStepMetrics) int {
		return cmp.Or(cmp.Compare(x.RunID, y.RunID), cmp.Compare(x.Metrics.GetSeqId(), y.Metrics.GetSeqId()))
	})
	n := 0 // records of the current run so far
	for i, m := range ms {
		args, err := StepMetricsArgs(m.Workspace, m.RunID, m.Metrics)
		if err != nil {
			return nil, nil, err
		}
		writes = append(writes, args)
		n++
		if i == len(ms)-1 || ms[i+1].RunID != m.RunID {
			if check.Due(m.RunID, n) {
				runs = append(runs, m.RunID)
			}
			n = 0
		}
	}
	return writes, runs, nil
}

// Compaction is one step of a run's downsampling: delete its records through DeleteThrough,
// then insert Inserts (the pairwise merge of the deleted records, store.CompactStepMetrics).
type Compaction struct {
	DeleteThrough int64
	Inserts       [][]any
	// Removed is how many records fewer the run holds afterwards.
	Removed int
}

// CompactOldest plans the merge of a run's oldest records (the rows of OldestStepMetrics
// with store.StepMetricsCompactWindow); ok is false when the run has none.
func CompactOldest(runID string, rows Rows) (c Compaction, ok bool, err error) {
	var ws string
	var window []*loopsv1.StepMetrics
	if err := ScanOwned(rows, NewStepMetrics, func(w string, m *loopsv1.StepMetrics) {
		ws = w
		window = append(window, m)
	}); err != nil || len(window) == 0 {
		return Compaction{}, false, err
	}
	merged := store.CompactStepMetrics(window)
	c = Compaction{DeleteThrough: window[len(window)-1].GetSeqId(), Removed: len(window) - len(merged)}
	for _, m := range merged {
		args, err := StepMetricsArgs(ws, runID, m)
		if err != nil {
			return Compaction{}, false, err
		}
		c.Inserts = append(c.Inserts, args)
	}
	return c, true, nil
}
