package postgres_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/lease"
	"github.com/loops-dev/loops/gateway/lease/pglease"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/postgres/pgtest"
	"github.com/loops-dev/loops/gateway/store/storetest"
)

// takeLease returns a storetest.TakeLease on the lease table of the database at url: each
// call releases the current holder's term (as if it lapsed) and takes the lease for the
// next holder, through the lease's own store.
func takeLease(t *testing.T, url string) storetest.TakeLease {
	ls, err := pglease.Open(t.Context(), url, 0)
	require.NoError(t, err)
	t.Cleanup(ls.Close)
	var holder string
	var term int64
	return func(t *testing.T, next string) store.Fence {
		ctx := t.Context()
		if holder != "" {
			require.NoError(t, ls.Release(ctx, lease.DefaultName, holder, term))
		}
		rec, ok, err := ls.TryAcquire(ctx, lease.DefaultName, next, "http://"+next, time.Minute)
		require.NoError(t, err)
		require.True(t, ok)
		holder, term = next, rec.Term
		return store.Fence{Lease: lease.DefaultName, Holder: next, Term: rec.Term}
	}
}

// TestFencing: once another gateway has taken the lease, every write of the old holder's
// store is refused with store.ErrFenced and changes nothing (storetest.RunFencing).
func TestFencing(t *testing.T) {
	url := pgtest.Start(t).NewSchema(t)
	storetest.RunFencing(t, func(t *testing.T, _ string) store.Store {
		s, err := postgres.Open(t.Context(), url, postgres.Options{})
		require.NoError(t, err)
		return s
	}, takeLease(t, url))
}
