package adapterslots

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/core/lane"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
)

// testRun is a run of the tests: Wake signals woken.
type testRun struct {
	id    string
	woken chan struct{}
}

func newRun(id string) *testRun { return &testRun{id: id, woken: make(chan struct{}, 1)} }

func (r *testRun) ID() string { return r.id }

func (r *testRun) Wake() {
	select {
	case r.woken <- struct{}{}:
	default:
	}
}

// wasWoken reports whether r was woken since the last call.
func (r *testRun) wasWoken() bool {
	select {
	case <-r.woken:
		return true
	default:
		return false
	}
}

// fakeBackend holds adapters like a backend's trainer: SaveAdapter writes a file into the
// folder, DeleteAdapter and LoadAdapter take adapters off and onto it. It checks that it
// never holds more than capacity adapters.
type fakeBackend struct {
	t        *testing.T
	capacity int

	mu       sync.Mutex
	held     map[string]bool
	calls    []string
	saves    []*backendv1.SaveAdapterRequest
	loads    []*backendv1.LoadAdapterRequest
	failSave error
	failLoad error
	// gate, when set, is waited on by SaveAdapter before it saves.
	gate chan struct{}
	// saving is signalled when SaveAdapter starts (with gate set).
	saving chan struct{}
}

func newBackend(t *testing.T, capacity int) *fakeBackend {
	return &fakeBackend{t: t, capacity: capacity, held: map[string]bool{}}
}

// hold records that the adapter of a run the table admitted is on the backend (the core
// creates it when the run's first task runs).
func (b *fakeBackend) hold(id string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.held[id] = true
	b.checkLocked()
}

func (b *fakeBackend) holds(id string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.held[id]
}

func (b *fakeBackend) checkLocked() {
	if b.capacity > 0 && len(b.held) > b.capacity {
		b.t.Errorf("the backend holds %d adapters, over its %d slots", len(b.held), b.capacity)
	}
}

func (b *fakeBackend) log() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.calls...)
}

func (b *fakeBackend) SaveAdapter(_ context.Context, req *backendv1.SaveAdapterRequest) (*backendv1.SaveAdapterResponse, error) {
	b.mu.Lock()
	gate, saving := b.gate, b.saving
	b.mu.Unlock()
	if gate != nil {
		saving <- struct{}{}
		<-gate
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "save "+req.GetAdapterId())
	b.saves = append(b.saves, req)
	if b.failSave != nil {
		return nil, b.failSave
	}
	if !b.held[req.GetAdapterId()] {
		return nil, connect.NewError(connect.CodeNotFound, fmt.Errorf("no adapter %s", req.GetAdapterId()))
	}
	if err := os.MkdirAll(req.GetDir(), 0o755); err != nil {
		return nil, err
	}
	if err := os.WriteFile(filepath.Join(req.GetDir(), "adapter.bin"), []byte(req.GetAdapterId()), 0o644); err != nil {
		return nil, err
	}
	return &backendv1.SaveAdapterResponse{}, nil
}

func (b *fakeBackend) DeleteAdapter(_ context.Context, req *backendv1.DeleteAdapterRequest) (*backendv1.DeleteAdapterResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "delete "+req.GetAdapterId())
	delete(b.held, req.GetAdapterId())
	return &backendv1.DeleteAdapterResponse{}, nil
}

func (b *fakeBackend) LoadAdapter(_ context.Context, req *backendv1.LoadAdapterRequest) (*backendv1.LoadAdapterResponse, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.calls = append(b.calls, "load "+req.GetAdapterId())
	b.loads = append(b.loads, req)
	if b.failLoad != nil {
		return nil, b.failLoad
	}
	got, err := os.ReadFile(filepath.Join(req.GetDir(), "adapter.bin"))
	if err != nil {
		return nil, connect.NewError(connect.CodeInvalidArgument, err)
	}
	if string(got) != req.GetAdapterId() {
		b.t.Errorf("loading %s from a folder saved for %s", req.GetAdapterId(), got)
	}
	b.held[req.GetAdapterId()] = true
	b.checkLocked()
	return &backendv1.LoadAdapterResponse{}, nil
}

