package bounded

import (
	"container/list"
	"context"
	"fmt"
	"sync"
	"time"
)

// Budget bounds the bytes of request bodies being decompressed, and held decompressed,
// across a server at once. A body reserves its decompressed size (plus the decoder's working
// memory) before anything is allocated and releases it when the request is done with it.
// Reservations are granted first come, first served, so a large body is not starved by a
// stream of small ones; a reservation larger than the whole budget waits for all of it. A
// nil *Budget grants everything at once.
type Budget struct {
	size    int64
	maxWait time.Duration

	mu      sync.Mutex
	used    int64
	waiters list.List // of *budgetWaiter, oldest first
}

type budgetWaiter struct {
	n     int64
	ready chan struct{} // closed once the reservation is granted
}

// NewBudget returns a budget of size bytes whose reservations wait at most maxWait.
func NewBudget(size int64, maxWait time.Duration) *Budget {
	return &Budget{size: max(size, 1), maxWait: maxWait}
}

// Size is the budget's capacity in bytes.
func (b *Budget) Size() int64 { return b.size }

// InUse is the number of bytes reserved now.
func (b *Budget) InUse() int64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.used
}

// Acquire reserves n bytes, waiting while others hold the budget until ctx ends or the
// budget's wait passes; then it returns an error wrapping ErrBusy. Call release (once) when
// the reserved memory is no longer held.
func (b *Budget) Acquire(ctx context.Context, n int64) (release func(), err error) {
	if b == nil || n <= 0 {
		return func() {}, nil
	}
	n = min(n, b.size)
	b.mu.Lock()
	if b.waiters.Len() == 0 && b.size-b.used >= n {
		b.used += n
		b.mu.Unlock()
		return b.releaser(n), nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	elem := b.waiters.PushBack(w)
	b.mu.Unlock()

	timer := time.NewTimer(b.maxWait)
	defer timer.Stop()
	var cause error
	select {
	case <-w.ready:
		return b.releaser(n), nil
	case <-ctx.Done():
		cause = context.Cause(ctx)
	case <-timer.C:
		cause = fmt.Errorf("waited %s", b.maxWait)
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready:
		// Granted while giving up: keep it.
		return b.releaser(n), nil
	default:
	}
	front := b.waiters.Front() == elem
	b.waiters.Remove(elem)
	if front {
		// The waiters behind this one may fit now.
		b.grant()
	}
	return nil, fmt.Errorf("%w (%d bytes wanted, %d of %d in use: %v)", ErrBusy, n, b.used, b.size, cause)
}

func (b *Budget) releaser(n int64) func() {
	var once sync.Once
	return func() {
		once.Do(func() {
			b.mu.Lock()
			b.used -= n
			b.grant()
			b.mu.Unlock()
		})
	}
}

// grant hands the budget to waiters in order while they fit. b.mu is held.
func (b *Budget) grant() {
	for e := b.waiters.Front(); e != nil; e = b.waiters.Front() {
		w := e.Value.(*budgetWaiter)
		if b.size-b.used < w.n {
			return
		}
		b.used += w.n
		b.waiters.Remove(e)
		close(w.ready)
	}
}
