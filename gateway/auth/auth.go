package auth

import (
	"bufio"
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strings"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
)

// HeaderName is the header that carries the API key, as the tinker SDK sends it.
const HeaderName = "X-API-Key"

// KeyPrefix is the prefix every API key has.
const KeyPrefix = "tml-"

type workspaceKey struct{}

// WithWorkspace returns a context that carries the workspace.
func WithWorkspace(ctx context.Context, workspace string) context.Context {
	return context.WithValue(ctx, workspaceKey{}, workspace)
}

// Workspace returns the workspace of an authenticated request, or "" if there is none.
func Workspace(ctx context.Context) string {
	ws, _ := ctx.Value(workspaceKey{}).(string)
	return ws
}

// RequireWorkspace returns the request's workspace, or an Unauthenticated error.
func RequireWorkspace(ctx context.Context) (string, error) {
	if ws := Workspace(ctx); ws != "" {
		return ws, nil
	}
	if IsOperator(ctx) {
		return "", connect.NewError(connect.CodePermissionDenied, errOperatorKey)
	}
	return "", connect.NewError(connect.CodeUnauthenticated, errors.New("missing API key: send it in the X-API-Key header (tinker: set TINKER_API_KEY=tml-…)"))
}

// Keys is the set of accepted API keys and their workspaces, and the operator keys
// (operator.go). The zero value (no keys) is open mode.
type Keys struct {
	byHash    map[[32]byte]string
	operators map[[32]byte]struct{}
	// ids maps the ids (KeyIDOf) of the flag and file keys to their workspaces: what a
	// token of such a key is checked against.
	ids map[string]string
	// dir finds the keys kept as records; tokens issues and verifies access tokens. Both
	// nil without a store (WithRecords).
	dir    *Directory
	tokens *Tokens
}

// WithRecords returns a copy of k that also accepts the keys kept as records in dir and
// the access tokens that tokens signs, of those keys and of k's own.
func (k *Keys) WithRecords(dir *Directory, tokens *Tokens) *Keys {
	c := &Keys{}
	if k != nil {
		*c = *k
	}
	c.dir, c.tokens = dir, tokens
	return c
}

// Directory is the directory of stored keys, nil without one.
func (k *Keys) Directory() *Directory {
	if k == nil {
		return nil
	}
	return k.dir
}

// Tokens is the access-token issuer, nil without one.
func (k *Keys) Tokens() *Tokens {
	if k == nil {
		return nil
	}
	return k.tokens
}

// ParseKeys builds a key set from entries "KEY" or "KEY=WORKSPACE". A key without a
// workspace gets one derived from the key.
func ParseKeys(entries []string) (*Keys, error) {
	k := &Keys{byHash: map[[32]byte]string{}, ids: map[string]string{}}
	for _, e := range entries {
		e = strings.TrimSpace(e)
		if e == "" || strings.HasPrefix(e, "#") {
			continue
		}
		key, ws, _ := strings.Cut(e, "=")
		key = strings.TrimSpace(key)
		if err := validKey(key); err != nil {
			return nil, err
		}
		if ws = strings.TrimSpace(ws); ws == "" {
			ws = derivedWorkspace(key)
		}
		if err := ValidateWorkspaceName(ws); err != nil {
			return nil, err
		}
		k.byHash[sha256.Sum256([]byte(key))] = ws
		k.ids[KeyIDOf(key)] = ws
	}
	return k, nil
}

// LoadKeyFile reads keys from a file, one "KEY" or "KEY=WORKSPACE" a line; # starts a comment.
func LoadKeyFile(path string) ([]string, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, fmt.Errorf("auth: reading key file: %w", err)
	}
	defer f.Close()
	var out []string
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		out = append(out, sc.Text())
	}
	return out, sc.Err()
}

// Open reports whether no workspace API keys are configured (operator keys do not count).
func (k *Keys) Open() bool { return k == nil || len(k.byHash) == 0 }

// Len is the number of configured keys.
func (k *Keys) Len() int {
	if k == nil {
		return 0
	}
	return len(k.byHash)
}

// Authenticate returns the workspace of a key or an access token.
func (k *Keys) Authenticate(key string) (string, error) {
	ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
	defer cancel()
	id, err := k.Identify(ctx, key)
	return id.Workspace, err
}

