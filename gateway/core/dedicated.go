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
	// MetaDedicatedSamplerReplicas asks for sampler replicas beside them (0-8, default 0).
	MetaDedicatedSamplerReplicas = "loops.dedicated_sampler_replicas"
	// maxDedicatedReplicas bounds loops.dedicated_replicas.
	maxDedicatedReplicas = 8
)

// dedicatedShape is what a dedicated run asks for: replicas that train (and sample), and
// sampler replicas beside them. Zero replicas: the shared pools.
type dedicatedShape struct{ replicas, samplers int }

// dedicatedAsk reads a run's request for a dedicated pool from its metadata.
func dedicatedAsk(meta map[string]string) (ask bool, shape dedicatedShape, err error) {
	shape.replicas = 1
	switch v := strings.ToLower(strings.TrimSpace(meta[MetaDedicated])); v {
	case "", "false", "0", "no":
	case "true", "1", "yes":
		ask = true
	default:
		return false, shape, invalidArgument("user_metadata %s=%q must be true or false", MetaDedicated, meta[MetaDedicated])
	}
	for _, f := range []struct {
		key string
		min int
		dst *int
	}{{MetaDedicatedReplicas, 1, &shape.replicas}, {MetaDedicatedSamplerReplicas, 0, &shape.samplers}} {
		if v, ok := meta[f.key]; ok {
			n, perr := strconv.Atoi(strings.TrimSpace(v))
			if perr != nil || n < f.min || n > maxDedicatedReplicas {
				return false, shape, invalidArgument("user_metadata %s=%q must be a whole number from %d to %d", f.key, v, f.min, maxDedicatedReplicas)
			}
			*f.dst = n
		}
	}
	return ask, shape, nil
}

// dedicatedFor decides at submission whether a new run of ws gets a dedicated pool, and of
// what shape, from its request (the dedicated field, or its metadata) and the workspace's
// policy.
func (c *Core) dedicatedFor(ws string, meta map[string]string, field *loopsv1.DedicatedPool) (dedicatedShape, error) {
	ask, shape, err := dedicatedAsk(meta)
	if err != nil {
		return dedicatedShape{}, err
	}
	if field != nil {
		n, s := field.GetReplicas(), field.GetSamplerReplicas()
		if n < 0 || n > maxDedicatedReplicas || s < 0 || s > maxDedicatedReplicas {
			return dedicatedShape{}, invalidArgument("dedicated.replicas must be from 1 to %d (0 means 1) and dedicated.sampler_replicas from 0 to %d, got %d and %d", maxDedicatedReplicas, maxDedicatedReplicas, n, s)
		}
		ask, shape = true, dedicatedShape{replicas: max(int(n), 1), samplers: int(s)}
	}
	dedicated, err := c.policy.Dedicated(ws, ask)
	if err != nil || !dedicated {
		return dedicatedShape{}, err
	}
	if c.dedicatedPools == nil {
		return dedicatedShape{}, failedPrecondition("dedicated runs need worker pools: this gateway's backend has none (start loops serve --backend torch --backend-opt provider=local|ray); leave out user_metadata %s", MetaDedicated)
	}
	return shape, nil
}

// acquirePool binds a dedicated pool to a run about to create its adapter (its creation
// task waits for a cold start).
func (c *Core) acquirePool(ctx context.Context, r *run, shape dedicatedShape) error {
	info := r.Record()
	start := time.Now()
	g, err := c.dedicatedPools.AcquirePool(ctx, backends.PoolRequest{BaseModel: info.GetBaseModel(), Replicas: shape.replicas, SamplerReplicas: shape.samplers, Workspace: r.Workspace(), Owner: r.ID()})
	if err != nil {
		return err
	}
	r.SetPool(g.Pool, g.GPUsPerReplica, g.GPUKind)
	c.updateRun(r, func(i *loopsv1.TrainingRun) { i.DedicatedPool = g.Pool })
	kind := "cold"
	if g.Warm {
		kind = "warm"
	}
	c.metrics.poolBinds.WithLabelValues(kind).Observe(time.Since(start).Seconds())
	c.log.Info("dedicated pool bound to a run", slog.String("run", r.ID()), slog.String("pool", g.Pool), slog.String("start", kind), slog.Duration("took", time.Since(start)))
	return nil
}

// releasePool meters a run's dedicated pool a last time and releases it (kept warm).
func (c *Core) releasePool(ctx context.Context, r *run) {
	pool := r.Pool()
	if pool == "" {
		return
	}
	c.meterPool(r, true)
	c.dedicatedPools.ReleasePool(ctx, pool)
	r.ClearPool()
	c.updateRun(r, func(i *loopsv1.TrainingRun) { i.DedicatedPool = "" })
}

// meterPool records the replica-seconds (and GPU-seconds) a run's dedicated pool ran
// since the last time, as the workspace's usage: whole seconds as they pass, and a started
// second counted whole when the pool is released (final).
func (c *Core) meterPool(r *run, final bool) {
	pool := r.Pool()
	if pool == "" {
		return
	}
	total := c.dedicatedPools.ReplicaSeconds(pool)
	if final {
		total = math.Ceil(total)
	}
	delta, gpus := r.MeterPool(int64(total))
	if delta <= 0 {
		return
	}
	info := r.Record()
	c.recordUsage(r.Workspace(), info.GetBaseModel(), info.GetSessionId(), store.UsageDedicatedReplicaSeconds, delta)
	if gpus > 0 { // priced by the pool's GPU kind
		c.recordUsageIn(nil, c.now().UTC().Truncate(usageBucket), r.Workspace(), info.GetBaseModel(), info.GetSessionId(), "",
			store.UsageDedicatedGPUSeconds, delta*int64(gpus), r.PoolGPUKind())
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
		return r.Pool()
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
