package lease

import (
	"context"
	"errors"
	"time"
)

// Defaults of Config.
const (
	// DefaultTTL is how long a lease lasts after its last renewal.
	DefaultTTL = 10 * time.Second
	// DefaultRetryEvery is how often a standby tries to take the lease.
	DefaultRetryEvery = 500 * time.Millisecond
)

// DefaultName is the name of the gateways' lease in the database.
const DefaultName = "gateway"

// ErrLost is returned by Store.Renew when the holder no longer holds the lease: it expired,
// was released, or another holder took it.
var ErrLost = errors.New("lease: not held any more")

// ErrNone is returned by Store.Get when the lease was never taken.
var ErrNone = errors.New("lease: never taken")

// Record is a lease as the database holds it. Times are on the database's clock.
type Record struct {
	// Name names the lease (DefaultName).
	Name string
	// Holder identifies the gateway process that holds (or last held) it.
	Holder string
	// Address is where the holder serves clients (http://host:port).
	Address string
	// Term grows by one each time the lease is taken; a renewal names the term it renews.
	Term int64
	// AcquiredAt is when the holder took it; RenewedAt when it last renewed it.
	AcquiredAt, RenewedAt time.Time
	// ExpiresAt is when it lapses unless renewed.
	ExpiresAt time.Time
	// Now is the database's clock when the record was read.
	Now time.Time
	// Previous is the holder the lease was taken from (empty: nobody, or the holder
	// itself); PreviousExpiresAt when that holder's lease lapsed or was released. Set by
	// TryAcquire only.
	Previous          string
	PreviousExpiresAt time.Time
}

// Live reports whether the lease was held when the record was read.
func (r Record) Live() bool { return r.Now.Before(r.ExpiresAt) }

// Store keeps leases. Implementations decide expiry on the database's clock.
type Store interface {
	// TryAcquire takes the lease name for holder (serving at address) for ttl when nobody
	// holds it (never taken, released, or expired). It returns the record as it stands
	// afterwards and whether holder now holds it (with a new term).
	TryAcquire(ctx context.Context, name, holder, address string, ttl time.Duration) (Record, bool, error)
	// Renew extends holder's lease of the given term to the database's now + ttl. It fails
	// with ErrLost when that term is over (expired, released or taken).
	Renew(ctx context.Context, name, holder string, term int64, ttl time.Duration) (Record, error)
	// Release ends holder's lease of the given term now, so a standby need not wait for it
	// to expire. Releasing a lease no longer held does nothing.
	Release(ctx context.Context, name, holder string, term int64) error
	// Get returns the lease's record, or ErrNone.
	Get(ctx context.Context, name string) (Record, error)
}
