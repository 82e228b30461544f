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
}

// ParseKeys builds a key set from entries "KEY" or "KEY=WORKSPACE". A key without a
// workspace gets one derived from the key.
func ParseKeys(entries []string) (*Keys, error) {
	k := &Keys{byHash: map[[32]byte]string{}}
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

// Authenticate returns the workspace of a key.
func (k *Keys) Authenticate(key string) (string, error) {
	if key == "" {
		return "", errors.New("missing API key: send it in the X-API-Key header (tinker: set TINKER_API_KEY=tml-…)")
	}
	if err := validKey(key); err != nil {
		return "", err
	}
	if k.operatorKey(key) {
		return "", errOperatorKey
	}
	if k.Open() {
		return derivedWorkspace(key), nil
	}
	h := sha256.Sum256([]byte(key))
	for kh, ws := range k.byHash {
		if subtle.ConstantTimeCompare(kh[:], h[:]) == 1 {
			return ws, nil
		}
	}
	return "", ErrUnknownKey
}

// ErrUnknownKey is Authenticate's answer for a well-formed key that is not configured: a
// guess, which the Throttle counts (a missing or malformed key cannot be right, so it is
// not counted).
var ErrUnknownKey = errors.New("unknown API key: use a key the server was started with (--api-key, LOOPS_API_KEYS or --api-key-file)")

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
		client := p.Proxies.ClientAddr(r)
		if k.operatorKey(key) {
			if err := p.Throttle.Check(client); err != nil {
				p.refuse(w, r, throttled(err))
				return
			}
			ctx = WithOperator(r.Context())
		} else {
			ws, err := k.Authenticate(key)
			if err != nil {
				if errors.Is(err, ErrUnknownKey) {
					if terr := p.Throttle.Failed(client); terr != nil {
						p.refuse(w, r, throttled(terr))
						return
					}
				}
				p.refuse(w, r, refusal{connect.CodeUnauthenticated, "", err, 0})
				return
			}
			if err := p.Throttle.Check(client); err != nil {
				p.refuse(w, r, throttled(err))
				return
			}
			ctx = WithWorkspace(r.Context(), ws)
			if k.openOperator(r) {
				ctx = WithOperator(ctx)
			}
		}
		id, ok := inflight.acquire(key)
		if !ok {
			p.refuse(w, r, refusal{connect.CodeResourceExhausted, errs.ReasonRateLimited, fmt.Errorf(
				"this API key already has %d requests in flight, the server's limit per key: wait for some to finish (or raise --max-requests-per-key)", inflight.max), 0})
			return
		}
		defer inflight.release(id)
		ctx = WithCaller(ctx, Caller{KeyID: KeyIDOf(key), Addr: client.String()})
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
