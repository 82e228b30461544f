package bounded

import (
	"container/list"
	"context"
	"fmt"
	"runtime"
	"sync"
	"sync/atomic"
	"time"
)

// Budget bounds the memory of request bodies being decompressed, or held decompressed,
// across a server at once. A body reserves what its decompression will allocate before
// anything is allocated, and the reservation lasts until that memory is really free: until
// the garbage collector has reclaimed the buffer (see Hold.ReleaseWhenCollected), not merely
// until the request is done with it, since garbage still takes memory until the next
// collection. A waiter that is kept out by such reservations triggers that collection.
// Reservations are granted first come, first served, so a large body is not starved by a
// stream of small ones; a reservation larger than the whole budget waits for all of it. A
// nil *Budget grants everything at once.
type Budget struct {
	size    int64
	maxWait time.Duration

	mu          sync.Mutex
	used        int64
	collectable int64     // reserved bytes released once the GC reclaims their buffer
	waiters     list.List // of *budgetWaiter, oldest first
	collecting  atomic.Bool
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

// Hold is a granted reservation. Exactly one of Release and ReleaseWhenCollected ends it;
// Shrink may come before. A nil *Hold (from a nil Budget) does nothing.
type Hold struct {
	b    *Budget
	n    int64
	done bool
}

// Acquire reserves n bytes, waiting while others hold the budget until ctx ends or the
// budget's wait passes; then it returns an error wrapping ErrBusy.
func (b *Budget) Acquire(ctx context.Context, n int64) (*Hold, error) {
	if b == nil {
		return nil, nil
	}
	n = min(max(n, 0), b.size)
	b.mu.Lock()
	if b.waiters.Len() == 0 && b.size-b.used >= n {
		b.used += n
		b.mu.Unlock()
		return &Hold{b: b, n: n}, nil
	}
	w := &budgetWaiter{n: n, ready: make(chan struct{})}
	elem := b.waiters.PushBack(w)
	b.mu.Unlock()

	deadline := time.NewTimer(b.maxWait)
	defer deadline.Stop()
	// Reservations waiting for the GC are freed by a collection; trigger one now and again
	// (backing off) while this waiter waits, since more may become garbage meanwhile.
	backoff := 5 * time.Millisecond
	retry := time.NewTimer(0)
	defer retry.Stop()
	var cause error
wait:
	for {
		select {
		case <-w.ready:
			return &Hold{b: b, n: n}, nil
		case <-ctx.Done():
			cause = context.Cause(ctx)
			break wait
		case <-deadline.C:
			cause = fmt.Errorf("waited %s", b.maxWait)
			break wait
		case <-retry.C:
			b.collect()
			retry.Reset(backoff)
			backoff = min(2*backoff, 200*time.Millisecond)
		}
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	select {
	case <-w.ready:
		// Granted while giving up: keep it.
		return &Hold{b: b, n: n}, nil
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

// collect runs a garbage collection in the background, unless one is running, when some
// reservation waits for one.
func (b *Budget) collect() {
	b.mu.Lock()
	pending := b.collectable > 0
	b.mu.Unlock()
	if pending && b.collecting.CompareAndSwap(false, true) {
		go func() {
			defer b.collecting.Store(false)
			runtime.GC()
		}()
	}
}

// Release returns the reservation now: its memory was never allocated or is gone.
func (h *Hold) Release() {
	if h == nil || h.done {
		return
	}
	h.done = true
	h.b.release(h.n, false)
}

// Shrink returns the part of the reservation above n, when less was allocated than reserved.
func (h *Hold) Shrink(n int64) {
	if h == nil || h.done || n >= h.n {
		return
	}
	h.b.release(h.n-max(n, 0), false)
	h.n = max(n, 0)
}

// ReleaseWhenCollected returns the reservation once the allocation that ptr points into
// (the body's buffer) has been garbage collected. ptr's allocation must not be pooled or
// otherwise kept for reuse, or the reservation would last as long.
func (h *Hold) ReleaseWhenCollected(ptr *byte) {
	if h == nil || h.done {
		return
	}
	h.done = true
	b := h.b
	b.mu.Lock()
	b.collectable += h.n
	b.mu.Unlock()
	runtime.AddCleanup(ptr, func(n int64) { b.release(n, true) }, h.n)
}

func (b *Budget) release(n int64, collected bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.used -= n
	if collected {
		b.collectable -= n
	}
	b.grant()
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
