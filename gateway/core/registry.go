package core

import (
	"context"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/gateway/core/sequencer"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// The run registry: which runs are in memory (Core.runs, Core.aliases).
//
// Memory holds the runs that take work, plus, for a while, runs that recently stopped:
//   - A run that holds no adapter and has nothing queued or running leaves memory once no
//     request named it for Limits.RunIdleTTL (an unloaded run: its session ended, it was
//     unloaded, or its creation failed) or Limits.LiveRunIdleTTL (a run that still takes
//     work but holds no adapter: one recovered after a restart and not used since). A run
//     whose adapter is on the backend is never evicted: its state lives only there.
//   - A request that names a run not in memory reloads it from the store (runOf), by id or
//     by its alias "<session_id>:train:<n>". A run with an unload_reason comes back as a
//     record that refuses work with that reason; one without comes back as after a restart
//     (its adapter is recreated on first use and the run marked corrupted, see
//     ensureAdapter; its next seq_id is taken from the client's next request).
//   - At start-up only the runs that may still take work are loaded (recoverRuns): not those
//     with an unload_reason, nor those of a session the store records as ended (records
//     written before unload_reason existed).

// noteUsedLocked records that a request named the run now; c.mu must be held.
func (c *Core) noteUsedLocked(id string) {
	if c.lastUsed == nil {
		c.lastUsed = map[string]time.Time{}
	}
	c.lastUsed[id] = c.now()
}

// lookupRunLocked finds a run in memory by id or alias; c.mu must be held.
func (c *Core) lookupRunLocked(id string) (*run, bool) {
	r, ok := c.runs[id]
	if !ok {
		r, ok = c.runs[c.aliases[id]]
	}
	return r, ok
}

// evictable reports whether the run may leave memory now: it holds no adapter, nothing of
// it is queued or running, and it was idle for its TTL.
func (c *Core) evictable(r *run, idle time.Duration) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.busy || r.queued || r.seq.Len() > 0 || r.gapTimer != nil || r.freeWhenIdle || r.adapterStale {
		return false
	}
	if r.unloaded != "" {
		return idle >= c.opts.Limits.RunIdleTTL
	}
	return !r.adapterReady && idle >= c.opts.Limits.LiveRunIdleTTL
}

// evictIdleRuns drops the runs that may leave memory (see evictable), and whatever the slot
// table still holds for them.
func (c *Core) evictIdleRuns(now time.Time) {
	var gone []*run
	c.mu.Lock()
	for id, r := range c.runs {
		if c.evictable(r, now.Sub(c.lastUsed[id])) {
			c.dropRunLocked(r)
			gone = append(gone, r)
		}
	}
	left := len(c.runs)
	c.mu.Unlock()
	for _, r := range gone {
		c.slots.forget(r)
	}
	if len(gone) > 0 {
		c.log.Debug("evicted idle runs from memory", slog.Int("count", len(gone)), slog.Int("in_memory", left))
	}
}

// reloadRun loads a run of the workspace that is not in memory from the store, by id or
// alias, and registers it. It returns nil when the store has no such run (or its base model
// is not served).
func (c *Core) reloadRun(ctx context.Context, ws, id string) *run {
	info, err := c.store.GetTrainingRun(ctx, ws, id)
	if errors.Is(err, store.ErrNotFound) {
		info, err = c.runByAlias(ctx, ws, id)
	}
	if err != nil || info == nil {
		if err != nil && !errors.Is(err, store.ErrNotFound) {
			c.log.Error("reloading a training run", slog.String("run", id), slog.Any("err", err))
		}
		return nil
	}
	if _, ok := c.models[info.GetBaseModel()]; !ok {
		return nil
	}
	r := c.newRun(ws, info, sequencer.Resync, false)
	r.unloaded = info.GetUnloadReason()
	c.mu.Lock()
	defer c.mu.Unlock()
	if cur, ok := c.runs[r.id]; ok { // reloaded meanwhile by another request
		c.noteUsedLocked(cur.id)
		return cur
	}
	c.addRunLocked(r)
	c.noteUsedLocked(r.id)
	return r
}

// runByAlias finds the run "<session_id>:train:<n>" in the store through its session's
// record.
func (c *Core) runByAlias(ctx context.Context, ws, alias string) (*loopsv1.TrainingRun, error) {
	sessionID, n, ok := strings.Cut(alias, ":train:")
	if !ok {
		return nil, store.ErrNotFound
	}
	seq, err := strconv.ParseInt(n, 10, 64)
	if err != nil {
		return nil, store.ErrNotFound
	}
	sess, err := c.store.GetSession(ctx, ws, sessionID)
	if err != nil {
		return nil, err
	}
	for _, id := range sess.GetTrainingRunIds() {
		info, err := c.store.GetTrainingRun(ctx, ws, id)
		if err == nil && info.ClientSeqId != nil && info.GetClientSeqId() == seq {
			return info, nil
		}
	}
	return nil, store.ErrNotFound
}

// runsInMemory is the number of runs the registry holds (tests, the soak benchmark).
func (c *Core) runsInMemory() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.runs)
}

// markUnloaded records why the run takes no more work, in memory and in the store, so the
// run refuses work with the same reason after it was evicted or the server restarted.
func (c *Core) markUnloaded(ctx context.Context, r *run, reason string) {
	r.update(ctx, func(i *loopsv1.TrainingRun) { i.UnloadReason = reason })
}
