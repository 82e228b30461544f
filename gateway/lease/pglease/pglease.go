// Package pglease keeps the gateways' leader lease (package lease) in PostgreSQL: one row
// per lease in the table loops_leader_lease (postgres.LeaseTable), created when missing.
// Expiry is decided on the database's clock (now()), so the gateways' clocks never matter;
// every change of holder happens in a transaction that locks the row FOR UPDATE first. The
// lease uses a small pool of its own, so a renewal never waits behind the store's queries.
//
// The store (package store/postgres) fences its writes on the same row: each write
// transaction checks, just before its COMMIT, that its term still holds the lease, under a
// FOR KEY SHARE lock. A takeover's FOR UPDATE waits for such a commit (the write then
// happened before the takeover), and a write after the takeover is refused; renewals and
// releases change no key, so they never wait for a write.
package pglease

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/loops-dev/loops/gateway/lease"
	"github.com/loops-dev/loops/gateway/store/postgres"
)

// MaxConns is the size of the lease's own pool: one renewal (or take) at a time, and a read.
const MaxConns = 2

// schema creates the lease table. It is the lease's own (not one of the store's numbered
// migrations): only PostgreSQL has leases, and the statement is idempotent.
const schema = `CREATE TABLE IF NOT EXISTS ` + postgres.LeaseTable + ` (
	name        text PRIMARY KEY,
	holder      text NOT NULL,
	address     text NOT NULL,
	term        bigint NOT NULL,
	acquired_at timestamptz NOT NULL,
	renewed_at  timestamptz NOT NULL,
	expires_at  timestamptz NOT NULL
)`

// Store is a lease.Store on PostgreSQL.
type Store struct {
	pool *pgxpool.Pool
}

var _ lease.Store = (*Store)(nil)

// Open connects to databaseURL with a pool of MaxConns connections, each bounded by
// connectTimeout (0: pgx's default), and creates the lease table if it is missing.
func Open(ctx context.Context, databaseURL string, connectTimeout time.Duration) (*Store, error) {
	cfg, err := pgxpool.ParseConfig(databaseURL)
	if err != nil {
		return nil, fmt.Errorf("lease: invalid database URL %s", postgres.Redact(databaseURL))
	}
	cfg.MaxConns = MaxConns
	if connectTimeout > 0 {
		cfg.ConnConfig.ConnectTimeout = connectTimeout
	}
	cfg.ConnConfig.RuntimeParams["application_name"] = "loops-lease"
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, fmt.Errorf("lease: open %s: %w", postgres.Redact(databaseURL), err)
	}
	if _, err := pool.Exec(ctx, schema); err != nil {
		pool.Close()
		return nil, fmt.Errorf("lease: creating the lease table in %s: %w", postgres.Redact(databaseURL), err)
	}
	return &Store{pool: pool}, nil
}

// Close closes the lease's pool.
func (s *Store) Close() { s.pool.Close() }

const columns = `name, holder, address, term, acquired_at, renewed_at, expires_at, now()`

func scan(row pgx.Row) (lease.Record, error) {
	var r lease.Record
	err := row.Scan(&r.Name, &r.Holder, &r.Address, &r.Term, &r.AcquiredAt, &r.RenewedAt, &r.ExpiresAt, &r.Now)
	return r, err
}

// TryAcquire takes the lease when nobody holds it (see lease.Store).
func (s *Store) TryAcquire(ctx context.Context, name, holder, address string, ttl time.Duration) (lease.Record, bool, error) {
	var rec lease.Record
	var ok bool
	err := pgx.BeginFunc(ctx, s.pool, func(tx pgx.Tx) error {
		// The row exists from the first take on; ON CONFLICT covers two first takes at once.
		if _, err := tx.Exec(ctx, `INSERT INTO `+postgres.LeaseTable+` (name, holder, address, term, acquired_at, renewed_at, expires_at)
			VALUES ($1, '', '', 0, now(), now(), now()) ON CONFLICT (name) DO NOTHING`, name); err != nil {
			return err
		}
		old, err := scan(tx.QueryRow(ctx, `SELECT `+columns+` FROM `+postgres.LeaseTable+` WHERE name = $1 FOR UPDATE`, name))
		if err != nil {
			return err
		}
		if old.Live() {
			rec = old
			return nil
		}
		rec, err = scan(tx.QueryRow(ctx, `UPDATE `+postgres.LeaseTable+`
			SET holder = $2, address = $3, term = term + 1, acquired_at = now(), renewed_at = now(),
			    expires_at = now() + make_interval(secs => $4)
			WHERE name = $1 RETURNING `+columns, name, holder, address, ttl.Seconds()))
		if err != nil {
			return err
		}
		if old.Holder != "" {
			rec.Previous, rec.PreviousExpiresAt = old.Holder, old.ExpiresAt
		}
		ok = true
		return nil
	})
	if err != nil {
		return lease.Record{}, false, fmt.Errorf("lease: take %q: %w", name, err)
	}
	return rec, ok, nil
}

// Renew extends holder's lease of term (see lease.Store).
func (s *Store) Renew(ctx context.Context, name, holder string, term int64, ttl time.Duration) (lease.Record, error) {
	rec, err := scan(s.pool.QueryRow(ctx, `UPDATE `+postgres.LeaseTable+`
		SET renewed_at = now(), expires_at = now() + make_interval(secs => $4)
		WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()
		RETURNING `+columns, name, holder, term, ttl.Seconds()))
	if errors.Is(err, pgx.ErrNoRows) {
		return lease.Record{}, fmt.Errorf("lease: renew %q term %d: %w", name, term, lease.ErrLost)
	}
	if err != nil {
		return lease.Record{}, fmt.Errorf("lease: renew %q term %d: %w", name, term, err)
	}
	return rec, nil
}

// Release ends holder's lease of term now (see lease.Store).
func (s *Store) Release(ctx context.Context, name, holder string, term int64) error {
	if _, err := s.pool.Exec(ctx, `UPDATE `+postgres.LeaseTable+` SET expires_at = now()
		WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > now()`, name, holder, term); err != nil {
		return fmt.Errorf("lease: release %q term %d: %w", name, term, err)
	}
	return nil
}

// Get returns the lease's record (see lease.Store).
func (s *Store) Get(ctx context.Context, name string) (lease.Record, error) {
	rec, err := scan(s.pool.QueryRow(ctx, `SELECT `+columns+` FROM `+postgres.LeaseTable+` WHERE name = $1`, name))
	if errors.Is(err, pgx.ErrNoRows) || (err == nil && rec.Holder == "") {
		return lease.Record{}, lease.ErrNone
	}
	if err != nil {
		return lease.Record{}, fmt.Errorf("lease: get %q: %w", name, err)
	}
	return rec, nil
}
