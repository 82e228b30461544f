package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"
	"sync"
)

// ErrStopping refuses a goroutine started after Quiesce.
var ErrStopping = errors.New("shutting down: no new work is started")

// Stopper owns a set of goroutines. The zero value is not usable: use New.
type Stopper struct {
	ctx    context.Context
	cancel context.CancelFunc

	mu        sync.Mutex
	quiescing bool
	running   map[string]int // goroutines running, by name
	idle      chan struct{}  // closed while none runs
}

// New returns a Stopper whose goroutines' context derives from parent (its values, not its
// cancellation: only Stop cancels it).
func New(parent context.Context) *Stopper {
	ctx, cancel := context.WithCancel(context.WithoutCancel(parent))
	idle := make(chan struct{})
	close(idle)
	return &Stopper{ctx: ctx, cancel: cancel, running: map[string]int{}, idle: idle}
}

// Context is the context of the Stopper's goroutines: cancelled by Stop.
func (s *Stopper) Context() context.Context { return s.ctx }

// Go runs f on a goroutine of its own, counted under name until it returns, with the
// Stopper's context. After Quiesce it runs nothing and returns ErrStopping.
func (s *Stopper) Go(name string, f func(ctx context.Context)) error {
	if err := s.enter(name); err != nil {
		return err
	}
	go func() {
		defer s.leave(name)
		f(s.ctx)
	}()
	return nil
}

// Run runs f on the calling goroutine, counted like a goroutine of Go (work that Stop must
// wait for, such as a request's backend call); after Quiesce it returns ErrStopping.
func (s *Stopper) Run(name string, f func(ctx context.Context)) error {
	if err := s.enter(name); err != nil {
		return err
	}
	defer s.leave(name)
	f(s.ctx)
	return nil
}

func (s *Stopper) enter(name string) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.quiescing {
		return ErrStopping
	}
	if len(s.running) == 0 {
		s.idle = make(chan struct{})
	}
	s.running[name]++
	return nil
}

func (s *Stopper) leave(name string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.running[name]--; s.running[name] <= 0 {
		delete(s.running, name)
	}
	if len(s.running) == 0 {
		close(s.idle)
	}
}

// Quiesce refuses new goroutines from now on. Those running go on.
func (s *Stopper) Quiesce() {
	s.mu.Lock()
	s.quiescing = true
	s.mu.Unlock()
}

// Quiescing reports whether Quiesce (or Stop) was called.
func (s *Stopper) Quiescing() bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.quiescing
}

// Running reports the goroutines running now, by name.
func (s *Stopper) Running() map[string]int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return maps.Clone(s.running)
}

// Wait waits until no goroutine runs, or returns a *StillRunningError when ctx ends first.
// It neither quiesces nor cancels.
func (s *Stopper) Wait(ctx context.Context) error {
	s.mu.Lock()
	idle := s.idle
	s.mu.Unlock()
	select {
	case <-idle:
		return nil
	case <-ctx.Done():
		return &StillRunningError{Running: s.Running(), Err: ctx.Err()}
	}
}

// Stop quiesces, cancels the goroutines' context and waits for them until ctx ends; then it
// returns a *StillRunningError naming those still running. Stop may be called again.
func (s *Stopper) Stop(ctx context.Context) error {
	s.Quiesce()
	s.cancel()
	return s.Wait(ctx)
}

// StillRunningError says which goroutines a stop left running.
type StillRunningError struct {
	Running map[string]int
	Err     error
}

func (e *StillRunningError) Error() string {
	var parts []string
	for _, name := range slices.Sorted(maps.Keys(e.Running)) {
		parts = append(parts, fmt.Sprintf("%s ×%d", name, e.Running[name]))
	}
	return fmt.Sprintf("%v with goroutines still running: %s", e.Err, strings.Join(parts, ", "))
}

func (e *StillRunningError) Unwrap() error { return e.Err }
