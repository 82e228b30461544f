package sqlstore

import (
	"errors"
	"fmt"
	"time"

	"google.golang.org/protobuf/proto"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The weights-access token statements (store.WeightsAccessStore).
const (
	// GetWeightsAccessToken selects (workspace, data) of the token with a secret's hash.
	GetWeightsAccessToken = `SELECT workspace, data FROM weights_access_tokens WHERE token_hash = $1`
	// ListWeightsAccessTokens selects (workspace, data) of a workspace's live tokens ($2:
	// now), newest first, at most $3.
	ListWeightsAccessTokens = `SELECT workspace, data FROM weights_access_tokens
		WHERE workspace = $1 AND expire_time > $2 ORDER BY create_time DESC, id DESC LIMIT $3`
	// DeleteWeightsAccessToken deletes a token of a workspace by id.
	DeleteWeightsAccessToken = `DELETE FROM weights_access_tokens WHERE workspace = $1 AND id = $2`
	// DeleteExpiredWeightsAccessTokens deletes the tokens expired at $1.
	DeleteExpiredWeightsAccessTokens = `DELETE FROM weights_access_tokens WHERE expire_time <= $1`
)

// CreateWeightsAccessToken returns the insert of a token that inserts nothing when the
// workspace already holds max live tokens at now (one statement: the count and the insert
// cannot be split by another writer of the SQLite store, and PostgreSQL runs it in one
// snapshot). Its casts name each database's types.
func (d Dialect) CreateWeightsAccessToken(workspace string, t *loopsv1.WeightsAccessToken, hash string, now time.Time, max int) (Query, error) {
	if t == nil || t.GetId() == "" || t.GetExpireTime() == nil || hash == "" {
		return Query{}, errors.New("create weights access token: missing id, expire_time or hash")
	}
	data, err := proto.Marshal(t)
	if err != nil {
		return Query{}, fmt.Errorf("create weights access token %s: encode: %w", t.GetId(), err)
	}
	return Query{
		SQL: `INSERT INTO weights_access_tokens (id, workspace, token_hash, create_time, expire_time, data)
		SELECT ` + d.WeightsAccessTokenColumns + `
		WHERE (SELECT count(*) FROM weights_access_tokens WHERE workspace = $2 AND expire_time > $7) < $8`,
		Args: []any{t.GetId(), workspace, hash, Nanos(t.GetCreateTime()), Nanos(t.GetExpireTime()), data, now.UnixNano(), int64(max)},
	}, nil
}

// NewWeightsAccessToken is the constructor of the token records' messages.
func NewWeightsAccessToken() *loopsv1.WeightsAccessToken { return &loopsv1.WeightsAccessToken{} }

// NewGet returns a lookup with no query of its own, to Decode a row that a store selected
// itself (a record found by something other than its key).
func NewGet[M proto.Message](kind, id string, newMsg func() M) Get[M] {
	return Get[M]{Kind: kind, ID: id, new: newMsg}
}
