package lockorder_test

import (
	"sync"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/internal/lockorder"
)

type outer struct{}

func (outer) Rank() (int, string) { return 1, "outer" }

type inner struct{}

func (inner) Rank() (int, string) { return 2, "inner" }

// TestOrder: taking locks in rank order passes; against it panics when checks are on, and
// a mutex works as a sync.Mutex either way (a sync.Cond can use it).
func TestOrder(t *testing.T) {
	var a lockorder.Mutex[outer]
	var b lockorder.Mutex[inner]
	a.Lock()
	b.Lock()
	b.Unlock()
	a.Unlock()

	b.Lock()
	if lockorder.Enabled() {
		require.PanicsWithValue(t, "lockorder: outer (rank 1) taken while holding inner (rank 2): the lock order says outer comes first", func() { a.Lock() })
	}
	b.Unlock()

	var b2 lockorder.Mutex[inner]
	b.Lock()
	if lockorder.Enabled() {
		require.Panics(t, func() { b2.Lock() }, "two locks of one rank at once")
	}
	b.Unlock()

	require.True(t, a.TryLock())
	require.False(t, a.TryLock())
	a.Unlock()

	// Other goroutines hold their own locks.
	a.Lock()
	var wg sync.WaitGroup
	wg.Go(func() {
		b.Lock()
		b.Unlock()
	})
	wg.Wait()
	a.Unlock()

	cond := sync.NewCond(&a)
	done := false
	a.Lock()
	go func() {
		a.Lock()
		done = true
		cond.Broadcast()
		a.Unlock()
	}()
	for !done {
		cond.Wait()
	}
	a.Unlock()
}
