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

// The receipt statements (store.ReceiptReader, migration 0011_receipts).
const (
	// ListReceiptSteps selects the data of a run's steps from a seq_id, in seq_id order.
	ListReceiptSteps = `SELECT data FROM receipt_steps WHERE run_id = $1 AND workspace = $2 AND seq_id >= $3
		ORDER BY seq_id LIMIT $4`
	// CountReceiptSteps counts a run's steps.
	CountReceiptSteps = `SELECT count(*) FROM receipt_steps WHERE run_id = $1 AND workspace = $2`
)

// insertReceiptStep is the receipt step insert, with its values (casts where a database
// needs them): it replaces a step of the same workspace stored with the same seq_id (a
// journal replay).
func insertReceiptStep(values string) string {
	return `INSERT INTO receipt_steps (run_id, seq_id, workspace, data)
	VALUES (` + values + `)
	ON CONFLICT (run_id, seq_id) DO UPDATE SET data = excluded.data
	WHERE receipt_steps.workspace = excluded.workspace`
}

// ReceiptStepWrites returns the inserts of a batch's receipt steps in the dialect d, in
// (run, seq_id) order (duplicates in their given order, so the later one wins; concurrent
// batches lock rows in the same order).
func ReceiptStepWrites(d Dialect, steps []store.OwnedReceiptStep) ([]Write, error) {
	if len(steps) == 0 {
		return nil, nil
	}
	steps = slices.Clone(steps)
	slices.SortStableFunc(steps, func(x, y store.OwnedReceiptStep) int {
		return cmp.Or(cmp.Compare(x.Step.GetTrainingRunId(), y.Step.GetTrainingRunId()), cmp.Compare(x.Step.GetSeqId(), y.Step.GetSeqId()))
	})
	out := make([]Write, 0, len(steps))
	for _, s := range steps {
		m := s.Step
		if m.GetTrainingRunId() == "" || m.GetSeqId() <= 0 {
			return nil, errors.New("put receipt step: missing training_run_id or seq_id")
		}
		id := fmt.Sprintf("%s/%d", m.GetTrainingRunId(), m.GetSeqId())
		data, err := proto.Marshal(m)
		if err != nil {
			return nil, fmt.Errorf("put receipt step %s: encode: %w", id, err)
		}
		out = append(out, Write{Kind: "receipt step", ID: id, SQL: d.InsertReceiptStep,
			Args: []any{m.GetTrainingRunId(), m.GetSeqId(), s.Workspace, data}})
	}
	return out, nil
}

// NewReceiptStep returns an empty receipt step (for ScanData).
func NewReceiptStep() *loopsv1.ReceiptStep { return &loopsv1.ReceiptStep{} }

// ReceiptPageLimit is the LIMIT of a ListReceiptSteps page of limit steps.
func ReceiptPageLimit(limit int) int {
	if limit <= 0 || limit > store.MaxPageLimit {
		return store.MaxPageLimit
	}
	return limit
}