type fixture struct {
	t         *testing.T
	table     *Table[*testRun]
	backend   *fakeBackend
	dir       string
	offloaded prometheus.Counter
	restored  prometheus.Counter
	lost      []string // "run: error" for each call of Config.Lost
	lostMu    sync.Mutex
}

func newFixture(t *testing.T, capacity int, gradients bool) *fixture {
	f := &fixture{
		t: t, backend: newBackend(t, capacity), dir: filepath.Join(t.TempDir(), "spill"),
		offloaded: prometheus.NewCounter(prometheus.CounterOpts{Name: "offloaded"}),
		restored:  prometheus.NewCounter(prometheus.CounterOpts{Name: "restored"}),
	}
	var err error
	f.table, err = New(Config[*testRun]{
		Dir: f.dir, Capacity: capacity, Gradients: gradients, Adapters: f.backend,
		Log: slog.New(slog.NewTextHandler(io.Discard, nil)), Offloaded: f.offloaded, Restored: f.restored,
		Lost: func(r *testRun, err error) error {
			f.lostMu.Lock()
			f.lost = append(f.lost, r.ID()+": "+connect.CodeOf(err).String())
			f.lostMu.Unlock()
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("run %s lost its adapter", r.ID()))
		},
	})
	require.NoError(t, err)
	return f
}

// admit admits r and records its adapter on the backend.
func (f *fixture) admit(r *testRun) error {
	err := f.table.Admit(f.t.Context(), r)
	if err == nil {
		f.backend.hold(r.ID())
	}
	return err
}

// run admits r (moving its adapter when needed), as the lane does, and fails the test
// unless it ends pinned.
func (f *fixture) run(r *testRun) {
	f.t.Helper()
	err := f.admit(r)
	if errors.Is(err, lane.ErrMoveNeeded) {
		require.NoError(f.t, f.table.Move(f.t.Context(), r))
		err = f.admit(r)
	}
	require.NoError(f.t, err)
}

func TestNewEmptiesTheSpillFolder(t *testing.T) {
	dir := filepath.Join(t.TempDir(), "spill")
	require.NoError(t, os.MkdirAll(filepath.Join(dir, "old-run"), 0o755))
	require.NoError(t, os.WriteFile(filepath.Join(dir, "old-run", "adapter.bin"), []byte("x"), 0o644))
	_, err := New(Config[*testRun]{Dir: dir, Capacity: 1, Adapters: newBackend(t, 1)})
	require.NoError(t, err)
	require.NoDirExists(t, dir)
}

// TestUnlimitedSlotsNeverMove: a backend without max_adapters takes every run at once.
func TestUnlimitedSlotsNeverMove(t *testing.T) {
	f := newFixture(t, 0, false)
	for i := range 50 {
		require.NoError(t, f.admit(newRun(fmt.Sprint("run", i))))
	}
	require.Empty(t, f.backend.log())
}

// TestEveryPinnedSlotParksTheRunUntilOneIsUnpinned: with both slots pinned a third run
// gets ErrNoSlot, waits parked, and is woken when a slot is unpinned.
func TestEveryPinnedSlotParksTheRunUntilOneIsUnpinned(t *testing.T) {
	f := newFixture(t, 2, true)
	a, b, c := newRun("a"), newRun("b"), newRun("c")
	require.NoError(t, f.admit(a))
	require.NoError(t, f.admit(b))
	require.ErrorIs(t, f.admit(c), lane.ErrNoSlot)
	f.table.Park(c)
	parked, slots := f.table.Parked(c)
	require.True(t, parked)
	require.Equal(t, 2, slots)
	require.False(t, c.wasWoken())

	f.table.Unpin(a)
	require.True(t, c.wasWoken())
	parked, _ = f.table.Parked(c)
	require.False(t, parked)
	// a is idle now: c's turn needs a's adapter moved off first.
	require.ErrorIs(t, f.admit(c), lane.ErrMoveNeeded)
}

