package auth

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Directory defaults (DirectoryOptions).
const (
	// DefaultKeyCacheTTL is how long a looked-up key record is trusted before it is read
	// again: the most a revocation made on another gateway sharing the database takes to
	// reach this one.
	DefaultKeyCacheTTL = 10 * time.Second
	// DefaultKeyCacheEntries bounds the cached lookups (found and not found alike).
	DefaultKeyCacheEntries = 10000
	// touchEvery is how often a key's last-used time is written at most.
	touchEvery = time.Minute
	// lookupTimeout bounds one store lookup of a key.
	lookupTimeout = 5 * time.Second
)

// ErrRevokedKey refuses a stored key that was revoked.
var ErrRevokedKey = errors.New("this API key was revoked: ask a workspace admin or an operator for a new one (loops keys create)")

// DirectoryOptions tune a Directory. The zero value gives the defaults.
type DirectoryOptions struct {
	// TTL is how long a lookup is cached (default DefaultKeyCacheTTL).
	TTL time.Duration
	// MaxEntries bounds the cache (default DefaultKeyCacheEntries).
	MaxEntries int
	// Logger logs failed last-use writes (default slog.Default()).
	Logger *slog.Logger
	// Now is the clock (default time.Now).
	Now func() time.Time
}

// Directory finds the API keys kept as records in the store, through a bounded cache whose
// entries expire after the TTL. Its own revocations take effect at once; another gateway's
// within the TTL.
type Directory struct {
	st   store.KeyStore
	opts DirectoryOptions

	mu      sync.Mutex
	byHash  map[[32]byte]cached
	byID    map[string]cached
	touched map[string]time.Time
	// touching is held by the one goroutine writing last-use times.
	touching chan struct{}
}

type cached struct {
	rec *loopsv1.ApiKey // nil: no such key
	at  time.Time
}

// NewDirectory returns a directory of the keys in st.
func NewDirectory(st store.KeyStore, opts DirectoryOptions) *Directory {
	if opts.TTL <= 0 {
		opts.TTL = DefaultKeyCacheTTL
	}
	if opts.MaxEntries <= 0 {
		opts.MaxEntries = DefaultKeyCacheEntries
	}
	if opts.Logger == nil {
		opts.Logger = slog.Default()
	}
	if opts.Now == nil {
		opts.Now = time.Now
	}
	return &Directory{st: st, opts: opts, byHash: map[[32]byte]cached{}, byID: map[string]cached{},
		touched: map[string]time.Time{}, touching: make(chan struct{}, 1)}
}

// ByHash returns the live record of the key whose secret hashes to h: store.ErrNotFound
// when there is none, ErrRevokedKey when it is revoked.
func (d *Directory) ByHash(ctx context.Context, h [32]byte) (*loopsv1.ApiKey, error) {
	now := d.opts.Now()
	d.mu.Lock()
	c, ok := d.byHash[h]
	d.mu.Unlock()
	if !ok || now.Sub(c.at) >= d.opts.TTL {
		ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		rec, err := d.st.APIKeyByHash(ctx, h)
		cancel()
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("auth: looking up the API key: %w", err)
		}
		c = cached{rec: rec, at: now}
		d.mu.Lock()
		put(d, d.byHash, h, c)
		d.mu.Unlock()
	}
	rec, err := live(c.rec)
	if err == nil {
		d.touch(rec.GetId(), now)
	}
	return rec, err
}

// ByID returns the live record of the key with that id, as ByHash does: what a token's key
// is checked against.
func (d *Directory) ByID(ctx context.Context, id string) (*loopsv1.ApiKey, error) {
	now := d.opts.Now()
	d.mu.Lock()
	c, ok := d.byID[id]
	d.mu.Unlock()
	if !ok || now.Sub(c.at) >= d.opts.TTL {
		ctx, cancel := context.WithTimeout(ctx, lookupTimeout)
		rec, err := d.st.GetAPIKey(ctx, "", id)
		cancel()
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("auth: looking up the API key: %w", err)
		}
		c = cached{rec: rec, at: now}
		d.mu.Lock()
		put(d, d.byID, id, c)
		d.mu.Unlock()
	}
	rec, err := live(c.rec)
	if err == nil {
		d.touch(rec.GetId(), now)
	}
	return rec, err
}

func live(rec *loopsv1.ApiKey) (*loopsv1.ApiKey, error) {
	switch {
	case rec == nil:
		return nil, store.ErrNotFound
	case rec.GetRevokeTime() != nil:
		return nil, ErrRevokedKey
	}
	return rec, nil
}

// put caches c under k in m (d.mu held), making room first when the cache is full: expired
// entries go, then, if none had, an arbitrary one.
func put[K comparable](d *Directory, m map[K]cached, k K, c cached) {
	if _, ok := m[k]; !ok && len(m) >= d.opts.MaxEntries {
		for key, e := range m {
			if c.at.Sub(e.at) >= d.opts.TTL {
				delete(m, key)
			}
		}
		if len(m) >= d.opts.MaxEntries {
			for key := range m {
				delete(m, key)
				break
			}
		}
	}
	m[k] = c
}

