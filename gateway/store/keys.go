package store

import (
	"context"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// KeyStore keeps API keys as records (loops.v1 ApiKey) and the keys that sign access tokens
// (gateway/auth). A key record holds the SHA-256 of the key's secret, never the secret. Its
// last-used and revoke times are kept beside the record and set on the records returned.
type KeyStore interface {
	// CreateAPIKey inserts a new key record with the SHA-256 of its secret. k.Id and
	// k.Workspace must not be empty; an id or hash that exists already is an error (other
	// than ErrNotFound) and changes nothing.
	CreateAPIKey(ctx context.Context, k *loopsv1.ApiKey, hash [32]byte) error
	// APIKeyByHash returns the record of the key whose secret hashes to hash, revoked or not.
	APIKeyByHash(ctx context.Context, hash [32]byte) (*loopsv1.ApiKey, error)
	// GetAPIKey returns a key record by id; workspace "" matches every workspace, another
	// names the only one searched (a key of another workspace is ErrNotFound).
	GetAPIKey(ctx context.Context, workspace, id string) (*loopsv1.ApiKey, error)
	// ListAPIKeys lists at most limit key records (limit bounded as a Page's) of the
	// workspace, or of every workspace for "", newest first: by create time, then id,
	// descending.
	ListAPIKeys(ctx context.Context, workspace string, limit int) ([]*loopsv1.ApiKey, error)
	// RevokeAPIKey sets a key's revoke time to at unless it is revoked already, and returns
	// its record; workspace scopes the id as GetAPIKey's does.
	RevokeAPIKey(ctx context.Context, workspace, id string, at time.Time) (*loopsv1.ApiKey, error)
	// SetAPIKeyBudgets sets a key's budgets (ApiKey.budget_usd_month and budget_usd_total,
	// "" for none), revoked or not, and returns its record; workspace scopes the id as
	// GetAPIKey's does.
	SetAPIKeyBudgets(ctx context.Context, workspace, id, month, total string) (*loopsv1.ApiKey, error)
	// TouchAPIKey moves a key's last-used time forward to at (never back).
	TouchAPIKey(ctx context.Context, id string, at time.Time) error

	// PutSigningKey inserts a token-signing key; an id that exists is an error.
	PutSigningKey(ctx context.Context, k SigningKey) error
	// SigningKeys lists the signing keys created at or after since, newest first.
	SigningKeys(ctx context.Context, since time.Time) ([]SigningKey, error)
	// DeleteSigningKeys removes the signing keys created before before and returns how many.
	DeleteSigningKeys(ctx context.Context, before time.Time) (int, error)
}

// SigningKey is a key that signs access tokens: an Ed25519 private key (its 32-byte seed),
// named by ID in the tokens it signs.
type SigningKey struct {
	ID      string
	Created time.Time
	Seed    []byte
}

// APIKeyLimit bounds a ListAPIKeys limit as a Page's Limit is bounded.
func APIKeyLimit(limit int) int { return JobLimit(limit) }
