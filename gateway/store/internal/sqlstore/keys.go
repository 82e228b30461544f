package sqlstore

import (
	"encoding/hex"
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// API key records (store.KeyStore): data is the record without its last-used and revoke
// times, which are columns of their own (0: never) so that a touch or a revoke is one
// UPDATE. $n placeholders work on both databases.
const (
	apiKeyColumns = `data, last_used, revoke_time`
	// InsertAPIKey: $1 id, $2 workspace, $3 hash (hex), $4 create time, $5 data.
	InsertAPIKey = `INSERT INTO api_keys (id, workspace, hash, create_time, last_used, revoke_time, data) VALUES ($1, $2, $3, $4, 0, 0, $5)`
	// APIKeyByHash: $1 hash (hex).
	APIKeyByHash = `SELECT ` + apiKeyColumns + ` FROM api_keys WHERE hash = $1`
	// GetAPIKey: $1 id, $2 workspace or ''.
	GetAPIKey = `SELECT ` + apiKeyColumns + ` FROM api_keys WHERE id = $1 AND ($2 = '' OR workspace = $2)`
	// ListAPIKeys: $1 workspace or '', $2 limit.
	ListAPIKeys = `SELECT ` + apiKeyColumns + ` FROM api_keys WHERE ($1 = '' OR workspace = $1) ORDER BY create_time DESC, id DESC LIMIT $2`
	// RevokeAPIKey: $1 id, $2 workspace or '', $3 revoke time.
	RevokeAPIKey = `UPDATE api_keys SET revoke_time = $3 WHERE id = $1 AND ($2 = '' OR workspace = $2) AND revoke_time = 0`
	// SetAPIKeyData: $1 id, $2 workspace or '', $3 data.
	SetAPIKeyData = `UPDATE api_keys SET data = $3 WHERE id = $1 AND ($2 = '' OR workspace = $2)`
	// TouchAPIKey: $1 id, $2 time.
	TouchAPIKey = `UPDATE api_keys SET last_used = $2 WHERE id = $1 AND last_used < $2`

	// InsertSigningKey: $1 id, $2 create time, $3 seed.
	InsertSigningKey = `INSERT INTO signing_keys (id, create_time, seed) VALUES ($1, $2, $3)`
	// SigningKeysSince: $1 create time.
	SigningKeysSince = `SELECT id, create_time, seed FROM signing_keys WHERE create_time >= $1 ORDER BY create_time DESC, id DESC`
	// DeleteSigningKeysBefore: $1 create time.
	DeleteSigningKeysBefore = `DELETE FROM signing_keys WHERE create_time < $1`
)

// NewAPIKeyArgs checks a new key record and returns InsertAPIKey's arguments.
func NewAPIKeyArgs(k *loopsv1.ApiKey, hash [32]byte) ([]any, error) {
	if k.GetId() == "" || k.GetWorkspace() == "" {
		return nil, errors.New("store: an API key needs an id and a workspace")
	}
	rec := proto.CloneOf(k)
	rec.LastUsedTime, rec.RevokeTime = nil, nil
	data, err := proto.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("store: encode API key %s: %w", k.GetId(), err)
	}
	return []any{k.GetId(), k.GetWorkspace(), HashHex(hash), Nanos(k.GetCreateTime()), data}, nil
}

// BudgetsData is the data of key record k with its budgets set to month and total.
func BudgetsData(k *loopsv1.ApiKey, month, total string) ([]byte, error) {
	rec := proto.CloneOf(k)
	rec.LastUsedTime, rec.RevokeTime = nil, nil
	rec.BudgetUsdMonth, rec.BudgetUsdTotal = month, total
	data, err := proto.Marshal(rec)
	if err != nil {
		return nil, fmt.Errorf("store: encode API key %s: %w", k.GetId(), err)
	}
	return data, nil
}

// HashHex is a key hash as its column holds it.
func HashHex(h [32]byte) string { return hex.EncodeToString(h[:]) }

// ScanAPIKeys reads rows of apiKeyColumns into records (never nil).
func ScanAPIKeys(rows Rows) ([]*loopsv1.ApiKey, error) {
	out := []*loopsv1.ApiKey{}
	for rows.Next() {
		var data []byte
		var used, revoked int64
		if err := rows.Scan(&data, &used, &revoked); err != nil {
			return nil, err
		}
		k := &loopsv1.ApiKey{}
		if err := proto.Unmarshal(data, k); err != nil {
			return nil, fmt.Errorf("decode: %w", err)
		}
		k.LastUsedTime, k.RevokeTime = timeOrNil(used), timeOrNil(revoked)
		out = append(out, k)
	}
	return out, rows.Err()
}

// OneAPIKey is the only record of a lookup's result, or store.ErrNotFound.
func OneAPIKey(keys []*loopsv1.ApiKey, err error) (*loopsv1.ApiKey, error) {
	if err != nil {
		return nil, err
	}
	if len(keys) == 0 {
		return nil, store.ErrNotFound
	}
	return keys[0], nil
}

// ScanSigningKeys reads rows of (id, create_time, seed).
func ScanSigningKeys(rows Rows) ([]store.SigningKey, error) {
	var out []store.SigningKey
	for rows.Next() {
		var k store.SigningKey
		var created int64
		if err := rows.Scan(&k.ID, &created, &k.Seed); err != nil {
			return nil, err
		}
		k.Created = time.Unix(0, created)
		out = append(out, k)
	}
	return out, rows.Err()
}

func timeOrNil(nanos int64) *timestamppb.Timestamp {
	if nanos == 0 {
		return nil
	}
	return timestamppb.New(time.Unix(0, nanos))
}
