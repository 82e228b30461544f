package postgres

import (
	"context"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// ListSessionSamplers lists up to limit samplers of one session of the workspace, oldest
// first.
func (s *Store) ListSessionSamplers(ctx context.Context, workspace, sessionID string, limit int) ([]*loopsv1.Sampler, error) {
	return messages(ctx, s, "list a session's samplers", sqlstore.NewSampler,
		sqlstore.ListSessionSamplers, workspace, sessionID, store.TraceLimit(limit))
}

// ListOwnerOperations lists up to limit operations of a training run or sampler of the
// workspace, newest first.
func (s *Store) ListOwnerOperations(ctx context.Context, workspace, owner string, limit int) ([]*loopsv1.Operation, error) {
	return messages(ctx, s, "list operations", sqlstore.NewOperation,
		sqlstore.ListOwnerOperations, workspace, owner, store.TraceLimit(limit))
}
