package lockorder

import "sync"

// Rank places a mutex in its package's lock order. Implement it on an empty struct type, one
// per lock: Rank returns the lock's position (a goroutine holding rank n may take only
// ranks above n) and a name for reports.
type Rank interface {
	Rank() (n int, name string)
}

// Mutex is a sync.Mutex of rank R. The zero value is an unlocked mutex.
type Mutex[R Rank] struct {
	mu sync.Mutex
}

// Lock takes the mutex; with the lockorder build tag it first checks the order.
func (m *Mutex[R]) Lock() {
	if enabled {
		var r R
		n, name := r.Rank()
		acquire(m, n, name)
	}
	m.mu.Lock()
}

// TryLock takes the mutex if it is free and reports whether it did.
func (m *Mutex[R]) TryLock() bool {
	if !m.mu.TryLock() {
		return false
	}
	if enabled {
		var r R
		n, name := r.Rank()
		acquire(m, n, name)
	}
	return true
}

// Unlock releases the mutex.
func (m *Mutex[R]) Unlock() {
	if enabled {
		release(m)
	}
	m.mu.Unlock()
}
