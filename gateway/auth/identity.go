package auth

import (
	"context"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Source says where a key that authenticated a request comes from.
type Source string

// The sources of keys.
const (
	// SourceFlag is a key given by flag, environment or key file.
	SourceFlag Source = "flag"
	// SourceRecord is a key kept as a record in the store (KeyService, loops keys).
	SourceRecord Source = "record"
	// SourceOpen is any key in open mode (no keys configured).
	SourceOpen Source = "open"
	// SourceOperator is an operator key.
	SourceOperator Source = "operator"
)

// Identity is who an authenticated request is, as whoami reports it.
type Identity struct {
	// Workspace is the key's workspace ("" for an operator key).
	Workspace string
	// KeyID is KeyIDOf the key.
	KeyID string
	// Role is the key's role: member, admin (stored keys only) or operator.
	Role loopsv1.KeyRole
	// Source is where the key comes from.
	Source Source
	// Record is the key's record when it is stored (SourceRecord).
	Record *loopsv1.ApiKey
	// Token reports that the request came with an access token (JWT) of the key rather
	// than the key itself.
	Token bool
}

type identityKey struct{}

// WithIdentity returns a context that carries the identity.
func WithIdentity(ctx context.Context, id Identity) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityOf returns the identity of an authenticated request, and whether there is one.
func IdentityOf(ctx context.Context) (Identity, bool) {
	id, ok := ctx.Value(identityKey{}).(Identity)
	return id, ok
}

// IsAdmin reports whether the request's key may manage its workspace's keys: a stored key
// with the admin role.
func IsAdmin(ctx context.Context) bool {
	id, _ := IdentityOf(ctx)
	return id.Role == loopsv1.KeyRole_KEY_ROLE_ADMIN && id.Workspace != ""
}
