package auth

import (
	"context"
	"crypto/ed25519"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/golang-jwt/jwt/v5"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/sqlite"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// clock is a settable test clock.
type clock struct {
	mu sync.Mutex
	t  time.Time
}

func newClock() *clock { return &clock{t: time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC)} }

func (c *clock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *clock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.t = c.t.Add(d)
}

func openStore(t *testing.T) store.Store {
	st, err := sqlite.Open(t.Context(), filepath.Join(t.TempDir(), "loops.db"))
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, st.Close()) })
	return st
}

func openStoreF(f *testing.F) store.Store {
	st, err := sqlite.Open(f.Context(), filepath.Join(f.TempDir(), "loops.db"))
	if err != nil {
		f.Fatal(err)
	}
	f.Cleanup(func() { _ = st.Close() })
	return st
}

// gatewayKeys is one gateway's keys over st: a flag key of workspace "flag-ws" and the
// stored keys and tokens of st.
func gatewayKeys(t *testing.T, st store.Store, c *clock) *Keys {
	k, err := ParseKeys([]string{"tml-flag=flag-ws"})
	require.NoError(t, err)
	return k.WithRecords(NewDirectory(st, DirectoryOptions{Now: c.Now}), NewTokens(st, TokenOptions{Now: c.Now}))
}

// serve answers with the request's identity, through the middleware.
func serve(k *Keys, th *Throttle) http.Handler {
	return k.Middleware(Policy{Throttle: th}, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := IdentityOf(r.Context())
		_, _ = w.Write([]byte(Workspace(r.Context()) + " " + id.KeyID + " " + string(id.Source) + " " + id.Role.String() + " " + CallerOf(r.Context()).KeyID))
	}))
}

func call(h http.Handler, key string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(http.MethodGet, "/x", nil)
	r.Header.Set(HeaderName, key)
	w := httptest.NewRecorder()
	h.ServeHTTP(w, r)
	return w
}

func TestStoredKeysAuthenticateUntilRevoked(t *testing.T) {
	ctx := t.Context()
	c := newClock()
	st := openStore(t)
	k := gatewayKeys(t, st, c)
	h := serve(k, nil)

	rec, secret, err := k.Directory().Create(ctx, "team", loopsv1.KeyRole_KEY_ROLE_ADMIN, "ci")
	require.NoError(t, err)
	require.Equal(t, KeyIDOf(secret), rec.GetId())
	require.NoError(t, validKey(secret))
	stored, err := st.GetAPIKey(ctx, "team", rec.GetId())
	require.NoError(t, err)
	require.NotContains(t, stored.String(), secret, "the secret is not stored")

	w := call(h, secret)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.Equal(t, "team "+rec.GetId()+" record KEY_ROLE_ADMIN "+rec.GetId(), w.Body.String())
	require.Equal(t, "flag-ws "+KeyIDOf("tml-flag")+" flag KEY_ROLE_MEMBER "+KeyIDOf("tml-flag"), call(h, "tml-flag").Body.String())
	require.Equal(t, http.StatusUnauthorized, call(h, "tml-nobody").Code)

	// Its last use is recorded (in the background, to the minute).
	require.Eventually(t, func() bool {
		got, err := st.GetAPIKey(ctx, "", rec.GetId())
		return err == nil && got.GetLastUsedTime() != nil
	}, 5*time.Second, 10*time.Millisecond)

	_, err = k.Directory().Revoke(ctx, "other", rec.GetId())
	require.ErrorIs(t, err, store.ErrNotFound, "another workspace's key")
	require.Equal(t, http.StatusOK, call(h, secret).Code)
	_, err = k.Directory().Revoke(ctx, "team", rec.GetId())
	require.NoError(t, err)
	w = call(h, secret)
	require.Equal(t, http.StatusUnauthorized, w.Code, "refused at once on this gateway")
	require.Contains(t, w.Body.String(), "revoked")
	require.Equal(t, http.StatusOK, call(h, "tml-flag").Code)
}

