package postgres

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
)

// Every write goes through exec (one round trip) or tx (several), which check the store's
// fence inside the write's own transaction (docs/two-gateways.md, "Fenced writes"); no
// method writes through the pool otherwise, and the contract suite (storetest.RunFencing)
// checks that every write of store.Store is refused once the lease has changed hands.

// LeaseTable is the table of the leader lease (package lease/pglease keeps it): the fence
// reads its columns name, holder, term and expires_at.
const LeaseTable = "loops_leader_lease"

// fenceCheck is the fence. It fails with division_by_zero, which aborts the transaction,
// unless the lease $1 is held by $2 in term $3 and has not expired on the database's clock.
// FOR KEY SHARE keeps the row from changing hands until the transaction ends (a takeover
// locks it FOR UPDATE first, and so waits for the write to commit, after which the write
// is before the takeover), while renewals, which change no key, go on. A write runs it last,
// just before its COMMIT and in the same round trip, so the lease row is locked for no
// longer than the commit takes.
const fenceCheck = `SELECT 1 / count(*) FROM (SELECT 1 FROM ` + LeaseTable + `
	WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > statement_timestamp() FOR KEY SHARE) held`

// leaseHeld is fenceCheck without the lock, for the diagnosis of a failed write.
const leaseHeld = `SELECT count(*) FROM ` + LeaseTable + `
	WHERE name = $1 AND holder = $2 AND term = $3 AND expires_at > statement_timestamp()`

// sqlstateDivisionByZero is the SQLSTATE of fenceCheck's refusal (none of the store's other
// statements divides).
const sqlstateDivisionByZero = "22012"

// fenceDiagnosisTimeout bounds the lease read after a failed write.
const fenceDiagnosisTimeout = 5 * time.Second

// SetFence makes every later write check f (store.Fencer). f.Lease and f.Holder must be set.
func (s *Store) SetFence(f store.Fence) error {
	if f.Lease == "" || f.Holder == "" {
		return errors.New("store: set fence: Lease and Holder are required")
	}
	s.fence.Store(&f)
	return nil
}

// queue adds q to b.
func queue(b *pgx.Batch, q sqlstore.Query) { b.Queue(q.SQL, q.Args...) }

// queueFence adds the fence check to b.
func queueFence(b *pgx.Batch, f *store.Fence) { b.Queue(fenceCheck, f.Lease, f.Holder, f.Term) }

// exec runs qs as one write transaction in one round trip: the statements then, with a
// fence, its check, pipelined, in the implicit transaction that ends with the batch (an
// error of any of them rolls back all). It returns the rows each statement changed.
func (s *Store) exec(ctx context.Context, qs ...sqlstore.Query) ([]int64, error) {
	f := s.fence.Load()
	rows := make([]int64, len(qs))
	err := retry(func() error {
		if f == nil && len(qs) == 1 {
			tag, err := s.pool.Exec(ctx, qs[0].SQL, qs[0].Args...)
			rows[0] = tag.RowsAffected()
			return err
		}
		var b pgx.Batch
		for _, q := range qs {
			queue(&b, q)
		}
		if f != nil {
			queueFence(&b, f)
		}
		br := s.pool.SendBatch(ctx, &b)
		for i := range qs {
			tag, err := br.Exec()
			if err != nil {
				_ = br.Close()
				return err
			}
			rows[i] = tag.RowsAffected()
		}
		return br.Close() // the fence's answer, if any
	})
	return rows, s.fenced(ctx, f, err)
}

// writeTx is a write transaction of several round trips on one connection (tx): BEGIN goes
// to the server with its first statements, and the fence check with its COMMIT.
type writeTx struct {
	conn *pgxpool.Conn
	// begin is what starts the transaction, until it is sent.
	begin []sqlstore.Query
}

// SendBatch sends b's statements in the transaction (the first ones after BEGIN, in the
// same round trip); the results are b's alone.
func (t *writeTx) SendBatch(ctx context.Context, b *pgx.Batch) pgx.BatchResults {
	if t.begin == nil {
		return t.conn.SendBatch(ctx, b)
	}
	var all pgx.Batch
	for _, q := range t.begin {
		queue(&all, q)
	}
	all.QueuedQueries = append(all.QueuedQueries, b.QueuedQueries...)
	n := len(t.begin)
	t.begin = nil
	br := t.conn.SendBatch(ctx, &all)
	for range n {
		if _, err := br.Exec(); err != nil {
			break // every later result reports the error too
		}
	}
	return br
}

