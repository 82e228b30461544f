package adapterslots

import (
	"container/list"
	"context"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"slices"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/loops-dev/loops/gateway/core/lane"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/lockorder"
)

// RankTable places Table.mu in the core's lock order (gateway/core/doc.go): after the
// sampling queue's lock, before the lane's; nothing is taken under it.
type RankTable struct{}

// Rank places Table.mu in the core's lock order.
func (RankTable) Rank() (int, string) { return 500, "adapterslots.Table.mu" }

// Run is what a Table needs of a training run: its id, which is its adapter's id on the
// backend, and Wake, which makes it try again after it waited for a slot (called with no
// lock of the Table held).
type Run interface {
	comparable
	ID() string
	Wake()
}

// Adapters is the part of the backend's trainer a Table calls to move adapters
// (backends.Trainer has it).
type Adapters interface {
	SaveAdapter(context.Context, *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error)
	DeleteAdapter(context.Context, *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error)
	LoadAdapter(context.Context, *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error)
}

// Config configures a Table.
type Config[R Run] struct {
	// Dir is the spill folder offloaded adapters are saved into, one folder per run. New
	// empties it: adapters do not survive a restart, so neither does what was offloaded.
	Dir string
	// Capacity is how many adapters the backend holds (0 or less: unlimited).
	Capacity int
	// Gradients is true when the backend saves and loads accumulated gradients; otherwise
	// only runs without pending gradients are offloaded.
	Gradients bool
	// Adapters moves adapters on and off the backend.
	Adapters Adapters
	// Log receives the Table's reports (a failed offload); nil: slog.Default().
	Log *slog.Logger
	// Offloaded and Restored count the adapters moved off and back onto the backend (nil:
	// not counted).
	Offloaded, Restored prometheus.Counter
	// Scrub hides the server's paths in an error for the client (nil: none).
	Scrub func(error) error
	// Lost turns a backend error on a run's adapter into the client's error (nil: the
	// error as it is).
	Lost func(R, error) error
}

// entry is a run's place in the slot table.
type entry struct {
	elem  *list.Element // in lru while resident
	pins  int
	grads bool // gradients accumulated since the last optim_step or load
	// reserved: Move pinned the run for its next Admit (which then takes that pin).
	reserved bool
	// offloading: another run's Move is saving this run's adapter off the backend; the
	// run waits (parked) until that is done.
	offloading bool
	spill      string // the folder holding the offloaded state; "" while resident or never created
}

// Table tracks which runs' adapters are on the backend. Its methods are safe for concurrent
// use.
type Table[R Run] struct {
	cfg Config[R]

	mu      lockorder.Mutex[RankTable]
	runs    map[R]*entry
	lru     *list.List // resident runs, most recently used at the front
	waiting []R        // runs that found every slot pinned
	// offloads counts adapters being offloaded: still on the backend, so still in a slot.
	offloads int
}

// New returns the slot table of cfg's backend, with cfg.Dir emptied.
func New[R Run](cfg Config[R]) (*Table[R], error) {
	if err := os.RemoveAll(cfg.Dir); err != nil {
		return nil, fmt.Errorf("core: clearing %s: %w", cfg.Dir, err)
	}
	cfg.Capacity = max(cfg.Capacity, 0)
	if cfg.Log == nil {
		cfg.Log = slog.Default()
	}
	if cfg.Scrub == nil {
		cfg.Scrub = func(err error) error { return err }
	}
	if cfg.Lost == nil {
		cfg.Lost = func(_ R, err error) error { return err }
	}
	return &Table[R]{cfg: cfg, runs: map[R]*entry{}, lru: list.New()}, nil
}

func (s *Table[R]) entry(r R) *entry {
	e, ok := s.runs[r]
	if !ok {
		e = &entry{}
		s.runs[r] = e
	}
	return e
}

// fullLocked reports whether every slot holds an adapter (resident, or being offloaded).
func (s *Table[R]) fullLocked() bool {
	return s.cfg.Capacity > 0 && s.lru.Len()+s.offloads >= s.cfg.Capacity
}

// Admit pins r's adapter if it is resident, or if a slot is free and there is nothing to
// restore, or if Move reserved a pin for it. Otherwise it answers lane.ErrMoveNeeded (then
// call Move, off the scheduler's goroutine), or lane.ErrNoSlot when every slot is pinned
// (then Park r). It does no I/O.
func (s *Table[R]) Admit(_ context.Context, r R) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	e := s.entry(r)
	switch {
	case e.offloading:
		return lane.ErrNoSlot
	case e.reserved:
		e.reserved = false // Move took the pin
		return nil
	case e.elem != nil: // resident
		s.lru.MoveToFront(e.elem)
		e.pins++
		return nil
	case e.spill == "" && !s.fullLocked():
		e.elem = s.lru.PushFront(r)
		e.pins++
		return nil
	case s.allPinnedLocked():
		return lane.ErrNoSlot
	default:
		return lane.ErrMoveNeeded
	}
}

// Move makes r's adapter resident (restoring it if it was offloaded, offloading the least
// recently used idle run if the backend is full) and reserves a pin for r's next Admit.
// It returns lane.ErrNoSlot when every slot is pinned meanwhile. It calls the backend and
// the file system: run it off the scheduler's goroutine, with r held busy.
func (s *Table[R]) Move(ctx context.Context, r R) error {
	if err := s.place(ctx, r); err != nil {
		return err
	}
	s.mu.Lock()
	s.entry(r).reserved = true
	s.mu.Unlock()
	return nil
}