// TestParkAfterASlotFreedWakesAtOnce: a run parked after the slot it waited for freed is
// woken at once, so no wake-up is lost.
func TestParkAfterASlotFreedWakesAtOnce(t *testing.T) {
	f := newFixture(t, 1, true)
	a, b := newRun("a"), newRun("b")
	require.NoError(t, f.admit(a))
	require.ErrorIs(t, f.admit(b), lane.ErrNoSlot)
	f.table.Unpin(a) // before b parks
	f.table.Park(b)
	require.True(t, b.wasWoken())
	parked, _ := f.table.Parked(b)
	require.False(t, parked)
}

// TestMoveOffloadsTheLeastRecentlyUsedIdleRunAndRestoresIt: a run that finds every slot
// taken by idle runs has the least recently used one's complete state saved into its spill
// folder and deleted from the backend; that run is later restored from the folder, which is
// then removed.
func TestMoveOffloadsTheLeastRecentlyUsedIdleRunAndRestoresIt(t *testing.T) {
	f := newFixture(t, 2, true)
	a, b, c := newRun("a"), newRun("b"), newRun("c")
	f.run(a)
	f.run(b)
	f.table.Unpin(a)
	f.table.Unpin(b)
	f.run(a) // a is now used more recently than b
	f.table.Unpin(a)

	require.ErrorIs(t, f.admit(c), lane.ErrMoveNeeded)
	require.NoError(t, f.table.Move(t.Context(), c))
	require.Equal(t, []string{"save b", "delete b"}, f.backend.log())
	save := f.backend.saves[0]
	require.Equal(t, filepath.Join(f.dir, "b"), save.GetDir())
	require.True(t, save.GetIncludeOptimizer())
	require.True(t, save.GetIncludeGradients())
	require.FileExists(t, filepath.Join(f.dir, "b", "adapter.bin"))
	require.NoError(t, f.admit(c), "Move reserved c's pin")
	require.Equal(t, 1.0, testutil.ToFloat64(f.offloaded))

	// b comes back: a (idle, used before c) makes room, and b is restored from its folder.
	require.ErrorIs(t, f.admit(b), lane.ErrMoveNeeded)
	f.table.Unpin(c)
	require.NoError(t, f.table.Move(t.Context(), b))
	require.Equal(t, []string{"save b", "delete b", "save a", "delete a", "load b"}, f.backend.log())
	load := f.backend.loads[0]
	require.Equal(t, filepath.Join(f.dir, "b"), load.GetDir())
	require.True(t, load.GetLoadOptimizer())
	require.True(t, load.GetLoadGradients())
	require.NoDirExists(t, filepath.Join(f.dir, "b"))
	require.True(t, f.backend.holds("b"))
	require.NoError(t, f.admit(b))
	require.Equal(t, 2.0, testutil.ToFloat64(f.offloaded))
	require.Equal(t, 1.0, testutil.ToFloat64(f.restored))
}

// TestPendingGradientsStayOnABackendThatCannotSaveThem: a backend without saves_gradients
// never has a run with gradients not yet applied offloaded: the next run waits for a slot
// until the run's optimizer step.
func TestPendingGradientsStayOnABackendThatCannotSaveThem(t *testing.T) {
	for _, gradients := range []bool{false, true} {
		t.Run(fmt.Sprint("saves_gradients=", gradients), func(t *testing.T) {
			f := newFixture(t, 1, gradients)
			a, b := newRun("a"), newRun("b")
			f.run(a)
			f.table.SetGradients(a, true)
			f.table.Unpin(a)
			if !gradients {
				require.ErrorIs(t, f.admit(b), lane.ErrNoSlot)
				require.ErrorIs(t, f.table.Move(t.Context(), b), lane.ErrNoSlot)
				f.table.SetGradients(a, false) // optim_step applied them
			}
			require.ErrorIs(t, f.admit(b), lane.ErrMoveNeeded)
			require.NoError(t, f.table.Move(t.Context(), b))
			require.Equal(t, gradients, f.backend.saves[0].GetIncludeGradients())
		})
	}
}

