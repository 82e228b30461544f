package core

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"connectrpc.com/connect"
	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/core/lane"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/internal/lockorder"
	"github.com/prometheus/client_golang/prometheus"
)

// Adapter slots. A backend holds at most max_adapters adapters (its capabilities). When
// more runs are live than that, the least recently used idle run's adapter is offloaded
// (its complete training state — weights, Adam moments and step, and any accumulated
// gradient — saved into a spill folder under <data-dir>/spill, then deleted from the
// backend) and restored from that folder before its next task, so the run continues
// bit-identically. A run is pinned while one of its tasks is taken (from the lane round
// until taskDone), and a pinned run is never offloaded. A backend that cannot save
// gradients (saves_gradients false) only has runs without pending gradients offloaded.
// When every slot is pinned, the run waits and is made ready again when a slot is unpinned.
//
// Moving an adapter (restoring it, or offloading another to make room) calls the backend
// and the file system, so the lane never does it on its own goroutine: admit only decides
// (pinned now, errMoveNeeded, or errNoSlot), and move runs on a goroutine of its own while
// the run is held busy, then reserves the pin for the run's next admit. An adapter being
// offloaded still holds its slot (the backend still has it) until DeleteAdapter returns.

// spillFolder is where offloaded adapters are kept, under the data dir.
const spillFolder = "spill"

// slotRun is a run's place in the slot table.
type slotRun struct {
	elem  *list.Element // in lru while resident
	pins  int
	grads bool // gradients accumulated since the last optim_step or load
	// reserved: move pinned the run for its next admit (which then takes that pin).
	reserved bool
	// offloading: another run's move is saving this run's adapter off the backend; the
	// run waits (parked) until that is done.
	offloading bool
	spill      string // the folder holding the offloaded state; "" while resident or never created
}

// slots tracks which runs' adapters are on the backend.
type slots struct {
	slotDeps
	capacity  int // 0: unlimited
	gradients bool
	dir       string

	mu      lockorder.Mutex[rankSlots]
	runs    map[*run]*slotRun
	lru     *list.List // resident runs, most recently used at the front
	waiting []*run     // runs that found every slot pinned
	// offloads counts adapters being offloaded: still on the backend, so still in a slot.
	offloads int
}

// slotDeps is what the slot table uses of the rest of the core.
type slotDeps struct {
	trainer backends.Trainer
	log     *slog.Logger
	moves   *prometheus.CounterVec // by "offload" and "restore"
	scrub   func(error) error      // hides the server's paths in an error for the client
	// lost turns a backend error on a run's adapter into the client's (Core.adapterLost).
	lost func(*run, error) error
}

// newSlots returns the slot table of a backend holding capacity adapters (0: unlimited)
// that can save gradients or not, spilling into dataDir/spill.
func newSlots(dataDir string, capacity int, gradients bool, deps slotDeps) (*slots, error) {
	dir := filepath.Join(dataDir, spillFolder)
	// Adapters do not survive a restart, so neither does what was offloaded.
	if err := os.RemoveAll(dir); err != nil {
		return nil, fmt.Errorf("core: clearing %s: %w", dir, err)
	}
	return &slots{slotDeps: deps, capacity: max(capacity, 0), gradients: gradients, dir: dir, runs: map[*run]*slotRun{}, lru: list.New()}, nil
}

func (s *slots) entry(r *run) *slotRun {
	e, ok := s.runs[r]
	if !ok {
		e = &slotRun{}
		s.runs[r] = e
	}
	return e
}

// fullLocked reports whether every slot holds an adapter (resident, or being offloaded).
func (s *slots) fullLocked() bool {
	return s.capacity > 0 && s.lru.Len()+s.offloads >= s.capacity
}

// errNoSlot and errMoveNeeded are the lane's (lane.ErrNoSlot, lane.ErrMoveNeeded).
var (
	errNoSlot     = lane.ErrNoSlot
	errMoveNeeded = lane.ErrMoveNeeded
)

// Admit pins r's adapter if it is resident, or if a slot is free and there is nothing to
// restore, or if move reserved a pin for it. Otherwise it answers errMoveNeeded (then call
// move, off the lane's goroutine), or errNoSlot when every slot is pinned (then park r).
// It does no I/O. Called from a lane's goroutine, never with a run's lock held.
func (s *slots) Admit(_ context.Context, r *run) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entry(r)
	switch {
	case e.offloading:
		return errNoSlot
	case e.reserved:
		e.reserved = false // move took the pin
		return nil
	case e.elem != nil: // resident
		s.lru.MoveToFront(e.elem)
		e.pins++
		return nil
	case e.spill == "" && !s.fullLocked():
		e.elem = s.lru.PushFront(r)
		e.pins++
		return nil
	case s.fullLocked() && s.victimLocked() == nil:
		return errNoSlot
	default:
		return errMoveNeeded
	}
}

// Move makes r's adapter resident (restoring it if it was offloaded, offloading the least
// recently used idle run if the backend is full) and reserves a pin for r's next admit.
// It returns errNoSlot when every slot is pinned meanwhile. It calls the backend and the
// file system: the lane runs it on a goroutine of its own while r is held busy.
func (s *slots) Move(ctx context.Context, r *run) error {
	if err := s.place(ctx, r); err != nil {
		return err
	}
	s.mu.Lock()
	s.entry(r).reserved = true
	s.mu.Unlock()
	return nil
}

// Keep reserves the pin admit took for r's next admit: r's head did not run (its adapter
// was rebuilt first), and the pin stays until the task that does run is done.
func (s *slots) Keep(r *run) {
	s.mu.Lock()
	s.entry(r).reserved = true
	s.mu.Unlock()
}