// Keep reserves the pin Admit took for r's next Admit: r's head did not run (its adapter
// was rebuilt first), and the pin stays until the task that does run is done.
func (s *Table[R]) Keep(r R) {
	s.mu.Lock()
	s.entry(r).reserved = true
	s.mu.Unlock()
}

// place makes r's adapter resident and pins it (Move's work).
func (s *Table[R]) place(ctx context.Context, r R) error {
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
		victim, ok := s.victimLocked()
		if !ok {
			s.mu.Unlock()
			return lane.ErrNoSlot
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
		wakeAll(waiting)
		if err != nil { // the victim's error is its own: it may belong to another workspace
			s.cfg.Log.Warn("offloading an adapter to free a slot failed", slog.String("victim", victim.ID()), slog.String("for", r.ID()), slog.Any("err", err))
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("training run %s waited for an adapter slot on the backend, and freeing one failed; retry", r.ID()))
		}
	}
}

// allPinnedLocked reports whether every slot is taken and none may be offloaded.
func (s *Table[R]) allPinnedLocked() bool {
	if !s.fullLocked() {
		return false
	}
	_, ok := s.victimLocked()
	return !ok
}

// victimLocked picks the least recently used resident run that may be offloaded; ok is
// false when there is none.
func (s *Table[R]) victimLocked() (victim R, ok bool) {
	for el := s.lru.Back(); el != nil; el = el.Prev() {
		v := el.Value.(R)
		e := s.runs[v]
		if e.pins == 0 && (s.cfg.Gradients || !e.grads) {
			return v, true
		}
	}
	return victim, false
}

// offload saves a run's complete training state into its spill folder and frees its slot
// on the backend.
func (s *Table[R]) offload(ctx context.Context, r R) error {
	dir := filepath.Join(s.cfg.Dir, r.ID())
	_ = os.RemoveAll(dir)
	if err := os.MkdirAll(s.cfg.Dir, 0o755); err != nil {
		return connect.NewError(connect.CodeInternal, fmt.Errorf("creating the adapter spill folder: %w", s.cfg.Scrub(err)))
	}
	a := s.cfg.Adapters
	if _, err := a.SaveAdapter(ctx, &backendv1.SaveAdapterRequest{AdapterId: r.ID(), Dir: dir, IncludeOptimizer: true, IncludeGradients: s.cfg.Gradients}); err != nil {
		_ = os.RemoveAll(dir)
		return s.cfg.Lost(r, err)
	}
	if _, err := a.DeleteAdapter(ctx, &backendv1.DeleteAdapterRequest{AdapterId: r.ID()}); err != nil {
		_ = os.RemoveAll(dir)
		return s.cfg.Lost(r, err)
	}
	s.mu.Lock()
	s.entry(r).spill = dir
	s.mu.Unlock()
	count(s.cfg.Offloaded)
	s.cfg.Log.Debug("offloaded an adapter", slog.String("run", r.ID()))
	return nil
}

// restore loads an offloaded run's state back onto the backend.
func (s *Table[R]) restore(ctx context.Context, r R, dir string) error {
	if _, err := s.cfg.Adapters.LoadAdapter(ctx, &backendv1.LoadAdapterRequest{AdapterId: r.ID(), Dir: dir, LoadOptimizer: true, LoadGradients: s.cfg.Gradients}); err != nil {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("restoring training run %s's offloaded adapter failed (%s); retry, or load its last checkpoint", r.ID(), errs.Message(err)))
	}
	_ = os.RemoveAll(dir)
	count(s.cfg.Restored)
	return nil
}

func count(c prometheus.Counter) {
	if c != nil {
		c.Inc()
	}
}

// Park registers a run that Admit refused with lane.ErrNoSlot (and that is no longer in a
// lane's ready list) to be woken when a slot is unpinned; if one freed meanwhile, the run is
// woken at once, so no wake-up is lost.
func (s *Table[R]) Park(r R) {
	s.mu.Lock()
	if s.entry(r).offloading || s.allPinnedLocked() {
		s.waiting = append(s.waiting, r)
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	r.Wake()
}

// Unpin releases a run taken by Admit, and wakes the runs waiting for a slot.
func (s *Table[R]) Unpin(r R) {
	s.mu.Lock()
	if e, ok := s.runs[r]; ok && e.pins > 0 {
		e.pins--
	}
	waiting := s.takeWaitingLocked()
	s.mu.Unlock()
	wakeAll(waiting)
}

// takeWaitingLocked empties the list of runs waiting for a slot; s.mu must be held.
func (s *Table[R]) takeWaitingLocked() []R {
	w := s.waiting
	s.waiting = nil
	return w
}

// wakeAll makes runs that waited for a slot try again.
func wakeAll[R Run](rs []R) {
	for _, r := range rs {
		r.Wake()
	}
}

// SetGradients records whether the run has gradients that no optim_step has applied yet.
func (s *Table[R]) SetGradients(r R, pending bool) {
	s.mu.Lock()
	s.entry(r).grads = pending
	s.mu.Unlock()
}

// Parked reports whether r waits for an adapter slot (every slot pinned), and the number
// of slots (0: unlimited).
func (s *Table[R]) Parked(r R) (parked bool, slots int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return slices.Contains(s.waiting, r), s.cfg.Capacity
}

// Forget drops a run whose adapter was freed (unloaded): its slot and any spill folder.
func (s *Table[R]) Forget(r R) {
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