// TestKeepHoldsThePinForTheNextAdmit: a run whose head did not run keeps its pin, so its
// slot cannot be taken before its next admit.
func TestKeepHoldsThePinForTheNextAdmit(t *testing.T) {
	f := newFixture(t, 1, true)
	a, b := newRun("a"), newRun("b")
	f.run(a)
	f.table.Keep(a)
	require.ErrorIs(t, f.admit(b), lane.ErrNoSlot)
	require.NoError(t, f.admit(a))
	require.ErrorIs(t, f.admit(b), lane.ErrNoSlot, "a's admit took the kept pin; a is still pinned")
	f.table.Unpin(a)
	require.ErrorIs(t, f.admit(b), lane.ErrMoveNeeded)
}

// TestAFailedOffloadKeepsTheVictimResident: when saving the victim's state fails, the
// victim keeps its slot and its adapter, its error goes through Config.Lost (it may belong to
// another workspace, so the waiting run is told only to retry), and no spill folder is left.
func TestAFailedOffloadKeepsTheVictimResident(t *testing.T) {
	f := newFixture(t, 1, true)
	a, b := newRun("a"), newRun("b")
	f.run(a)
	f.table.Unpin(a)
	f.backend.failSave = connect.NewError(connect.CodeNotFound, errors.New("worker restarted"))
	err := f.table.Move(t.Context(), b)
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	require.Contains(t, err.Error(), "training run b waited for an adapter slot on the backend, and freeing one failed; retry")
	require.Equal(t, []string{"a: not_found"}, f.lost)
	require.NoDirExists(t, filepath.Join(f.dir, "a"))
	require.ErrorIs(t, f.admit(newRun("c")), lane.ErrMoveNeeded, "a still holds the only slot")
	require.NoError(t, f.admit(a), "a is still resident")
	require.Equal(t, 0.0, testutil.ToFloat64(f.offloaded))
}

// TestAFailedRestoreFreesTheSlotAndKeepsTheSpill: a restore that fails answers Unavailable
// with the backend's message, gives the slot back, and keeps the run's saved state for the
// next try.
func TestAFailedRestoreFreesTheSlotAndKeepsTheSpill(t *testing.T) {
	f := newFixture(t, 1, true)
	a, b, c := newRun("a"), newRun("b"), newRun("c")
	f.run(a)
	f.table.Unpin(a)
	f.run(b) // offloads a
	f.table.Unpin(b)
	f.backend.failLoad = connect.NewError(connect.CodeInternal, errors.New("disk full"))
	err := f.table.Move(t.Context(), a) // offloads b, then fails to restore a
	require.Equal(t, connect.CodeUnavailable, connect.CodeOf(err))
	require.Contains(t, err.Error(), "restoring training run a's offloaded adapter failed (disk full); retry, or load its last checkpoint")
	require.FileExists(t, filepath.Join(f.dir, "a", "adapter.bin"))
	require.NoError(t, f.admit(c), "the slot is free again")
	f.table.Unpin(c)

	f.backend.failLoad = nil
	f.run(a) // offloads c, restores a
	require.Equal(t, []string{"save a", "delete a", "save b", "delete b", "load a", "save c", "delete c", "load a"}, f.backend.log())
	require.NoDirExists(t, filepath.Join(f.dir, "a"))
	require.Equal(t, 1.0, testutil.ToFloat64(f.restored))
}

// TestForgetFreesTheSlotAndTheSpill: an unloaded run's slot is free at once, and an
// offloaded one's saved state is removed.
func TestForgetFreesTheSlotAndTheSpill(t *testing.T) {
	f := newFixture(t, 1, true)
	a, b, c := newRun("a"), newRun("b"), newRun("c")
	f.run(a)
	f.table.Unpin(a)
	f.run(b) // offloads a
	require.DirExists(t, filepath.Join(f.dir, "a"))
	f.table.Forget(a)
	require.NoDirExists(t, filepath.Join(f.dir, "a"))

	require.ErrorIs(t, f.admit(c), lane.ErrNoSlot)
	f.table.Forget(b) // unloaded while pinned: its adapter is freed by the core
	require.NoError(t, f.table.Admit(t.Context(), c))
	require.ErrorIs(t, f.admit(a), lane.ErrNoSlot, "a starts afresh, not from a spill")
}