// Identify returns who a workspace key or an access token of one is: a key given by flag
// or file, a stored key that is live, any well-formed key in open mode. An operator key is
// refused (errOperatorKey), as are a revoked key (ErrRevokedKey), an unknown one
// (ErrUnknownKey) and a bad or expired token (ErrBadToken, ErrTokenExpired).
func (k *Keys) Identify(ctx context.Context, key string) (Identity, error) {
	if key == "" {
		return Identity{}, errors.New("missing API key: send it in the X-API-Key header (tinker: set TINKER_API_KEY=tml-…)")
	}
	if LooksLikeToken(key) && k.Tokens() != nil {
		return k.identifyToken(ctx, key)
	}
	if err := validKey(key); err != nil {
		return Identity{}, err
	}
	if k.operatorKey(key) {
		return Identity{}, errOperatorKey
	}
	member := loopsv1.KeyRole_KEY_ROLE_MEMBER
	h := sha256.Sum256([]byte(key))
	if k != nil {
		found, ws := 0, ""
		for kh, w := range k.byHash {
			if subtle.ConstantTimeCompare(kh[:], h[:]) == 1 {
				found, ws = 1, w
			}
		}
		if found == 1 {
			return Identity{Workspace: ws, KeyID: KeyIDOf(key), Role: member, Source: SourceFlag}, nil
		}
	}
	if d := k.Directory(); d != nil {
		rec, err := d.ByHash(ctx, h)
		switch {
		case err == nil:
			return recordIdentity(rec), nil
		case errors.Is(err, ErrRevokedKey):
			return Identity{}, err
		case !errors.Is(err, store.ErrNotFound):
			return Identity{}, errKeyLookup{err}
		}
	}
	if k.Open() {
		return Identity{Workspace: derivedWorkspace(key), KeyID: KeyIDOf(key), Role: member, Source: SourceOpen}, nil
	}
	return Identity{}, ErrUnknownKey
}

func recordIdentity(rec *loopsv1.ApiKey) Identity {
	return Identity{Workspace: rec.GetWorkspace(), KeyID: rec.GetId(), Role: rec.GetRole(), Source: SourceRecord, Record: rec}
}

// identifyToken verifies an access token and checks that its key is still good: a stored
// key must be live (revocation is seen at once on this gateway, within the directory's TTL
// on another), a flag key still configured with the same workspace, an open-mode token
// valid only while the server is open.
func (k *Keys) identifyToken(ctx context.Context, tok string) (Identity, error) {
	c, err := k.tokens.Verify(ctx, tok)
	if err != nil {
		return Identity{}, err
	}
	var id Identity
	switch Source(c.Source) {
	case SourceRecord:
		if k.dir == nil {
			return Identity{}, fmt.Errorf("%w (its key is not this server's)", ErrBadToken)
		}
		rec, err := k.dir.ByID(ctx, c.KeyID)
		switch {
		case errors.Is(err, ErrRevokedKey):
			return Identity{}, err
		case errors.Is(err, store.ErrNotFound):
			return Identity{}, fmt.Errorf("%w (its key no longer exists)", ErrBadToken)
		case err != nil:
			return Identity{}, errKeyLookup{err}
		}
		id = recordIdentity(rec)
	case SourceFlag:
		ws, ok := k.ids[c.KeyID]
		if !ok {
			return Identity{}, fmt.Errorf("%w (its key is no longer configured)", ErrBadToken)
		}
		id = Identity{Workspace: ws, KeyID: c.KeyID, Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceFlag}
	case SourceOpen:
		if !k.Open() {
			return Identity{}, fmt.Errorf("%w (it was issued in open mode)", ErrBadToken)
		}
		id = Identity{Workspace: c.OrgID, KeyID: c.KeyID, Role: roleOf(c.Role), Source: SourceOpen}
	default:
		return Identity{}, fmt.Errorf("%w (unknown key source %q)", ErrBadToken, c.Source)
	}
	if id.Workspace != c.OrgID {
		return Identity{}, fmt.Errorf("%w (its key belongs to another workspace now)", ErrBadToken)
	}
	id.Token = true
	return id, nil
}

// errKeyLookup is a store failure while looking up a key: the request is refused as
// unavailable, not as a wrong key.
type errKeyLookup struct{ err error }

func (e errKeyLookup) Error() string {
	return "the API key could not be checked right now (the key store did not answer): retry shortly: " + e.err.Error()
}
func (e errKeyLookup) Unwrap() error { return e.err }

// ErrUnknownKey is Authenticate's answer for a well-formed key that is not configured: a
// guess, which the Throttle counts (a missing or malformed key cannot be right, so it is
// not counted).
var ErrUnknownKey = errors.New("unknown API key: use a key the server was started with (--api-key, LOOPS_API_KEYS or --api-key-file) or one made with loops keys create")

