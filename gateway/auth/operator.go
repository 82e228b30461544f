package auth

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/internal/errs"
)

// NotOperatorHeader marks a request that is not an operator's although it may reach the
// server from loopback: the middleware sets it on the requests whose own peer is not on
// loopback, and the REST gateway passes it on, so that a REST call's hop back to this
// server's listener, or a standby's forward to its leader, both from loopback, is not taken
// for an operator's. A client that sends it only denies itself.
const NotOperatorHeader = "X-Loops-Not-Operator"

type operatorCtxKey struct{}

// WithOperator returns a context that carries the operator role.
func WithOperator(ctx context.Context) context.Context {
	return context.WithValue(ctx, operatorCtxKey{}, true)
}

// IsOperator reports whether the request was authenticated as an operator's.
func IsOperator(ctx context.Context) bool {
	ok, _ := ctx.Value(operatorCtxKey{}).(bool)
	return ok
}

// RequireOperator returns nil for an operator's request and a PermissionDenied error (reason
// errs.ReasonOperatorRequired) that says how to become one otherwise.
func RequireOperator(ctx context.Context) error {
	if IsOperator(ctx) {
		return nil
	}
	return errs.New(connect.CodePermissionDenied, errs.ReasonOperatorRequired, errors.New(
		"this call needs an operator key, and a workspace API key is not one: start loops serve with --operator-key tml-… (repeatable, or LOOPS_OPERATOR_KEYS=k1,k2) and send that key in the X-API-Key header (loops pools and loops allocations: --operator-key or LOOPS_OPERATOR_KEY); with no API keys configured at all, any key is an operator's on loopback unless operator keys are set"))
}

// errOperatorKey refuses an operator key where a workspace key is needed.
var errOperatorKey = errors.New("this is an operator key, not a workspace API key: it may only call operator services (PoolService: loops pools, loops allocations; KeyService: loops keys); use a workspace key (--api-key) for runs, checkpoints and sampling")

// AddOperatorKeys adds operator keys: they may call operator services (PoolService) and
// nothing else; they have no workspace. A key has an API key's shape (tml-…) and must not
// also be a workspace key. Once one is configured, operator services take only these keys,
// in open mode too.
func (k *Keys) AddOperatorKeys(entries []string) error {
	for _, e := range entries {
		key := strings.TrimSpace(e)
		if key == "" {
			continue
		}
		if err := validKey(key); err != nil {
			return fmt.Errorf("operator key: %w", err)
		}
		h := sha256.Sum256([]byte(key))
		if _, dup := k.byHash[h]; dup {
			return errors.New("an operator key is also configured as a workspace API key: give operators their own key")
		}
		if k.operators == nil {
			k.operators = map[[32]byte]struct{}{}
		}
		k.operators[h] = struct{}{}
	}
	return nil
}

// Operators is the number of configured operator keys.
func (k *Keys) Operators() int {
	if k == nil {
		return 0
	}
	return len(k.operators)
}

// operatorKey reports whether key is a configured operator key (compared in constant time
// with every one).
func (k *Keys) operatorKey(key string) bool {
	if k == nil || len(k.operators) == 0 {
		return false
	}
	h := sha256.Sum256([]byte(key))
	found := 0
	for oh := range k.operators {
		found |= subtle.ConstantTimeCompare(oh[:], h[:])
	}
	return found == 1
}

// openOperator reports whether a workspace-authenticated request is also an operator's: in
// open mode (no API keys) with no operator keys, the requests from loopback peers are; the
// server then listens on loopback only, so that is whoever can reach it on this host. A
// request marked with NotOperatorHeader is not. For a request from another peer it marks
// the request, so that a REST call does not become an operator's on its hop back over
// loopback.
func (k *Keys) openOperator(r *http.Request) bool {
	if !k.Open() || k.Operators() > 0 {
		return false
	}
	if r.Header.Get(NotOperatorHeader) != "" {
		return false
	}
	if !loopbackPeer(r.RemoteAddr) {
		r.Header.Set(NotOperatorHeader, "1")
		return false
	}
	return true
}

// loopbackPeer reports whether a request's RemoteAddr is a loopback address.
func loopbackPeer(remote string) bool {
	host, _, err := net.SplitHostPort(remote)
	if err != nil {
		host = remote
	}
	ip, err := netip.ParseAddr(strings.TrimSuffix(strings.TrimPrefix(host, "["), "]"))
	return err == nil && ip.Unmap().IsLoopback()
}