// A second gateway on the same database sees a revocation within its cache's TTL.
func TestRevocationReachesAnotherGatewayWithinTheTTL(t *testing.T) {
	ctx := t.Context()
	c := newClock()
	st := openStore(t)
	a, b := gatewayKeys(t, st, c), gatewayKeys(t, st, c)
	_, secret, err := a.Directory().Create(ctx, "team", loopsv1.KeyRole_KEY_ROLE_MEMBER, "")
	require.NoError(t, err)
	hb := serve(b, nil)
	require.Equal(t, http.StatusOK, call(hb, secret).Code)
	tok, err := a.Tokens().Issue(ctx, Identity{Workspace: "team", KeyID: KeyIDOf(secret), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceRecord})
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, call(hb, tok).Code, "b verifies a's token: the signing keys are in the store")

	_, err = a.Directory().Revoke(ctx, "", KeyIDOf(secret))
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, call(hb, secret).Code, "b's cache still holds the key")
	require.Equal(t, http.StatusOK, call(hb, tok).Code)
	c.Advance(DefaultKeyCacheTTL)
	require.Equal(t, http.StatusUnauthorized, call(hb, secret).Code)
	w := call(hb, tok)
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, `Bearer error="invalid_token"`, w.Header().Get("WWW-Authenticate"))
}

func TestTokens(t *testing.T) {
	ctx := t.Context()
	c := newClock()
	st := openStore(t)
	k := gatewayKeys(t, st, c)
	th := NewThrottle(ThrottleOptions{FailuresPerClient: 3, FailureEvery: time.Hour, Now: c.Now})
	h := serve(k, th)
	flagID := Identity{Workspace: "flag-ws", KeyID: KeyIDOf("tml-flag"), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceFlag}
	tok, err := k.Tokens().Issue(ctx, flagID)
	require.NoError(t, err)
	require.True(t, LooksLikeToken(tok))

	// The claims the tinker SDK reads: sub, org_id, email, iat, exp.
	claims, err := k.Tokens().Verify(ctx, tok)
	require.NoError(t, err)
	require.Equal(t, flagID.KeyID, claims.Subject)
	require.Equal(t, "flag-ws", claims.OrgID)
	require.Equal(t, DefaultTokenLifetime, claims.ExpiresAt.Sub(claims.IssuedAt.Time))

	w := call(h, tok)
	require.Equal(t, http.StatusOK, w.Code)
	require.Equal(t, "flag-ws "+flagID.KeyID+" flag KEY_ROLE_MEMBER "+flagID.KeyID, w.Body.String())

	// Forged: another signer's key (same kid), HS256, alg none, a changed claim.
	forger := ed25519.NewKeyFromSeed(make([]byte, 32))
	parsed, _, err := jwt.NewParser().ParseUnverified(tok, &Claims{})
	require.NoError(t, err)
	forged := jwt.NewWithClaims(jwt.SigningMethodEdDSA, parsed.Claims)
	forged.Header["kid"] = parsed.Header["kid"]
	bad1, err := forged.SignedString(forger)
	require.NoError(t, err)
	hs := jwt.NewWithClaims(jwt.SigningMethodHS256, parsed.Claims)
	hs.Header["kid"] = parsed.Header["kid"]
	bad2, err := hs.SignedString([]byte("secret"))
	require.NoError(t, err)
	none := jwt.NewWithClaims(jwt.SigningMethodNone, parsed.Claims)
	bad3, err := none.SignedString(jwt.UnsafeAllowNoneSignatureType)
	require.NoError(t, err)
	parts := strings.Split(tok, ".")
	bad4 := parts[0] + "." + strings.TrimRight(parts[1], "=") + "x." + parts[2]
	for i, bad := range []string{bad1, bad2, bad3} {
		_, err := k.Tokens().Verify(ctx, bad)
		require.ErrorIs(t, err, ErrBadToken, "forgery %d", i)
	}
	_, err = k.Tokens().Verify(ctx, bad4)
	require.ErrorIs(t, err, ErrBadToken)
	_, err = k.Tokens().Verify(ctx, strings.Repeat("a", MaxTokenBytes+1))
	require.ErrorIs(t, err, ErrBadToken)

	// Forged tokens count as wrong keys: the fourth from one address is throttled.
	for range 3 {
		require.Equal(t, http.StatusUnauthorized, call(h, bad1).Code)
	}
	require.Equal(t, http.StatusTooManyRequests, call(h, bad1).Code)
}

