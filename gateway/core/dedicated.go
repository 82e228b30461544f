package core

import (
	"context"
	"log/slog"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
)

// Dedicated runs. A run may ask for worker replicas of its own instead of the shared pools
// of serverless mode: user_metadata "loops.dedicated" = "true" (what a tinker script
// passes to create_lora_training_client(user_metadata=…)), with "loops.dedicated_replicas"
// (1-8, default 1); a workspace's policy may refuse it or make it the default (dedicated:
// off|allowed|always). The backend (backends.DedicatedPools) binds a warm pool of that shape
// or starts one while the run's creation waits, keeps the pool when the run ends for its
// keep-warm period, and scales a pool idle long enough to zero. Dedicated runs keep step
// recovery, so a pool that was scaled to zero (or lost a replica) rebuilds the run's adapter
// on its next call. The replicas' time is metered per workspace as dedicated replica-seconds
// and GPU-seconds, beside the serverless token meters.

// Run metadata keys of dedicated mode.
const (
	MetaDedicated         = "loops.dedicated"
	MetaDedicatedReplicas = "loops.dedicated_replicas"
	// maxDedicatedReplicas bounds loops.dedicated_replicas.
	maxDedicatedReplicas = 8
)

// dedicatedAsk reads a run's request for a dedicated pool from its metadata: whether it
// asks, and for how many replicas.
func dedicatedAsk(meta map[string]string) (ask bool, replicas int, err error) {
	replicas = 1
	switch v := strings.ToLower(strings.TrimSpace(meta[MetaDedicated])); v {
	case "", "false", "0", "no":
	case "true", "1", "yes":
		ask = true
	default:
		return false, 0, invalidArgument("user_metadata %s=%q must be true or false", MetaDedicated, meta[MetaDedicated])
	}
	if v, ok := meta[MetaDedicatedReplicas]; ok {
		n, perr := strconv.Atoi(strings.TrimSpace(v))
		if perr != nil || n < 1 || n > maxDedicatedReplicas {
			return false, 0, invalidArgument("user_metadata %s=%q must be a whole number from 1 to %d", MetaDedicatedReplicas, v, maxDedicatedReplicas)
		}
		replicas = n
	}
	return ask, replicas, nil
}

// dedicatedFor decides at submission whether a new run of ws gets a dedicated pool, and how
// many replicas, from its request (the dedicated field, or its metadata) and the
// workspace's policy. 0: the shared pools.
func (c *Core) dedicatedFor(ws string, meta map[string]string, field *loopsv1.DedicatedPool) (int, error) {
	ask, replicas, err := dedicatedAsk(meta)
	if err != nil {
		return 0, err
	}
	if field != nil {
		n := field.GetReplicas()
		if n < 0 || n > maxDedicatedReplicas {
			return 0, invalidArgument("dedicated.replicas must be from 1 to %d (0 means 1), got %d", maxDedicatedReplicas, n)
		}
		ask, replicas = true, max(int(n), 1)
	}
	dedicated, err := c.policy.Dedicated(ws, ask)
	if err != nil || !dedicated {
		return 0, err
	}
	if c.dedicatedPools == nil {
		return 0, failedPrecondition("dedicated runs need worker pools: this gateway's backend has none (start loops serve --backend torch --backend-opt provider=local|ray); leave out user_metadata %s", MetaDedicated)
	}
	return replicas, nil
}

// acquirePool binds a dedicated pool to a run about to create its adapter (its creation
// task waits for a cold start).
func (c *Core) acquirePool(ctx context.Context, r *run, replicas int) error {
	info := r.snapshot()
	start := time.Now()
	g, err := c.dedicatedPools.AcquirePool(ctx, backends.PoolRequest{BaseModel: info.GetBaseModel(), Replicas: replicas, Workspace: r.ws, Owner: r.id})
	if err != nil {
		return err
	}
	r.mu.Lock()
	r.pool, r.poolGPUs = g.Pool, g.GPUsPerReplica
	r.mu.Unlock()
	r.update(ctx, func(i *loopsv1.TrainingRun) { i.DedicatedPool = g.Pool })
	kind := "cold"
	if g.Warm {
		kind = "warm"
	}
	c.metrics.poolBinds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	c.log.Info("dedicated pool bound to a run", slog.String("run", r.id), slog.String("pool", g.Pool), slog.String("start", kind), slog.Duration("took", time.Since(start)))
	return nil
}

// releasePool meters a run's dedicated pool a last time and releases it (kept warm).
func (c *Core) releasePool(ctx context.Context, r *run) {
	r.mu.Lock()
	pool := r.pool
	r.mu.Unlock()
	if pool == "" {
		return
	}
	c.meterPool(r, true)
	c.dedicatedPools.ReleasePool(ctx, pool)
	r.mu.Lock()
	r.pool = ""
	r.mu.Unlock()
	r.update(ctx, func(i *loopsv1.TrainingRun) { i.DedicatedPool = "" })
}

// runPool is the dedicated pool of a run ("" for the shared pools).
func (r *run) runPool() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.pool
}

// meterPool records the replica-seconds (and GPU-seconds) a run's dedicated pool ran
// since the last time, as the workspace's usage: whole seconds as they pass, and a started
// second counted whole when the pool is released (final).
func (c *Core) meterPool(r *run, final bool) {
	r.mu.Lock()
	pool, gpus := r.pool, r.poolGPUs
	r.mu.Unlock()
	if pool == "" {
		return
	}
	total := c.dedicatedPools.ReplicaSeconds(pool)
	if final {
		total = math.Ceil(total)
	}
	r.mu.Lock()
	delta := int64(total) - r.poolMetered
	if delta > 0 {
		r.poolMetered += delta
	}
	info := r.info
	r.mu.Unlock()
	if delta <= 0 {
		return
	}
	c.recordUsage(r.ws, info.GetBaseModel(), info.GetSessionId(), store.UsageDedicatedReplicaSeconds, delta)
	if gpus > 0 {
		c.recordUsage(r.ws, info.GetBaseModel(), info.GetSessionId(), store.UsageDedicatedGPUSeconds, delta*int64(gpus))
	}
}

// samplerPool is the dedicated pool that samples a checkpoint (tinker path): that of the
// run that saved it while the run holds one, else "" (the shared pools).
func (c *Core) samplerPool(path string) string {
	if c.dedicatedPools == nil || path == "" {
		return ""
	}
	runID, _, _, err := ParsePath(path)
	if err != nil {
		return ""
	}
	if r := c.runs.peek(runID); r != nil {
		return r.runPool()
	}
	return ""
}

// meterPools meters every live run's dedicated pool (the janitor's round).
func (c *Core) meterPools() {
	if c.dedicatedPools == nil {
		return
	}
	for _, r := range c.runs.all() {
		c.meterPool(r, false)
	}
}
