package postgres

import (
	"context"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/internal/sqlstore"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// fencedStore opens a store on a fresh schema whose lease table (the columns the fence
// reads, as package lease/pglease keeps them) says holder A holds term 1 for an hour, and
// fences it with that term; conn is a connection of its own to the same schema.
func fencedStore(t *testing.T, idle time.Duration) (s *Store, conn *pgx.Conn) {
	t.Helper()
	ctx := t.Context()
	url := pgtest.Start(t).NewSchema(t)
	s, err := Open(ctx, url, Options{})
	require.NoError(t, err)
	t.Cleanup(func() { require.NoError(t, s.Close()) })
	conn, err = pgx.Connect(ctx, url)
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(context.Background()) })
	_, err = conn.Exec(ctx, `CREATE TABLE `+LeaseTable+` (name text PRIMARY KEY, holder text NOT NULL,
		term bigint NOT NULL, expires_at timestamptz NOT NULL)`)
	require.NoError(t, err)
	_, err = conn.Exec(ctx, `INSERT INTO `+LeaseTable+` VALUES ('gateway', 'A', 1, now() + interval '1 hour')`)
	require.NoError(t, err)
	require.NoError(t, s.SetFence(store.Fence{Lease: "gateway", Holder: "A", Term: 1, IdleTimeout: idle}))
	return s, conn
}

// takeOver moves the lease to holder B in term 2 as a takeover does: it locks the row FOR
// UPDATE first. It fails t unless that is done within d.
func takeOver(t *testing.T, conn *pgx.Conn, d time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(t.Context(), d)
	defer cancel()
	require.NoError(t, pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
		if _, err := tx.Exec(ctx, `SELECT 1 FROM `+LeaseTable+` WHERE name = 'gateway' FOR UPDATE`); err != nil {
			return err
		}
		_, err := tx.Exec(ctx, `UPDATE `+LeaseTable+` SET holder = 'B', term = 2 WHERE name = 'gateway'`)
		return err
	}), "the takeover waited for the old holder's write")
}

// TestFenceAtCommit: a write transaction holds no lock on the lease while its process works
// between round trips, so a takeover meanwhile does not wait for it; its COMMIT then finds
// the lease taken and nothing it wrote stays.
func TestFenceAtCommit(t *testing.T) {
	s, conn := fencedStore(t, 0)
	ctx := t.Context()
	err := s.tx(ctx, func(tx *writeTx) error {
		var b pgx.Batch
		w, err := sqlstore.PutSession("ws", &loopsv1.Session{Id: "s-old"})
		require.NoError(t, err)
		b.Queue(w.SQL, w.Args...)
		if err := tx.SendBatch(ctx, &b).Close(); err != nil {
			return err
		}
		takeOver(t, conn, 5*time.Second) // while this transaction is open
		return nil
	})
	require.ErrorIs(t, err, store.ErrFenced)
	_, err = s.GetSession(ctx, "ws", "s-old")
	require.ErrorIs(t, err, store.ErrNotFound, "the refused transaction's write was rolled back")
}

// TestFenceLockModes: the fence's lock (held from the check to the COMMIT) lets renewals of
// the lease through and makes a takeover wait.
func TestFenceLockModes(t *testing.T) {
	s, conn := fencedStore(t, 0)
	ctx := t.Context()
	tx, err := s.pool.Begin(ctx)
	require.NoError(t, err)
	defer func() { _ = tx.Rollback(context.Background()) }()
	_, err = tx.Exec(ctx, fenceCheck, "gateway", "A", int64(1))
	require.NoError(t, err)

	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	_, err = conn.Exec(rctx, `UPDATE `+LeaseTable+` SET expires_at = now() + interval '2 hours' WHERE name = 'gateway' AND term = 1`)
	require.NoError(t, err, "a renewal does not wait for a write being committed")

	took := make(chan time.Time, 1)
	go func() {
		takeOver(t, conn, 10*time.Second)
		took <- time.Now()
	}()
	time.Sleep(300 * time.Millisecond)
	committed := time.Now()
	require.NoError(t, tx.Commit(ctx))
	require.True(t, (<-took).After(committed), "the takeover waited for the write's commit")
}

// TestFenceIdleTimeout: a write transaction whose process stops between two round trips
// (here: sleeps) is ended by the server after the fence's IdleTimeout, releasing the rows it
// locked; the write fails.
func TestFenceIdleTimeout(t *testing.T) {
	s, conn := fencedStore(t, 200*time.Millisecond)
	ctx := t.Context()
	w, err := sqlstore.PutSession("ws", &loopsv1.Session{Id: "s1"})
	require.NoError(t, err)
	_, err = s.exec(ctx, sqlstore.Query{SQL: w.SQL, Args: w.Args})
	require.NoError(t, err)
	done, woke := make(chan error, 1), make(chan struct{})
	go func() {
		done <- s.tx(ctx, func(tx *writeTx) error {
			var b pgx.Batch
			b.Queue(`UPDATE sessions SET create_time = 1 WHERE id = 's1'`)
			if err := tx.SendBatch(ctx, &b).Close(); err != nil {
				return err
			}
			time.Sleep(2 * time.Second) // stopped, holding the row
			close(woke)
			return nil
		})
	}()
	time.Sleep(100 * time.Millisecond)
	uctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	_, err = conn.Exec(uctx, `UPDATE sessions SET create_time = 2 WHERE id = 's1'`)
	require.NoError(t, err)
	select {
	case <-woke:
		t.Fatal("the row was locked until the transaction's process woke")
	default: // the server ended the idle transaction first
	}
	err = <-done
	require.Error(t, err)
	require.NotErrorIs(t, err, store.ErrFenced, "the lease is still held: the write failed for another reason")
}