// Query runs one query in the transaction.
func (t *writeTx) Query(ctx context.Context, sql string, args ...any) (pgx.Rows, error) {
	if err := t.start(ctx); err != nil {
		return nil, err
	}
	return t.conn.Query(ctx, sql, args...)
}

// start sends BEGIN on its own when the transaction's first statement is not a batch.
func (t *writeTx) start(ctx context.Context) error {
	if t.begin == nil {
		return nil
	}
	return t.SendBatch(ctx, &pgx.Batch{}).Close()
}

// tx runs fn in a write transaction (writeTx) and commits it after the fence check, both in
// its last round trip. A transaction aborted for a serialization failure or a deadlock is
// run again (up to three times in all). With a fence, the transaction also bounds how long
// it may wait idle for this process (Fence.IdleTimeout), so that a process stopped in the
// middle of it (SIGSTOP, a frozen VM) does not hold its locks past a takeover.
func (s *Store) tx(ctx context.Context, fn func(t *writeTx) error) error {
	f := s.fence.Load()
	err := retry(func() error {
		conn, err := s.pool.Acquire(ctx)
		if err != nil {
			return err
		}
		// A connection left inside the transaction by an error is closed, not reused.
		defer conn.Release()
		t := &writeTx{conn: conn, begin: []sqlstore.Query{{SQL: "BEGIN"}}}
		if f != nil && f.IdleTimeout > 0 {
			ms := strconv.FormatInt(max(f.IdleTimeout.Milliseconds(), 1), 10)
			t.begin = append(t.begin, sqlstore.Query{
				SQL: `SELECT set_config('idle_in_transaction_session_timeout', $1, true)`, Args: []any{ms}})
		}
		if err := fn(t); err != nil {
			rollback(conn)
			return err
		}
		if err := t.start(ctx); err != nil {
			rollback(conn)
			return err
		}
		var b pgx.Batch
		if f != nil {
			queueFence(&b, f)
		}
		b.Queue("COMMIT")
		if err := conn.SendBatch(ctx, &b).Close(); err != nil {
			rollback(conn) // the fence failed: COMMIT was skipped
			return err
		}
		return nil
	})
	return s.fenced(ctx, f, err)
}

// rollback ends the transaction that conn is left in after an error, so that the pool can
// reuse it (Release closes a connection that is still inside one).
func rollback(conn *pgxpool.Conn) {
	if pc := conn.Conn().PgConn(); !pc.IsClosed() && pc.TxStatus() != 'I' {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_, _ = conn.Exec(ctx, "ROLLBACK")
	}
}

// retry runs fn again, up to three times in all, while it fails with a serialization failure
// or a deadlock, after which the whole transaction may be run again.
func retry(fn func() error) error {
	var err error
	for range 3 {
		var pe *pgconn.PgError
		if err = fn(); err == nil || !errors.As(err, &pe) || (pe.Code != "40001" && pe.Code != "40P01") {
			return err
		}
	}
	return err
}

// fenced returns the error of a write that checked f: store.ErrFenced when the fence refused
// it, or when it failed otherwise (its connection ended by the server, say) and the lease is
// no longer held; err as it is otherwise. A refusal is reported to f.Lost.
func (s *Store) fenced(ctx context.Context, f *store.Fence, err error) error {
	if err == nil || f == nil {
		return err
	}
	var pe *pgconn.PgError
	switch {
	case errors.As(err, &pe) && pe.Code == sqlstateDivisionByZero:
		err = fmt.Errorf("%w (lease %q, holder %s, term %d)", store.ErrFenced, f.Lease, f.Holder, f.Term)
	case ctx.Err() == nil && !s.holds(ctx, f):
		err = fmt.Errorf("%w (lease %q, holder %s, term %d); the write failed with: %w", store.ErrFenced, f.Lease, f.Holder, f.Term, err)
	default:
		return err
	}
	if f.Lost != nil {
		f.Lost(err)
	}
	return err
}

// holds reports whether f's lease is still held; true when that cannot be read.
func (s *Store) holds(ctx context.Context, f *store.Fence) bool {
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), fenceDiagnosisTimeout)
	defer cancel()
	var n int
	if err := s.pool.QueryRow(ctx, leaseHeld, f.Lease, f.Holder, f.Term).Scan(&n); err != nil {
		return true
	}
	return n > 0
}
