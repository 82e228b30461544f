package core

import (
	"github.com/loops-dev/loops/gateway/core/lane"
)

// The per-model scheduler is package lane: a lane per base model runs its runs' work, fairly
// between workspaces at any request size (forward/backward work in pieces of
// Options.ChunkTokens tokens, batches by deficit round robin, Options.LaneConcurrency
// batches at once with at most one per workspace). The core gives it a runner (coreRunner,
// queue.go) and the slot table (package adapterslots).

// DefaultChunkTokens is the default of Options.ChunkTokens: the piece size of
// forward/backward work (bench/fairness: the cost of a piece against the latency a
// workspace waiting for a free batch sees).
const DefaultChunkTokens = 1024

// DefaultLaneConcurrency is the default of Options.LaneConcurrency: forward/backward batches
// of one base model that run at once.
const DefaultLaneConcurrency = 2

// Bounds of Options.ChunkTokens and Options.LaneConcurrency that an operator may set.
const (
	MinChunkTokens     = 64
	MaxChunkTokens     = 1 << 20
	MaxLaneConcurrency = 64
)

// expressShare sizes the lane's express batch: ChunkTokens / expressShare tokens (128 by
// default), for workspaces whose waiting steps are all that small (lane.Config.ExpressTokens).
const expressShare = 8

// laneOf is the lane type of the core's runs.
type laneOf = lane.Lane[*operation]

// laneFor returns the lane of a base model, starting it on first use; it fails with
// Unavailable once the core is shutting down.
func (c *Core) laneFor(model string) (*laneOf, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if l, ok := c.lanes[model]; ok {
		return l, nil
	}
	l, err := lane.New(lane.Config{
		Model: model, MaxBatchTokens: c.opts.MaxBatchTokens, Concurrency: c.opts.LaneConcurrency,
		ExpressTokens: max(c.opts.ChunkTokens/expressShare, 1),
		Life:          c.life, Busy: c.running, Draining: c.draining, ErrStopping: errShuttingDown(),
	}, coreRunner{c}, c.slots)
	if err != nil {
		return nil, errShuttingDown()
	}
	c.lanes[model] = l
	return l, nil
}
