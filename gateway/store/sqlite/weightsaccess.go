package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"time"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// CreateWeightsAccessToken inserts a token of the workspace unless it holds max live ones.
func (s *Store) CreateWeightsAccessToken(ctx context.Context, workspace string, t *loopsv1.WeightsAccessToken, hash string, now time.Time, max int) error {
	q, err := sqlstore.SQLite.CreateWeightsAccessToken(workspace, t, hash, now, max)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	n, err := s.exec(ctx, q.SQL, q.Args...)
	switch {
	case err != nil:
		return fmt.Errorf("store: create weights access token %s: %w", t.GetId(), err)
	case n == 0:
		return fmt.Errorf("store: create weights access token %s: workspace holds %d live tokens: %w", t.GetId(), max, store.ErrLimit)
	}
	return nil
}

// GetWeightsAccessToken returns the token with a secret's hash and its workspace.
func (s *Store) GetWeightsAccessToken(ctx context.Context, hash string) (*loopsv1.WeightsAccessToken, string, error) {
	var workspace string
	var data []byte
	err := s.r.QueryRowContext(ctx, sqlstore.GetWeightsAccessToken, hash).Scan(&workspace, &data)
	m, err := weightsAccessLookup().Decode(data, errors.Is(err, sql.ErrNoRows), err)
	if err != nil {
		return nil, "", err
	}
	return m, workspace, nil
}

// weightsAccessLookup decodes a token looked up by hash (the hash stays out of errors).
func weightsAccessLookup() sqlstore.Get[*loopsv1.WeightsAccessToken] {
	return sqlstore.NewGet("weights access token", "(by hash)", sqlstore.NewWeightsAccessToken)
}

// ListWeightsAccessTokens lists the workspace's live tokens, newest first.
func (s *Store) ListWeightsAccessTokens(ctx context.Context, workspace string, now time.Time) ([]*loopsv1.WeightsAccessToken, error) {
	return messages(ctx, s, "list weights access tokens", sqlstore.NewWeightsAccessToken,
		sqlstore.ListWeightsAccessTokens, workspace, now.UnixNano(), store.MaxPageLimit)
}

// DeleteWeightsAccessToken removes a token of the workspace.
func (s *Store) DeleteWeightsAccessToken(ctx context.Context, workspace, id string) error {
	return s.deleteOne(ctx, "weights access token "+id, sqlstore.DeleteWeightsAccessToken, workspace, id)
}

// DeleteExpiredWeightsAccessTokens removes every token expired at now.
func (s *Store) DeleteExpiredWeightsAccessTokens(ctx context.Context, now time.Time) (int, error) {
	n, err := s.exec(ctx, sqlstore.DeleteExpiredWeightsAccessTokens, now.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: delete expired weights access tokens: %w", err)
	}
	return int(n), nil
}
