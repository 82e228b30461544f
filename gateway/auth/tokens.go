package auth

import (
	"context"
	"crypto/ed25519"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/golang-jwt/jwt/v5"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Token defaults (TokenOptions).
const (
	// DefaultTokenLifetime is how long an access token is good for. The tinker SDK renews
	// its token at about half its lifetime.
	DefaultTokenLifetime = 15 * time.Minute
	// DefaultSigningKeyRotation is how long one signing key signs new tokens before the next
	// one replaces it; a replaced key still verifies the tokens it signed until they expire.
	DefaultSigningKeyRotation = 24 * time.Hour
	// TokenIssuer is the iss claim of the tokens Loops signs.
	TokenIssuer = "loops"
	// MaxTokenBytes bounds a token before it is parsed.
	MaxTokenBytes = 4096
	// reloadEvery bounds how often a token naming one unknown signing key makes the signing
	// keys be read again; maxMissingKids bounds the unknown kids remembered.
	reloadEvery    = 5 * time.Second
	maxMissingKids = 1024
)

// Token errors. ErrTokenExpired is a token that was good; ErrBadToken one that never was
// (it counts as a wrong key in the Throttle).
var (
	ErrTokenExpired = errors.New("the access token has expired: exchange the API key for a new one at POST /api/v1/auth/token (the tinker SDK does this by itself)")
	ErrBadToken     = errors.New("invalid access token: send an API key (tml-…) or a token this server issued at POST /api/v1/auth/token")
)

// TokenOptions tune Tokens. The zero value gives the defaults.
type TokenOptions struct {
	// Lifetime of a token (default DefaultTokenLifetime).
	Lifetime time.Duration
	// Rotation is how long a signing key signs (default DefaultSigningKeyRotation).
	Rotation time.Duration
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// SigningKeyStore keeps the signing keys (store.KeyStore's part of it).
type SigningKeyStore interface {
	PutSigningKey(ctx context.Context, k store.SigningKey) error
	SigningKeys(ctx context.Context, since time.Time) ([]store.SigningKey, error)
	DeleteSigningKeys(ctx context.Context, before time.Time) (int, error)
}

// Tokens issues and verifies access tokens: JWTs signed with Ed25519 (EdDSA) keys kept in
// the store, so that every gateway on one database verifies every other's. A signing key
// signs for Rotation, then the next is made; keys that can no longer have signed a live
// token are deleted.
type Tokens struct {
	st   SigningKeyStore
	opts TokenOptions

	// load serialises reading and making signing keys (held over store I/O; only loaders
	// wait on it). mu guards the fields after it and is never held over I/O.
	load   sync.Mutex
	mu     sync.Mutex
	verify map[string]ed25519.PublicKey
	signer *signer
	// missing are the kids looked for in vain, and when (at most maxMissingKids).
	missing map[string]time.Time
}

type signer struct {
	id      string
	key     ed25519.PrivateKey
	created time.Time
}

// Claims are a token's claims. The tinker SDK reads sub (whoami's user), org_id (whoami's
// organization), email, iat and exp.
type Claims struct {
	jwt.RegisteredClaims
	// OrgID is the workspace.
	OrgID string `json:"org_id"`
	// KeyID is the id of the key the token was exchanged for.
	KeyID string `json:"key_id"`
	// Role is the key's role (KeyRole's name).
	Role string `json:"role"`
	// Source is where the key comes from (Source).
	Source string `json:"src"`
	// Email is always empty: a key is no person's.
	Email string `json:"email"`
}

// NewTokens returns a token issuer over st.
func NewTokens(st SigningKeyStore, opts TokenOptions) *Tokens {
	if opts.Lifetime <= 0 {
		opts.Lifetime = DefaultTokenLifetime
	}
	if opts.Rotation <= 0 {
		opts.Rotation = DefaultSigningKeyRotation
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Tokens{st: st, opts: opts, verify: map[string]ed25519.PublicKey{}, missing: map[string]time.Time{}}
}

// Lifetime is how long the tokens it issues live.
func (t *Tokens) Lifetime() time.Duration { return t.opts.Lifetime }

// Issue signs a token for the identity's key, bound to its workspace and key id.
func (t *Tokens) Issue(ctx context.Context, id Identity) (string, error) {
	if id.Workspace == "" || id.KeyID == "" {
		return "", errors.New("auth: a token needs a workspace key")
	}
	s, err := t.currentSigner(ctx)
	if err != nil {
		return "", err
	}
	now := t.opts.Now()
	var jti [8]byte
	_, _ = rand.Read(jti[:])
	claims := Claims{
		RegisteredClaims: jwt.RegisteredClaims{
			Issuer:    TokenIssuer,
			Subject:   id.KeyID,
			IssuedAt:  jwt.NewNumericDate(now),
			NotBefore: jwt.NewNumericDate(now),
			ExpiresAt: jwt.NewNumericDate(now.Add(t.opts.Lifetime)),
			ID:        hex.EncodeToString(jti[:]),
		},
		OrgID:  id.Workspace,
		KeyID:  id.KeyID,
		Role:   id.Role.String(),
		Source: string(id.Source),
	}
	tok := jwt.NewWithClaims(jwt.SigningMethodEdDSA, claims)
	tok.Header["kid"] = s.id
	return tok.SignedString(s.key)
}

// LooksLikeToken reports whether a credential is a JWT rather than an API key.
func LooksLikeToken(cred string) bool {
	return strings.HasPrefix(cred, "eyJ") && strings.Count(cred, ".") == 2
}

// Verify checks a token's signature, issuer and times and returns its claims: ErrTokenExpired
// for a token past its expiry, ErrBadToken (wrapped) for any other fault. Whether its key is
// still good is the caller's to check.
func (t *Tokens) Verify(ctx context.Context, token string) (*Claims, error) {
	if len(token) > MaxTokenBytes {
		return nil, fmt.Errorf("%w (it is over %d bytes)", ErrBadToken, MaxTokenBytes)
	}
	claims := &Claims{}
	_, err := jwt.ParseWithClaims(token, claims, func(tok *jwt.Token) (any, error) {
		kid, _ := tok.Header["kid"].(string)
		return t.publicKey(ctx, kid)
	}, jwt.WithValidMethods([]string{jwt.SigningMethodEdDSA.Alg()}), jwt.WithIssuer(TokenIssuer),
		jwt.WithExpirationRequired(), jwt.WithIssuedAt(), jwt.WithTimeFunc(t.opts.Now), jwt.WithStrictDecoding())
	switch {
	case errors.Is(err, jwt.ErrTokenExpired):
		return nil, ErrTokenExpired
	case err != nil:
		return nil, fmt.Errorf("%w (%v)", ErrBadToken, err)
	}
	if ValidateWorkspaceName(claims.OrgID) != nil || !validKeyID(claims.KeyID) || claims.Subject != claims.KeyID {
		return nil, fmt.Errorf("%w (its claims name no workspace key)", ErrBadToken)
	}
	return claims, nil
}

func validKeyID(id string) bool {
	h, ok := strings.CutPrefix(id, "key-")
	if !ok || len(h) != 16 {
		return false
	}
	_, err := hex.DecodeString(h)
	return err == nil
}

// publicKey returns the key that verifies tokens signed by kid. A kid it does not know makes
// it read the signing keys again (another gateway may have made one), unless that kid was
// already looked for in the last reloadEvery: a forged kid costs one read, then nothing.
func (t *Tokens) publicKey(ctx context.Context, kid string) (ed25519.PublicKey, error) {
	if kid == "" || len(kid) > 64 {
		return nil, errors.New("no signing key id (kid)")
	}
	now := t.opts.Now()
	t.mu.Lock()
	pub, ok := t.verify[kid]
	missed, seen := t.missing[kid]
	retry := !ok && (!seen || now.Sub(missed) >= reloadEvery)
	if retry {
		if len(t.missing) >= maxMissingKids {
			clear(t.missing)
		}
		t.missing[kid] = now
	}
	t.mu.Unlock()
	if ok {
		return pub, nil
	}
	if retry {
		if err := t.reload(ctx, false); err != nil {
			return nil, err
		}
		t.mu.Lock()
		pub, ok = t.verify[kid]
		if ok {
			delete(t.missing, kid)
		}
		t.mu.Unlock()
		if ok {
			return pub, nil
		}
	}
	return nil, fmt.Errorf("unknown signing key %q (expired or not this server's)", kid)
}

// currentSigner returns the signing key for new tokens, making one when the newest is due
// for rotation.
func (t *Tokens) currentSigner(ctx context.Context) (*signer, error) {
	t.mu.Lock()
	s := t.signer
	t.mu.Unlock()
	if s != nil && t.opts.Now().Sub(s.created) < t.opts.Rotation {
		return s, nil
	}
	if err := t.reload(ctx, true); err != nil {
		return nil, err
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	return t.signer, nil
}

// reload reads the signing keys that may have signed a live token; with sign, it also
// makes a new one when none is young enough to sign, and deletes the ones too old to
// verify anything.
func (t *Tokens) reload(ctx context.Context, sign bool) error {
	t.load.Lock()
	defer t.load.Unlock()
	now := t.opts.Now()
	if sign {
		t.mu.Lock()
		s := t.signer
		t.mu.Unlock()
		if s != nil && now.Sub(s.created) < t.opts.Rotation {
			return nil // another caller made or found one meanwhile
		}
	}
	horizon := now.Add(-t.opts.Rotation - t.opts.Lifetime)
	keys, err := t.st.SigningKeys(ctx, horizon)
	if err != nil {
		return fmt.Errorf("auth: reading signing keys: %w", err)
	}
	verify := make(map[string]ed25519.PublicKey, len(keys)+1)
	var newest *signer
	for _, k := range keys {
		if len(k.Seed) != ed25519.SeedSize {
			continue
		}
		priv := ed25519.NewKeyFromSeed(k.Seed)
		verify[k.ID] = priv.Public().(ed25519.PublicKey)
		if newest == nil || k.Created.After(newest.created) {
			newest = &signer{id: k.ID, key: priv, created: k.Created}
		}
	}
	if sign && (newest == nil || now.Sub(newest.created) >= t.opts.Rotation) {
		seed := make([]byte, ed25519.SeedSize)
		if _, err := rand.Read(seed); err != nil {
			return fmt.Errorf("auth: making a signing key: %w", err)
		}
		var id [8]byte
		_, _ = rand.Read(id[:])
		k := store.SigningKey{ID: "sk-" + hex.EncodeToString(id[:]), Created: now, Seed: seed}
		if err := t.st.PutSigningKey(ctx, k); err != nil {
			return fmt.Errorf("auth: storing a signing key: %w", err)
		}
		priv := ed25519.NewKeyFromSeed(seed)
		newest = &signer{id: k.ID, key: priv, created: now}
		verify[k.ID] = priv.Public().(ed25519.PublicKey)
		if _, err := t.st.DeleteSigningKeys(ctx, horizon); err != nil {
			return fmt.Errorf("auth: deleting old signing keys: %w", err)
		}
	}
	t.mu.Lock()
	t.verify = verify
	if newest != nil && (t.signer == nil || !newest.created.Before(t.signer.created)) {
		t.signer = newest
	}
	t.mu.Unlock()
	return nil
}

// roleOf parses a Claims.Role.
func roleOf(name string) loopsv1.KeyRole {
	return loopsv1.KeyRole(loopsv1.KeyRole_value[name])
}
