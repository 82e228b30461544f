package store

import (
	"context"
	"errors"
	"time"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// ErrLimit is returned by a create that would take a workspace over its bound of records
// of that kind; nothing was written.
var ErrLimit = errors.New("store: limit reached")

// WeightsAccessStore keeps weights-access tokens (loops.v1 WeightsAccessToken): each
// belongs to the workspace that issued it and is found by the SHA-256 of its secret (hex),
// which is all the store keeps of the secret.
type WeightsAccessStore interface {
	// CreateWeightsAccessToken inserts a token of the workspace with the hash of its
	// secret, unless the workspace already holds max tokens whose expire_time is after now:
	// then it fails with ErrLimit and writes nothing. t.Id, t.ExpireTime and hash must be
	// set; an id or hash already stored is an error (other than ErrNotFound or ErrLimit).
	CreateWeightsAccessToken(ctx context.Context, workspace string, t *loopsv1.WeightsAccessToken, hash string, now time.Time, max int) error
	// GetWeightsAccessToken returns the token whose secret hashes to hash and the workspace
	// that issued it, whoever that is, expired or not: the caller checks expire_time.
	GetWeightsAccessToken(ctx context.Context, hash string) (*loopsv1.WeightsAccessToken, string, error)
	// ListWeightsAccessTokens lists the workspace's tokens whose expire_time is after now,
	// newest first (by create_time, then id), at most MaxPageLimit.
	ListWeightsAccessTokens(ctx context.Context, workspace string, now time.Time) ([]*loopsv1.WeightsAccessToken, error)
	// DeleteWeightsAccessToken removes a token of the workspace by id.
	DeleteWeightsAccessToken(ctx context.Context, workspace, id string) error
	// DeleteExpiredWeightsAccessTokens removes the tokens of every workspace whose
	// expire_time is at or before now and returns how many it removed.
	DeleteExpiredWeightsAccessTokens(ctx context.Context, now time.Time) (int, error)
}