// Middleware authenticates every request except those to the policy's public paths and
// puts the workspace in the request context. A failure is a 401 with a JSON body; with the
// policy's Throttle, a client address sending wrong keys is soon answered 429 with
// Retry-After instead, whatever key it sends (see Throttle). In open
// mode (no keys) a request whose Host is not a loopback name is refused with a 403 first,
// public paths included: a DNS-rebinding web page would send its own name. A key with
// MaxRequestsPerKey requests in flight gets a 429 for one more. An operator key's request
// carries the operator role and no workspace; in open mode with no operator keys a request
// from a loopback peer carries both (operator.go).
func (k *Keys) Middleware(p Policy, next http.Handler) http.Handler {
	h, _ := k.middleware(p, next)
	return h
}

func (k *Keys) middleware(p Policy, next http.Handler) (http.Handler, *inflight) {
	inflight := newInflight(p.MaxRequestsPerKey)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if k.Open() && !loopbackHost(r.Host) {
			p.refuse(w, r, refusal{connect.CodePermissionDenied, "", errForeignHost(r.Host), 0})
			return
		}
		for _, pub := range p.Public {
			if r.URL.Path == pub || (strings.HasSuffix(pub, "/") && strings.HasPrefix(r.URL.Path, pub)) {
				next.ServeHTTP(w, r)
				return
			}
		}
		key := r.Header.Get(HeaderName)
		if key == "" {
			// gRPC-gateway and Connect clients may send the standard bearer form.
			if b, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer "); ok {
				key = strings.TrimSpace(b)
			}
		}
		var ctx context.Context
		var who Identity
		client := p.Proxies.ClientAddr(r)
		if k.operatorKey(key) {
			if err := p.Throttle.Check(client); err != nil {
				p.refuse(w, r, throttled(err))
				return
			}
			ctx = WithOperator(r.Context())
			who = Identity{KeyID: KeyIDOf(key), Role: loopsv1.KeyRole_KEY_ROLE_OPERATOR, Source: SourceOperator}
		} else {
			id, err := k.Identify(r.Context(), key)
			if err != nil {
				if errors.Is(err, ErrUnknownKey) || errors.Is(err, ErrBadToken) {
					if terr := p.Throttle.Failed(client); terr != nil {
						p.refuse(w, r, throttled(terr))
						return
					}
				}
				if LooksLikeToken(key) {
					// RFC 6750: the tinker SDK exchanges its key for a new token and retries.
					w.Header().Set("WWW-Authenticate", `Bearer error="invalid_token"`)
				}
				var lookup errKeyLookup
				if errors.As(err, &lookup) {
					p.refuse(w, r, refusal{connect.CodeUnavailable, "", err, 0})
					return
				}
				p.refuse(w, r, refusal{connect.CodeUnauthenticated, "", err, 0})
				return
			}
			if err := p.Throttle.Check(client); err != nil {
				p.refuse(w, r, throttled(err))
				return
			}
			who = id
			ctx = WithWorkspace(r.Context(), id.Workspace)
			if k.openOperator(r) {
				ctx = WithOperator(ctx)
			}
		}
		// A key and its tokens share one count.
		id, ok := inflight.acquire(who.KeyID)
		if !ok {
			p.refuse(w, r, refusal{connect.CodeResourceExhausted, errs.ReasonRateLimited, fmt.Errorf(
				"this API key already has %d requests in flight, the server's limit per key: wait for some to finish (or raise --max-requests-per-key)", inflight.max), 0})
			return
		}
		defer inflight.release(id)
		ctx = WithCaller(ctx, Caller{KeyID: who.KeyID, Addr: client.String()})
		ctx = WithIdentity(ctx, who)
		next.ServeHTTP(w, r.WithContext(ctx))
	}), inflight
}

func validKey(key string) error {
	if !strings.HasPrefix(key, KeyPrefix) || len(key) < len(KeyPrefix)+1 {
		return fmt.Errorf("malformed API key: keys start with %q (tinker: set TINKER_API_KEY=tml-…)", KeyPrefix)
	}
	for _, c := range key {
		if c <= ' ' || c > '~' {
			return errors.New("malformed API key: only printable ASCII without spaces is allowed")
		}
	}
	return nil
}

func derivedWorkspace(key string) string {
	h := sha256.Sum256([]byte("loops-workspace:" + key))
	return "ws-" + hex.EncodeToString(h[:8])
}
