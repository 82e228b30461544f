package auth

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
)

// Caller is who sent an authenticated request: the id of its API key (never the key) and
// the client's address as the proxy policy resolves it. Audit records and whoami read it.
type Caller struct {
	// KeyID names the API key without revealing it: KeyIDOf(key).
	KeyID string
	// Addr is the client's IP address, after trusted proxies.
	Addr string
}

type callerKey struct{}

// WithCaller returns a context that carries the caller.
func WithCaller(ctx context.Context, c Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, c)
}

// CallerOf returns the caller of an authenticated request (the zero Caller when there is
// none: a public path, or a context not built by the Middleware).
func CallerOf(ctx context.Context) Caller {
	c, _ := ctx.Value(callerKey{}).(Caller)
	return c
}

// KeyIDOf is the public id of an API key: "key-" and the first 16 hex digits of the key's
// SHA-256. It is stable across restarts, the same for a key given by flag, file or record,
// and reveals nothing usable of the key.
func KeyIDOf(key string) string {
	h := sha256.Sum256([]byte(key))
	return "key-" + hex.EncodeToString(h[:8])
}