// TestARunBeingOffloadedWaitsParked: a run whose adapter another run's Move is saving off
// the backend gets ErrNoSlot and, parked, is woken once the offload is done.
func TestARunBeingOffloadedWaitsParked(t *testing.T) {
	f := newFixture(t, 1, true)
	a, b := newRun("a"), newRun("b")
	f.run(a)
	f.table.Unpin(a)
	f.backend.gate, f.backend.saving = make(chan struct{}), make(chan struct{}, 1)
	moved := make(chan error, 1)
	go func() { moved <- f.table.Move(context.Background(), b) }()
	<-f.backend.saving
	require.ErrorIs(t, f.table.Admit(t.Context(), a), lane.ErrNoSlot)
	f.table.Park(a)
	require.False(t, a.wasWoken())
	parked, _ := f.table.Parked(a)
	require.True(t, parked)
	close(f.backend.gate)
	require.NoError(t, <-moved)
	require.True(t, a.wasWoken())
	require.ErrorIs(t, f.table.Admit(t.Context(), a), lane.ErrNoSlot, "b holds the only slot, reserved")
}

// TestConcurrentRunsNeverOverfillTheBackend: runs driven concurrently as the lanes drive
// them (admit, move when told, park when every slot is pinned) all get their turns, the
// backend never holds more adapters than its slots, and a pinned run's adapter is always
// on the backend.
func TestConcurrentRunsNeverOverfillTheBackend(t *testing.T) {
	const capacity, runs, turns = 2, 6, 40
	f := newFixture(t, capacity, true)
	// take pins r as a lane does; false (the test failed) when it cannot.
	take := func(r *testRun) bool {
		for {
			err := f.admit(r)
			if errors.Is(err, lane.ErrMoveNeeded) {
				if err = f.table.Move(context.Background(), r); err == nil {
					err = f.admit(r)
				}
			}
			switch {
			case err == nil:
				return true
			case !errors.Is(err, lane.ErrNoSlot):
				t.Errorf("%s: %v", r.ID(), err)
				return false
			}
			f.table.Park(r)
			select {
			case <-r.woken:
			case <-time.After(10 * time.Second):
				t.Errorf("%s parked and never woken", r.ID())
				return false
			}
		}
	}
	turn := newBarrier(runs)
	var wg sync.WaitGroup
	for i := range runs {
		r := newRun(fmt.Sprint("run", i))
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range turns {
				if take(r) {
					if !f.backend.holds(r.ID()) {
						t.Errorf("%s is pinned but its adapter is not on the backend", r.ID())
					}
					f.table.SetGradients(r, rand.IntN(2) == 0)
					time.Sleep(time.Duration(rand.IntN(200)) * time.Microsecond)
					f.table.Unpin(r)
				}
				turn.wait() // every run takes each turn, so adapters go off and come back
			}
		}()
	}
	wg.Wait()
	// Each turn, the runs beyond the two slots find them taken.
	require.GreaterOrEqual(t, testutil.ToFloat64(f.offloaded), float64(turns*(runs-capacity)))
	require.Positive(t, testutil.ToFloat64(f.restored))
}

// barrier lets n goroutines wait for each other, again and again.
type barrier struct {
	mu         sync.Mutex
	cond       *sync.Cond
	n, arrived int
	round      int
}

func newBarrier(n int) *barrier {
	b := &barrier{n: n}
	b.cond = sync.NewCond(&b.mu)
	return b
}

func (b *barrier) wait() {
	b.mu.Lock()
	defer b.mu.Unlock()
	round := b.round
	if b.arrived++; b.arrived == b.n {
		b.arrived = 0
		b.round++
		b.cond.Broadcast()
		return
	}
	for round == b.round {
		b.cond.Wait()
	}
}
