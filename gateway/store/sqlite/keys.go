package sqlite

import (
	"context"
	"database/sql"
	"fmt"
	"time"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// CreateAPIKey inserts a new key record.
func (s *Store) CreateAPIKey(ctx context.Context, k *loopsv1.ApiKey, hash [32]byte) error {
	args, err := sqlstore.NewAPIKeyArgs(k, hash)
	if err != nil {
		return err
	}
	if _, err := s.exec(ctx, sqlstore.InsertAPIKey, args...); err != nil {
		return fmt.Errorf("store: create API key %s: %w", k.GetId(), err)
	}
	return nil
}

// APIKeyByHash returns the record of the key with that hash.
func (s *Store) APIKeyByHash(ctx context.Context, hash [32]byte) (*loopsv1.ApiKey, error) {
	return sqlstore.OneAPIKey(s.apiKeys(ctx, "find API key", sqlstore.APIKeyByHash, sqlstore.HashHex(hash)))
}

// GetAPIKey returns a key record by id.
func (s *Store) GetAPIKey(ctx context.Context, workspace, id string) (*loopsv1.ApiKey, error) {
	return sqlstore.OneAPIKey(s.apiKeys(ctx, "get API key", sqlstore.GetAPIKey, id, workspace))
}

// ListAPIKeys lists the newest key records.
func (s *Store) ListAPIKeys(ctx context.Context, workspace string, limit int) ([]*loopsv1.ApiKey, error) {
	return s.apiKeys(ctx, "list API keys", sqlstore.ListAPIKeys, workspace, store.APIKeyLimit(limit))
}

// RevokeAPIKey revokes a key once and returns its record.
func (s *Store) RevokeAPIKey(ctx context.Context, workspace, id string, at time.Time) (*loopsv1.ApiKey, error) {
	if _, err := s.exec(ctx, sqlstore.RevokeAPIKey, id, workspace, at.UnixNano()); err != nil {
		return nil, fmt.Errorf("store: revoke API key %s: %w", id, err)
	}
	return s.GetAPIKey(ctx, workspace, id)
}

// SetAPIKeyBudgets sets a key's budgets and returns its record.
func (s *Store) SetAPIKeyBudgets(ctx context.Context, workspace, id, month, total string) (*loopsv1.ApiKey, error) {
	rec, err := s.GetAPIKey(ctx, workspace, id)
	if err != nil {
		return nil, err
	}
	data, err := sqlstore.BudgetsData(rec, month, total)
	if err != nil {
		return nil, err
	}
	if _, err := s.exec(ctx, sqlstore.SetAPIKeyData, id, workspace, data); err != nil {
		return nil, fmt.Errorf("store: set API key %s's budgets: %w", id, err)
	}
	return s.GetAPIKey(ctx, workspace, id)
}

// TouchAPIKey moves a key's last-used time forward.
func (s *Store) TouchAPIKey(ctx context.Context, id string, at time.Time) error {
	if _, err := s.exec(ctx, sqlstore.TouchAPIKey, id, at.UnixNano()); err != nil {
		return fmt.Errorf("store: touch API key %s: %w", id, err)
	}
	return nil
}

// PutSigningKey inserts a token-signing key.
func (s *Store) PutSigningKey(ctx context.Context, k store.SigningKey) error {
	if _, err := s.exec(ctx, sqlstore.InsertSigningKey, k.ID, k.Created.UnixNano(), k.Seed); err != nil {
		return fmt.Errorf("store: put signing key %s: %w", k.ID, err)
	}
	return nil
}

// SigningKeys lists the signing keys created since, newest first.
func (s *Store) SigningKeys(ctx context.Context, since time.Time) ([]store.SigningKey, error) {
	var out []store.SigningKey
	err := s.query(ctx, "list signing keys", sqlstore.SigningKeysSince, []any{since.UnixNano()}, func(rows *sql.Rows) error {
		var err error
		out, err = sqlstore.ScanSigningKeys(rows)
		return err
	})
	return out, err
}

// DeleteSigningKeys removes the signing keys created before before.
func (s *Store) DeleteSigningKeys(ctx context.Context, before time.Time) (int, error) {
	n, err := s.exec(ctx, sqlstore.DeleteSigningKeysBefore, before.UnixNano())
	if err != nil {
		return 0, fmt.Errorf("store: delete signing keys: %w", err)
	}
	return int(n), nil
}

func (s *Store) apiKeys(ctx context.Context, what, query string, args ...any) ([]*loopsv1.ApiKey, error) {
	var out []*loopsv1.ApiKey
	err := s.query(ctx, what, query, args, func(rows *sql.Rows) error {
		var err error
		out, err = sqlstore.ScanAPIKeys(rows)
		return err
	})
	return out, err
}
