package core

import (
	"context"
	"errors"
	"log/slog"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/internal/lockorder"

	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The run registry (runRegistry, Core.runs): which runs are in memory.
//
// Memory holds the runs that take work, plus, for a while, runs that recently stopped:
//   - A run that holds no adapter and has nothing queued or running leaves memory once no
//     request named it for Limits.RunIdleTTL (an unloaded run: its session ended, it was
//     unloaded, or its creation failed) or Limits.LiveRunIdleTTL (a run that still takes
//     work but holds no adapter: one recovered after a restart and not used since). A run
//     whose adapter is on the backend is never evicted: its state lives only there.
//   - A request that names a run not in memory reloads it from the store (runOf, loadRun), by id or
//     by its alias "<session_id>:train:<n>". A run with an unload_reason comes back as a
//     record that refuses work with that reason; one without comes back as after a restart
//     (its adapter is recreated on first use and the run marked corrupted, see
//     ensureAdapter; its next seq_id is taken from the client's next request).
//   - At start-up only the runs that may still take work are loaded (recoverRuns): not those
//     with an unload_reason, nor those of a session the store records as ended (records
//     written before unload_reason existed).

// runRegistry holds the runs in memory, by id and by alias, and when a request last named
// each. Its lock guards only its maps: nothing is read from the store under it.
type runRegistry struct {
	now    func() time.Time
	limits *Limits
	// load reads a run that is not in memory (by id or alias) from the store; nil, nil when
	// the store has none that this server can serve.
	load func(ctx context.Context, ws, id string) (*run, error)

	mu       lockorder.Mutex[rankRegistry]
	runs     map[string]*run
	aliases  map[string]string    // "<session_id>:train:<n>" -> run id
	lastUsed map[string]time.Time // run id -> last lookup
}

func newRunRegistry(now func() time.Time, limits *Limits, load func(ctx context.Context, ws, id string) (*run, error)) *runRegistry {
	return &runRegistry{now: now, limits: limits, load: load, runs: map[string]*run{}, aliases: map[string]string{}, lastUsed: map[string]time.Time{}}
}

// get returns the run named id (or its alias), reloading it from the store when it is not
// in memory; nil when there is none. It notes the use, for idle eviction.
func (g *runRegistry) get(ctx context.Context, ws, id string) (*run, error) {
	g.mu.Lock()
	r, ok := g.runs[id]
	if !ok {
		r, ok = g.runs[g.aliases[id]]
	}
	if ok {
		g.lastUsed[r.ID()] = g.now()
	}
	g.mu.Unlock()
	if ok {
		return r, nil
	}
	r, err := g.load(ctx, ws, id)
	if r == nil || err != nil {
		return nil, err
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if cur, ok := g.runs[r.ID()]; ok { // reloaded meanwhile by another request
		g.lastUsed[cur.ID()] = g.now()
		return cur, nil
	}
	g.addLocked(r)
	return r, nil
}

// peek returns the run named id if it is in memory (no store read, no use noted).
func (g *runRegistry) peek(id string) *run {
	g.mu.Lock()
	defer g.mu.Unlock()
	return g.runs[id]
}

// add registers a run and its alias.
func (g *runRegistry) add(r *run) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.addLocked(r)
}

func (g *runRegistry) addLocked(r *run) {
	g.runs[r.ID()] = r
	g.lastUsed[r.ID()] = g.now()
	if info := r.Record(); info.GetSessionId() != "" && info.ClientSeqId != nil {
		g.aliases[runAlias(info.GetSessionId(), info.GetClientSeqId())] = r.ID()
	}
}

// drop forgets a run: one whose creation failed before any work was queued, or one that
// leaves memory (evictIdle).
func (g *runRegistry) drop(r *run) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.dropLocked(r)
}

func (g *runRegistry) dropLocked(r *run) {
	delete(g.runs, r.ID())
	delete(g.lastUsed, r.ID())
	if info := r.Record(); info.GetSessionId() != "" && info.ClientSeqId != nil {
		if alias := runAlias(info.GetSessionId(), info.GetClientSeqId()); g.aliases[alias] == r.ID() {
			delete(g.aliases, alias)
		}
	}
}

// all returns the runs in memory.
func (g *runRegistry) all() []*run {
	g.mu.Lock()
	defer g.mu.Unlock()
	return slices.Collect(maps.Values(g.runs))
}

// len is the number of runs in memory (tests, the soak benchmark).
func (g *runRegistry) len() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.runs)
}

// evictIdle drops the runs that may leave memory at now (see evictable) and returns them.
func (g *runRegistry) evictIdle(now time.Time) []*run {
	g.mu.Lock()
	defer g.mu.Unlock()
	var gone []*run
	for id, r := range g.runs {
		if r.Evictable(now.Sub(g.lastUsed[id]), g.limits.RunIdleTTL, g.limits.LiveRunIdleTTL) {
			g.dropLocked(r)
			gone = append(gone, r)
		}
	}
	return gone
}

// evictIdleRuns drops the runs that may leave memory (see evictable), and whatever the slot
// table still holds for them.
func (c *Core) evictIdleRuns(now time.Time) {
	gone := c.runs.evictIdle(now)
	for _, r := range gone {
		c.slots.Forget(r)
	}
	if len(gone) > 0 {
		c.log.Debug("evicted idle runs from memory", slog.Int("count", len(gone)), slog.Int("in_memory", c.runs.len()))
	}
}

// loadRun reads a run of the workspace that is not in memory from the store, by id or
// alias (the registry's loader). It returns nil when the store has no such run or its base
// model is not served.
func (c *Core) loadRun(ctx context.Context, ws, id string) (*run, error) {
	info, err := c.store.GetTrainingRun(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		info, err = c.runByAlias(ctx, ws, id)
	}
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		c.log.Error("reloading a training run", slog.String("run", id), slog.Any("err", err))
		return nil, unavailable("training run %s could not be read from the store; retry", id)
	}
	if _, ok := c.models[info.GetBaseModel()]; !ok {
		return nil, nil
	}
	r, err := c.newRun(ws, info, sequencer.Resync, false, info.GetUnloadReason())
	if err != nil {
		return nil, err
	}
	if info.GetUnloadReason() == "" {
		c.policy.AdoptRun(ws, info.GetId()) // still live: it counts against max_concurrent_runs
	}
	return r, nil
}

// runByAlias finds the run "<session_id>:train:<n>" in the store: one query for the
// session's runs (at most Limits.MaxRunsPerSession).
func (c *Core) runByAlias(ctx context.Context, ws, alias string) (*loopsv1.TrainingRun, error) {
	sessionID, n, ok := strings.Cut(alias, ":train:")
	if !ok {
		return nil, store.ErrNotFound
	}
	seq, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return nil, store.ErrNotFound
	}
	runs, err := c.store.ListSessionTrainingRuns(ctx, ws, sessionID)
	if err != nil {
		return nil, err
	}
	for _, info := range runs {
		if info.ClientSeqId != nil && info.GetClientSeqId() == seq {
			return info, nil
		}
	}
	return nil, store.ErrNotFound
}

// markUnloaded records why the run takes no more work, in memory and in the store, so the
// run refuses work with the same reason after it was evicted or the server restarted.
func (c *Core) markUnloaded(r *run, reason string) {
	c.updateRun(r, func(i *loopsv1.TrainingRun) { i.UnloadReason = reason })
}
