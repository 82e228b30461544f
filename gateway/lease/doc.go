// Package lease decides which of several gateways on one database is the leader: the one
// that runs the schedulers, the backends and the persister (ordered work). The others are
// standbys that forward to it.
//
// A lease is one record in the shared database (Store; package lease/pglease keeps it in
// PostgreSQL): who holds it, the address it serves on, a term that grows each time the
// holder changes, and an expiry on the database's clock. The holder renews it every
// Config.RenewEvery, each renewal moving the expiry to the database's now + Config.TTL. A
// standby tries to take it every Config.RetryEvery and succeeds only once the expiry has
// passed on the database's clock (or the holder released it), so the gateways' own clocks
// never decide who leads.
//
// Fencing: a leader that cannot renew steps down before another can take over. It counts
// the TTL from the moment it sent its last successful renewal (on its own monotonic clock,
// which can only be earlier than the database's now in that renewal), and calls
// Config.OnLost when TTL − Config.Margin has passed without a newer success: at that
// moment the database still holds the lease for at least Margin, so no standby can hold it
// yet. OnLost must stop ordered work at once (loops serve exits). A renewal that finds
// another holder or a newer term calls OnLost too.
//
// For SQLite (one process on one disk) there is no lease: the gateway is always leader.
package lease