func TestTokenExpiryAndRotation(t *testing.T) {
	ctx := t.Context()
	c := newClock()
	st := openStore(t)
	k := gatewayKeys(t, st, c)
	id := Identity{Workspace: "flag-ws", KeyID: KeyIDOf("tml-flag"), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceFlag}
	kidOf := func(tok string) string {
		p, _, err := jwt.NewParser().ParseUnverified(tok, &Claims{})
		require.NoError(t, err)
		return p.Header["kid"].(string)
	}
	first, err := k.Tokens().Issue(ctx, id)
	require.NoError(t, err)
	c.Advance(DefaultTokenLifetime)
	_, err = k.Tokens().Verify(ctx, first)
	require.ErrorIs(t, err, ErrTokenExpired)
	w := call(serve(k, nil), first)
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Equal(t, `Bearer error="invalid_token"`, w.Header().Get("WWW-Authenticate"))

	// Within a rotation period one signing key signs; after it the next one does, and the
	// old one still verifies the tokens it signed until they expire.
	c.Advance(DefaultSigningKeyRotation - DefaultTokenLifetime - time.Minute)
	late, err := k.Tokens().Issue(ctx, id)
	require.NoError(t, err)
	require.Equal(t, kidOf(first), kidOf(late))
	c.Advance(2 * time.Minute)
	next, err := k.Tokens().Issue(ctx, id)
	require.NoError(t, err)
	require.NotEqual(t, kidOf(first), kidOf(next))
	_, err = k.Tokens().Verify(ctx, late)
	require.NoError(t, err, "the replaced key verifies its live tokens")
	keys, err := st.SigningKeys(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, keys, 2)

	// A gateway on the same database signs with the same current key.
	other := gatewayKeys(t, st, c)
	tok, err := other.Tokens().Issue(ctx, id)
	require.NoError(t, err)
	require.Equal(t, kidOf(next), kidOf(tok))

	// Two rotations on, the first key can have signed no live token: it is deleted.
	c.Advance(2 * DefaultSigningKeyRotation)
	_, err = k.Tokens().Issue(ctx, id)
	require.NoError(t, err)
	keys, err = st.SigningKeys(ctx, time.Time{})
	require.NoError(t, err)
	require.Len(t, keys, 1)
}

// A token's key is checked on every request: a flag key no longer configured, a token
// issued in open mode at a server with keys, are refused.
func TestTokenKeyMustStillBeGood(t *testing.T) {
	ctx := t.Context()
	c := newClock()
	st := openStore(t)
	open := (&Keys{}).WithRecords(NewDirectory(st, DirectoryOptions{Now: c.Now}), NewTokens(st, TokenOptions{Now: c.Now}))
	openTok, err := open.Tokens().Issue(ctx, Identity{Workspace: derivedWorkspace("tml-x"), KeyID: KeyIDOf("tml-x"), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceOpen})
	require.NoError(t, err)
	req := httptest.NewRequest(http.MethodGet, "http://127.0.0.1/x", nil)
	req.Header.Set(HeaderName, openTok)
	w := httptest.NewRecorder()
	serve(open, nil).ServeHTTP(w, req)
	require.Equal(t, http.StatusOK, w.Code, w.Body.String())
	require.True(t, strings.HasPrefix(w.Body.String(), derivedWorkspace("tml-x")+" "))

	keyed := gatewayKeys(t, st, c)
	require.Equal(t, http.StatusUnauthorized, call(serve(keyed, nil), openTok).Code)
	gone, err := keyed.Tokens().Issue(ctx, Identity{Workspace: "flag-ws", KeyID: KeyIDOf("tml-removed"), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceFlag})
	require.NoError(t, err)
	w = call(serve(keyed, nil), gone)
	require.Equal(t, http.StatusUnauthorized, w.Code)
	require.Contains(t, w.Body.String(), "no longer configured")
}

