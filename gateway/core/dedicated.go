package core

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// Dedicated runs. A run may ask for worker replicas of its own instead of the shared pools
// of serverless mode: user_metadata "loops.dedicated" = "true" (what a tinker script
// passes to create_lora_training_client(user_metadata=…)), with "loops.dedicated_replicas"
// (1-8, default 1); a workspace's policy may refuse it or make it the default (dedicated:
// off|allowed|always). The backend (backends.DedicatedPools) binds a warm pool of that shape
// or starts one while the run's creation waits, keeps the pool when the run ends for its
// keep-warm period, and scales a pool idle long enough to zero. Dedicated runs keep step
// recovery, so a pool that was scaled to zero (or lost a replica) rebuilds the run's adapter
// on its next call. The replicas' time is metered per workspace and run, under the API key
// that created the run, as dedicated replica-seconds and GPU-seconds, beside the serverless
// token meters.

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
	r.SetPool(g.Pool, shape.replicas+shape.samplers, g.GPUsPerReplica, g.GPUKind)
	c.updateRun(r, func(i *loopsv1.TrainingRun) { i.DedicatedPool = g.Pool })
	if err := c.holdPool(ctx, r, ", so the pool is released and the run is not created"); err != nil {
		c.releasePool(ctx, r) // its time so far (under a second) is metered
		return err
	}
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
	c.releaseLease(r.ID())
	c.dedicatedPools.ReleasePool(ctx, pool)
	r.ClearPool()
	c.updateRun(r, func(i *loopsv1.TrainingRun) { i.DedicatedPool = "" })
}

// meterPool records the replica-seconds (and GPU-seconds) a run's dedicated pool ran
// since the last time, as the workspace's usage kept under the API key that created the
// run (its owner; "" for runs created before owners were recorded): whole seconds as they
// pass, and a started second counted whole when the pool is released (final).
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
	rd := reading{bucket: c.now().UTC().Truncate(usageBucket), ws: r.Workspace(), model: info.GetBaseModel(), session: info.GetSessionId(),
		run: r.ID(), key: info.GetOwner(), kind: store.UsageDedicatedReplicaSeconds, amount: delta}
	c.recordUsageIn(nil, rd)
	if gpus > 0 { // priced by the pool's GPU kind
		rd.kind, rd.amount, rd.gpuKind = store.UsageDedicatedGPUSeconds, delta*int64(gpus), r.PoolGPUKind()
		c.recordUsageIn(nil, rd)
	}
}

// poolRunOf is the run whose dedicated pool samples a checkpoint (tinker path): the run that
// saved it while the run holds a pool; nil for the shared pools.
func (c *Core) poolRunOf(path string) *run {
	if c.dedicatedPools == nil || path == "" {
		return nil
	}
	runID, _, _, err := ParsePath(path)
	if err != nil {
		return nil
	}
	if r := c.runs.peek(runID); r != nil && r.Pool() != "" {
		return r
	}
	return nil
}

// capIdle is how long a dedicated pool of a workspace at a budget's cap must have had no call
// before the janitor scales it to zero (zeroPoolsAtCap): work admitted before the cap ends.
const capIdle = time.Minute

// zeroPoolsAtCap scales the idle dedicated pools of workspaces at a budget's cap to zero
// (backends.PoolZeroer), so they stop billing while no work can be admitted; each is
// audited (pool_scale_to_zero) and shows its reason in loops pools. The run keeps its pool:
// its next call, once the budget is raised, scales it up again.
func (c *Core) zeroPoolsAtCap(ctx context.Context) {
	z, ok := c.dedicatedPools.(backends.PoolZeroer)
	if !ok {
		return
	}
	for _, r := range c.runs.all() {
		pool := r.Pool()
		if pool == "" {
			continue
		}
		why, at := c.atCap(r.Workspace())
		if !at {
			continue
		}
		c.meterPool(r, false) // its time up to now
		down, err := z.ScaleIdleToZero(ctx, pool, capIdle, why)
		if err != nil {
			c.log.Error("scaling a dedicated pool at its workspace's budget cap to zero", slog.String("pool", pool), slog.Any("err", err))
			continue
		}
		if !down {
			continue
		}
		c.log.Info("dedicated pool scaled to zero: its workspace is at a budget's cap", slog.String("pool", pool), slog.String("run", r.ID()), slog.String("why", why))
		err = c.store.AppendAuditEvents(ctx, []store.OwnedAuditEvent{{Workspace: r.Workspace(), Event: store.AuditEvent{
			Time: c.now().UTC(), Surface: "budget", Action: why, Event: "pool_scale_to_zero", Resource: "pool", Target: pool,
			Status: http.StatusOK, Code: "ok"}}})
		if err != nil {
			c.log.Error("auditing a dedicated pool scaled to zero", slog.String("pool", pool), slog.Any("err", err))
		}
	}
}

// atCap reports whether ws's loaded spend has reached one of its budgets, and says which.
func (c *Core) atCap(ws string) (string, bool) {
	l, ok := c.budgeted(ws)
	if !ok {
		return "", false
	}
	b := c.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[spendID{ws: ws}]
	if e == nil || !e.loaded {
		return "", false
	}
	e.rollLocked(c.now())
	for _, bud := range budgetsOf(e, [2]money.USD{l.BudgetMonth, l.BudgetTotal}) {
		if bud.limit > 0 && reaches(bud.spent, bud.limit, 100) {
			return fmt.Sprintf("workspace %s reached its %s (%s of %s USD spent): its idle dedicated pools are scaled to zero until an operator raises it", ws, bud.name, bud.spent, bud.limit), true
		}
	}
	return "", false
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
