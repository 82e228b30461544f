package writebehind

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core/trainrun"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// fencedStore refuses every write, as the store of a gateway whose lease another gateway
// has taken over does (store.ErrFenced), and counts the attempts.
type fencedStore struct {
	batches, puts atomic.Int32
}

func (s *fencedStore) ApplyBatch(context.Context, store.Batch) error {
	s.batches.Add(1)
	return fmt.Errorf("store: apply batch: %w", store.ErrFenced)
}

func (s *fencedStore) PutOperation(context.Context, string, *loopsv1.Operation) error {
	s.puts.Add(1)
	return fmt.Errorf("store: put operation: %w", store.ErrFenced)
}

func (s *fencedStore) PutTrainingRun(context.Context, string, *loopsv1.TrainingRun) error {
	s.puts.Add(1)
	return fmt.Errorf("store: put training run: %w", store.ErrFenced)
}

// TestPersisterFencedBatch: a batch the store refuses because the lease is lost is not
// retried (not as a batch, not record by record), its outcomes are never published (no
// client sees as done what the database does not hold), and the persister takes nothing
// more: as after a crash, the new leader has the store.
func TestPersisterFencedBatch(t *testing.T) {
	st := &fencedStore{}
	p := New(st, slog.New(slog.DiscardHandler)) // no journal: groups commit before they publish
	published := make(chan struct{})
	r := trainrun.New(trainrun.Config[struct{}]{Workspace: "ws", Record: &loopsv1.TrainingRun{Id: "run-1"}, NextSeq: 1, MaxPending: 1})
	r.Update(func(*loopsv1.TrainingRun) {})
	p.RunChanged(r)
	p.Finish("ws", &loopsv1.Operation{Id: "op-1", State: loopsv1.OperationState_OPERATION_STATE_SUCCEEDED}, func() { close(published) })
	select {
	case <-published:
		t.Fatal("an outcome the store refused was published")
	case <-p.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the persister went on after its batch was fenced")
	}
	select {
	case <-published:
		t.Fatal("an outcome the store refused was published")
	default:
	}
	require.EqualValues(t, 1, st.batches.Load(), "a fenced batch is not retried")
	require.Zero(t, st.puts.Load(), "nor written record by record")
	require.Error(t, p.Create("ws", &loopsv1.Operation{Id: "op-2"}), "no new work is taken")
	p.Close()
	require.EqualValues(t, 1, st.batches.Load())
}