func TestDirectoryCacheIsBounded(t *testing.T) {
	c := newClock()
	st := openStore(t)
	d := NewDirectory(st, DirectoryOptions{MaxEntries: 3, Now: c.Now})
	for i := range 20 {
		_, err := d.ByHash(context.Background(), [32]byte{byte(i)})
		require.ErrorIs(t, err, store.ErrNotFound)
		_, err = d.ByID(context.Background(), KeyIDOf(string(rune('a'+i))))
		require.ErrorIs(t, err, store.ErrNotFound)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	require.LessOrEqual(t, len(d.byHash), 3)
	require.LessOrEqual(t, len(d.byID), 3)
}

// countingSigningStore counts the reads of signing keys.
type countingSigningStore struct {
	SigningKeyStore
	mu    sync.Mutex
	reads int
}

func (c *countingSigningStore) SigningKeys(ctx context.Context, since time.Time) ([]store.SigningKey, error) {
	c.mu.Lock()
	c.reads++
	c.mu.Unlock()
	return c.SigningKeyStore.SigningKeys(ctx, since)
}

func (c *countingSigningStore) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.reads
}

// A gateway verifies a token signed by a key another gateway made a moment ago, even right
// after it read the keys; a forged kid costs one read of the keys per reloadEvery, not one
// per request.
func TestNewSigningKeyOfAnotherGatewayIsFoundAtOnce(t *testing.T) {
	ctx := t.Context()
	c := newClock()
	st := openStore(t)
	id := Identity{Workspace: "flag-ws", KeyID: KeyIDOf("tml-flag"), Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, Source: SourceFlag}
	a := NewTokens(st, TokenOptions{Now: c.Now})
	counted := &countingSigningStore{SigningKeyStore: st}
	b := NewTokens(counted, TokenOptions{Now: c.Now})
	tok1, err := a.Issue(ctx, id)
	require.NoError(t, err)
	_, err = b.Verify(ctx, tok1)
	require.NoError(t, err)

	// Another gateway rotates one second later (a short rotation stands in for a day).
	c.Advance(time.Second)
	tok2, err := NewTokens(st, TokenOptions{Now: c.Now, Rotation: time.Millisecond}).Issue(ctx, id)
	require.NoError(t, err)
	_, err = b.Verify(ctx, tok2)
	require.NoError(t, err, "a kid not seen before is looked for at once")
	_, err = b.Verify(ctx, tok1)
	require.NoError(t, err, "the first key still verifies")

	reads := counted.count()
	parsed, _, err := jwt.NewParser().ParseUnverified(tok2, &Claims{})
	require.NoError(t, err)
	forged := jwt.NewWithClaims(jwt.SigningMethodEdDSA, parsed.Claims)
	forged.Header["kid"] = "sk-forged"
	bad, err := forged.SignedString(ed25519.NewKeyFromSeed(make([]byte, 32)))
	require.NoError(t, err)
	for range 5 {
		_, err = b.Verify(ctx, bad)
		require.ErrorIs(t, err, ErrBadToken)
	}
	require.Equal(t, reads+1, counted.count(), "one read for the forged kid")
	c.Advance(reloadEvery)
	_, err = b.Verify(ctx, bad)
	require.ErrorIs(t, err, ErrBadToken)
	require.Equal(t, reads+2, counted.count())
}