// Flush drops every cached lookup (a gateway that becomes the leader calls it). A nil
// directory has none.
func (d *Directory) Flush() {
	if d == nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	clear(d.byHash)
	clear(d.byID)
}

// forget drops the cached lookups of a key after this gateway changed it.
func (d *Directory) forget(id string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	delete(d.byID, id)
	for h, c := range d.byHash {
		if c.rec.GetId() == id {
			delete(d.byHash, h)
		}
	}
}

// touch records, at most once a touchEvery per key, that a key was used: in the
// background, one write at a time, skipped while one is under way (a standby's store
// refuses writes; that is logged at debug level).
func (d *Directory) touch(id string, now time.Time) {
	d.mu.Lock()
	last, ok := d.touched[id]
	due := !ok || now.Sub(last) >= touchEvery
	if due {
		if len(d.touched) >= d.opts.MaxEntries {
			clear(d.touched)
		}
		d.touched[id] = now
	}
	d.mu.Unlock()
	if !due {
		return
	}
	select {
	case d.touching <- struct{}{}:
	default:
		return
	}
	go func() {
		defer func() { <-d.touching }()
		ctx, cancel := context.WithTimeout(context.Background(), lookupTimeout)
		defer cancel()
		if err := d.st.TouchAPIKey(ctx, id, now.Truncate(time.Minute)); err != nil {
			d.opts.Logger.Debug("recording an API key's last use failed", slog.String("key_id", id), slog.Any("err", err))
		}
	}()
}

// MaxKeysPerWorkspace bounds the key records (live and revoked) of one workspace.
const MaxKeysPerWorkspace = store.MaxPageLimit

// Create makes a new key of the workspace with the role and name, stores its record with
// the secret's hash, and returns the record and the secret (never kept).
func (d *Directory) Create(ctx context.Context, workspace string, role loopsv1.KeyRole, name string) (*loopsv1.ApiKey, string, error) {
	existing, err := d.st.ListAPIKeys(ctx, workspace, MaxKeysPerWorkspace)
	if err != nil {
		return nil, "", err
	}
	if len(existing) >= MaxKeysPerWorkspace {
		return nil, "", ErrTooManyKeys
	}
	secret, err := NewSecret()
	if err != nil {
		return nil, "", err
	}
	rec := &loopsv1.ApiKey{Id: KeyIDOf(secret), Workspace: workspace, Role: role, Name: name,
		CreateTime: timestamppb.New(d.opts.Now())}
	if err := d.st.CreateAPIKey(ctx, rec, sha256.Sum256([]byte(secret))); err != nil {
		return nil, "", err
	}
	d.forget(rec.GetId())
	return rec, secret, nil
}

// ErrTooManyKeys refuses a key beyond MaxKeysPerWorkspace.
var ErrTooManyKeys = fmt.Errorf("this workspace already has %d API key records, the most it may keep: revoked keys count too", MaxKeysPerWorkspace)

// Revoke revokes a key (of the workspace, or of any for "") and returns its record; the
// key and its tokens are refused on this gateway from now on.
func (d *Directory) Revoke(ctx context.Context, workspace, id string) (*loopsv1.ApiKey, error) {
	rec, err := d.st.RevokeAPIKey(ctx, workspace, id, d.opts.Now())
	if err != nil {
		return nil, err
	}
	d.forget(id)
	return rec, nil
}

// Get returns a key record (of the workspace, or of any for ""), revoked or not, from the
// store.
func (d *Directory) Get(ctx context.Context, workspace, id string) (*loopsv1.ApiKey, error) {
	return d.st.GetAPIKey(ctx, workspace, id)
}

// SetBudgets sets a key's budgets (of the workspace, or of any for "") and returns its
// record; this gateway checks new work against them at once, another within the
// directory's TTL.
func (d *Directory) SetBudgets(ctx context.Context, workspace, id, month, total string) (*loopsv1.ApiKey, error) {
	rec, err := d.st.SetAPIKeyBudgets(ctx, workspace, id, month, total)
	if err != nil {
		return nil, err
	}
	d.forget(id)
	return rec, nil
}

// List lists the workspace's key records (every workspace's for ""), newest first.
func (d *Directory) List(ctx context.Context, workspace string, limit int) ([]*loopsv1.ApiKey, error) {
	return d.st.ListAPIKeys(ctx, workspace, limit)
}

// NewSecret returns a new random API key: "tml-" and 64 hex digits (256 bits).
func NewSecret() (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("auth: generating a key: %w", err)
	}
	return KeyPrefix + hex.EncodeToString(b[:]), nil
}
