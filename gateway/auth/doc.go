// Package auth checks API keys and scopes every request to a workspace. Keys look like
// "tml-…" (the tinker SDK refuses other shapes). With keys configured, only those keys are
// accepted and each maps to its workspace. With none configured the server runs in open
// mode: it must listen on loopback only, accepts any well-formed key, and gives each distinct
// key its own workspace, so isolation still holds between keys.
//
// Operator keys (operator.go) are a second role: an operator key belongs to no workspace and
// may call the operator services (PoolService) only; RequireOperator checks the role. In
// open mode with no operator keys, every request from a loopback peer is an operator's too.
//
// Keys may also be records in the store (directory.go: a Directory finds them by hash through
// a bounded, expiring cache; KeyService in package keysvc makes and revokes them), and any
// workspace key may be exchanged for a short-lived access token (tokens.go: Ed25519 JWTs whose
// signing keys are in the store and rotate), which the Middleware accepts in place of the key
// while the key is still good. docs/security.md, "API keys and access tokens".
package auth