// place makes r's adapter resident and pins it (move's work).
func (s *slots) place(ctx context.Context, r *run) error {
	for {
		s.mu.Lock()
		e := s.entry(r)
		if e.elem != nil { // resident
			s.lru.MoveToFront(e.elem)
			e.pins++
			s.mu.Unlock()
			return nil
		}
		if !s.fullLocked() {
			e.elem = s.lru.PushFront(r)
			e.pins++
			spill := e.spill
			s.mu.Unlock()
			if spill == "" {
				return nil
			}
			if err := s.restore(ctx, r, spill); err != nil {
				s.mu.Lock()
				e.pins--
				s.lru.Remove(e.elem)
				e.elem = nil
				s.mu.Unlock()
				return err
			}
			s.mu.Lock()
			e.spill = ""
			s.mu.Unlock()
			return nil
		}
		victim := s.victimLocked()
		if victim == nil {
			s.mu.Unlock()
			return errNoSlot
		}
		ve := s.runs[victim]
		s.lru.Remove(ve.elem)
		ve.elem = nil
		ve.pins++ // nothing else may take or offload it while its state moves
		ve.offloading = true
		s.offloads++
		s.mu.Unlock()
		err := s.offload(ctx, victim)
		s.mu.Lock()
		ve.pins--
		ve.offloading = false
		s.offloads--
		if err != nil {
			ve.elem = s.lru.PushBack(victim) // still resident
		}
		waiting := s.takeWaitingLocked() // the victim may be among them
		s.mu.Unlock()
		kickAll(waiting)
		if err != nil { // the victim's error is its own: it may belong to another workspace
			s.log.Warn("offloading an adapter to free a slot failed", slog.String("victim", victim.ID()), slog.String("for", r.ID()), slog.Any("err", err))
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("training run %s waited for an adapter slot on the backend, and freeing one failed; retry", r.ID()))
		}
	}
}

// victimLocked picks the least recently used resident run that may be offloaded.
func (s *slots) victimLocked() *run {
	for el := s.lru.Back(); el != nil; el = el.Prev() {
		v := el.Value.(*run)
		e := s.runs[v]
		if e.pins == 0 && (s.gradients || !e.grads) {
			return v
		}
	}
	return nil
}

// offload saves a run's complete training state into its spill folder and frees its slot
// on the backend.
func (s *slots) offload(ctx context.Context, r *run) error {
	dir := filepath.Join(s.dir, r.ID())
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(s.dir, 0o755); err != nil {
		return internal("creating the adapter spill folder", s.scrub(err))
	}
	t := s.trainer
	if _, err := t.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: r.ID(), Dir: dir, IncludeOptimizer: true, IncludeGradients: s.gradients}); err != nil {
		_ = os.RemoveAll(dir)
		return s.lost(r, err)
	}
	if _, err := t.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.ID()}); err != nil {
		_ = os.RemoveAll(dir)
		return s.lost(r, err)
	}
	s.mu.Lock()
	s.entry(r).spill = dir
	s.mu.Unlock()
	s.moves.WithLabelValues("offload").Inc()
	s.log.Debug("offloaded an adapter", slog.String("run", r.ID()))
	return nil
}

// restore loads an offloaded run's state back onto the backend.
func (s *slots) restore(ctx context.Context, r *run, dir string) error {
	if _, err := s.trainer.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: r.ID(), Dir: dir, LoadOptimizer: true, LoadGradients: s.gradients}); err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("restoring training run %s's offloaded adapter failed (%s); retry, or load its last checkpoint", r.ID(), connectMessage(err)))
	}
	_ = os.RemoveAll(dir)
	s.moves.WithLabelValues("restore").Inc()
	return nil
}

// Park registers a run that admit refused with errNoSlot (and that is no longer in a
// lane's ready list) to be made ready when a slot is unpinned; if one freed meanwhile, the
// run is made ready at once, so no wake-up is lost.
func (s *slots) Park(r *run) {
	s.mu.Lock()
	if s.entry(r).offloading || (s.fullLocked() && s.victimLocked() == nil) {
		s.waiting = append(s.waiting, r)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	r.Wake()
}

// unpin releases a run taken by admit, and makes the runs waiting for a slot ready again.
func (s *slots) unpin(r *run) {
	s.mu.Lock()
	if e, ok := s.runs[r]; ok && e.pins > 0 {
		e.pins--
	}
	waiting := s.takeWaitingLocked()
	s.mu.Unlock()
	kickAll(waiting)
}

// takeWaitingLocked empties the list of runs waiting for a slot; s.mu must be held.
func (s *slots) takeWaitingLocked() []*run {
	w := s.waiting
	s.waiting = nil
	return w
}

// kickAll makes runs that waited for a slot try again.
func kickAll(rs []*run) {
	for _, r := range rs {
		r.Wake()
	}
}

// setGrads records whether the run has gradients that no optim_step has applied yet.
func (s *slots) setGrads(r *run, pending bool) {
	s.mu.Lock()
	s.entry(r).grads = pending
	s.mu.Unlock()
}

// parked reports whether r waits for an adapter slot (every slot pinned), and the slots.
func (s *slots) parked(r *run) (bool, int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.waiting, r), s.capacity
}

// forget drops a run whose adapter was freed (unloaded): its slot and any spill folder.
func (s *slots) forget(r *run) {
	s.mu.Lock()
	e, ok := s.runs[r]
	if ok {
		if e.elem != nil {
			s.lru.Remove(e.elem)
		}
		delete(s.runs, r)
	}
	s.mu.Unlock()
	if ok && e.spill != "" {
		_ = os.RemoveAll(e.spill)
	}
}
