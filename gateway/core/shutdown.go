package core

import (
	"context"
	"log/slog"
	"sync"
)

// Shutdown, in order (gateway.Server.Close drives it):
//  1. Drain: new work is refused with Unavailable, queued work fails with Unavailable
//     "the server is shutting down", and long-polls answer at once with the operation as
//     it stands (Tinker's retrieve_future then says try_again), so no handler outlives
//     the grace period waiting for a result.
//  2. WaitIdle: running backend calls finish, up to the grace period.
//  3. Close: what still runs is cancelled, background goroutines end, usage is flushed.
//     Close is idempotent.

// errShuttingDown is the error of work refused or failed by a shutdown.
func errShuttingDown() error {
	return unavailable("the server is shutting down; resubmit once it is back (your work up to the last finished operation is kept)")
}

// busy counts work in progress (backend calls and the goroutines that run them) and says
// when there is none.
type busy struct {
	mu   sync.Mutex
	n    int
	idle chan struct{} // closed while n == 0
}

func newBusy() *busy {
	ch := make(chan struct{})
	close(ch)
	return &busy{idle: ch}
}

// Add counts one more piece of work in progress.
func (b *busy) Add() {
	b.mu.Lock()
	if b.n == 0 {
		b.idle = make(chan struct{})
	}
	b.n++
	b.mu.Unlock()
}

// Done counts one piece of work less.
func (b *busy) Done() {
	b.mu.Lock()
	b.n--
	if b.n == 0 {
		close(b.idle)
	}
	b.mu.Unlock()
}

// wait returns when nothing is in progress, or with ctx's error.
func (b *busy) wait(ctx context.Context) error {
	b.mu.Lock()
	ch := b.idle
	b.mu.Unlock()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// draining reports whether a shutdown has started.
func (c *Core) draining() bool { return c.stopping.Load() }

// Drain starts a shutdown: new work is refused, queued work fails, long-polls answer now.
// Work already running goes on (see WaitIdle). It is idempotent. It waits for the failures
// to be committed until ctx ends (a store that hangs cannot hold the shutdown).
func (c *Core) Drain(ctx context.Context) {
	c.drainOnce.Do(func() {
		// Refuse new work first (submissions check it under the run's lock, so none slips
		// past the sweep below), fail the queued work, then wake the long-polls, which
		// then see the queued operations failed.
		c.stopping.Store(true)
		c.life.Quiesce() // no lane, task or sampling goroutine starts from now on
		defer close(c.drain)
		for _, r := range c.runs.all() {
			for _, t := range r.DrainQueue() { // a rebuilding run's retry ends with its rebuild
				c.ops.finish(t.Op, nil, errShuttingDown())
			}
		}
		c.samplers.queue.close()
		// The failures above are committed and published before long-polls wake.
		if err := c.ops.flush(ctx); err != nil {
			c.log.Warn("the store did not take the drained operations' failures in time; long-polls answer now", slog.Any("err", err))
		}
	})
}

// WaitIdle waits until no backend call is running, or until ctx ends (the grace period).
func (c *Core) WaitIdle(ctx context.Context) error {
	if err := c.running.wait(ctx); err != nil {
		return err
	}
	return c.ops.flush(ctx) // and their outcomes are committed and published (package writebehind)
}
