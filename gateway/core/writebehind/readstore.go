package writebehind

import (
	"context"
	"fmt"
	"time"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"google.golang.org/protobuf/proto"
)

// ReadStore is a store as its readers must see it while a Persister writes to it: a record
// that the persister holds (queued, journaled or being committed) is answered from there,
// so a read never goes back behind what was published; a list first waits until the store
// holds everything queued (Persister.Sync), or fails with its context's error. Every other
// method is the store's own.
type ReadStore struct {
	store.Store
	p *Persister
}

// NewReadStore returns st read through p (p writes to st).
func NewReadStore(st store.Store, p *Persister) ReadStore { return ReadStore{Store: st, p: p} }

// GetOperation returns an operation of the workspace, the newest record first.
func (s ReadStore) GetOperation(ctx context.Context, ws, id string) (*loopsv1.Operation, error) {
	if o, ok := s.p.pendingOp(id); ok {
		if o.Workspace != ws {
			return nil, fmt.Errorf("store: get operation %s: %w", id, store.ErrNotFound)
		}
		return proto.CloneOf(o.Operation), nil
	}
	return s.Store.GetOperation(ctx, ws, id)
}

// GetTrainingRun returns a training run of the workspace, the newest record first.
func (s ReadStore) GetTrainingRun(ctx context.Context, ws, id string) (*loopsv1.TrainingRun, error) {
	if r, ok := s.p.pendingRun(id); ok {
		if r.Workspace != ws {
			return nil, fmt.Errorf("store: get training run %s: %w", id, store.ErrNotFound)
		}
		return proto.CloneOf(r.Run), nil
	}
	return s.Store.GetTrainingRun(ctx, ws, id)
}

// ListTrainingRuns lists the workspace's training runs once the store holds every record.
func (s ReadStore) ListTrainingRuns(ctx context.Context, ws string, page store.Page) ([]*loopsv1.TrainingRun, int64, error) {
	if err := s.p.Sync(ctx); err != nil {
		return nil, 0, err
	}
	return s.Store.ListTrainingRuns(ctx, ws, page)
}

// ListAllTrainingRuns lists every run once the store holds every record.
func (s ReadStore) ListAllTrainingRuns(ctx context.Context) ([]store.OwnedTrainingRun, error) {
	if err := s.p.Sync(ctx); err != nil {
		return nil, err
	}
	return s.Store.ListAllTrainingRuns(ctx)
}

// ListSessionTrainingRuns lists a session's runs once the store holds every record.
func (s ReadStore) ListSessionTrainingRuns(ctx context.Context, ws, sessionID string) ([]*loopsv1.TrainingRun, error) {
	if err := s.p.Sync(ctx); err != nil {
		return nil, err
	}
	return s.Store.ListSessionTrainingRuns(ctx, ws, sessionID)
}

// ListStepMetrics lists a run's step metrics once the store holds every record.
func (s ReadStore) ListStepMetrics(ctx context.Context, ws, runID string, fromStep, toStep int64) ([]*loopsv1.StepMetrics, error) {
	if err := s.p.Sync(ctx); err != nil {
		return nil, err
	}
	return s.Store.ListStepMetrics(ctx, ws, runID, fromStep, toStep)
}

// DeleteOperationsDoneBefore removes old finished operations once the store holds every
// record (a record committed later would bring one back).
func (s ReadStore) DeleteOperationsDoneBefore(ctx context.Context, t time.Time) (int, error) {
	if err := s.p.Sync(ctx); err != nil {
		return 0, err
	}
	return s.Store.DeleteOperationsDoneBefore(ctx, t)
}

// ListReceiptSteps lists a run's receipt steps once the store holds every record.
func (s ReadStore) ListReceiptSteps(ctx context.Context, ws, runID string, fromSeq int64, limit int) ([]*loopsv1.ReceiptStep, int64, error) {
	if err := s.p.Sync(ctx); err != nil {
		return nil, 0, err
	}
	return s.Store.ListReceiptSteps(ctx, ws, runID, fromSeq, limit)
}
