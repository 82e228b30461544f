package worker

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"strings"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
)

// Dedicated pools (backends.DedicatedPools), in pool mode. A run that asks for one gets
// pools of its own: "ded-<model>-<random>", N replicas of its base model started by the
// backend's provider beside the shared pools (which serverless runs keep using: pick and
// routeSample keep shared and dedicated replicas apart). When the run ends its pool is
// released: kept warm for KeepWarm and bound to the next request of the same shape (base
// model and replicas) instead of starting one cold, then deleted. A bound pool with no call
// for IdleToZero is scaled to zero replicas; its next CreateAdapter or Sample scales it up
// again and waits for a replica, and the core's step recovery rebuilds the run's adapter.

// Defaults of the dedicated-pool knobs (PoolOptions).
const (
	DefaultKeepWarm   = 10 * time.Minute
	DefaultIdleToZero = 30 * time.Minute
)

// dedicatedPool is one dedicated pool (guarded by Backend.mu).
type dedicatedPool struct {
	id, model string
	replicas  int
	// the pool of its sampler replicas ("" when none), and their number
	samplerID       string
	samplerReplicas int
	ws, owner       string // who holds it; empty while warm
	warmTimer       *time.Timer
	zero            bool      // scaled to zero for idleness
	zeroReason      string    // why, when the gateway scaled it (ScaleIdleToZero)
	lastUse         time.Time // the last call on it
	// starting counts the calls waiting for a replica of it to serve (a cold start, or
	// a scale-up from zero): a pool being started is never idle.
	starting int
	// replica-seconds while bound and not at zero: counted up to since
	seconds float64
	since   time.Time
}

// inPoolLocked reports whether a replica of pool wpool belongs to the pool asked for: the
// dedicated pool itself, or ("") any shared pool. b.mu must be held.
func (b *Backend) inPoolLocked(wpool, asked string) bool {
	if asked != "" {
		d := b.dedicated[asked]
		return wpool == asked || d != nil && d.samplerID != "" && wpool == d.samplerID
	}
	_, dedicated := b.dedicated[wpool]
	return !dedicated
}

var _ backends.DedicatedPools = (*Backend)(nil)

// AcquirePool binds a warm pool of the request's shape or starts one, and waits (up to the
// start timeout) until one of its replicas serves.
func (b *Backend) AcquirePool(ctx context.Context, req backends.PoolRequest) (backends.PoolGrant, error) {
	if b.pools == nil {
		return backends.PoolGrant{}, connect.NewError(connect.CodeFailedPrecondition, errors.New("dedicated pools need a worker pool provider: start the backend with provider=local|static|ray"))
	}
	if b.opts.Pool.Provider == "static" {
		return backends.PoolGrant{}, connect.NewError(connect.CodeFailedPrecondition, errors.New("dedicated pools need a provider that starts workers (local or ray); provider=static has a fixed set"))
	}
	replicas, samplers := max(req.Replicas, 1), max(req.SamplerReplicas, 0)
	marg, err := b.modelArg(req.BaseModel)
	if err != nil {
		return backends.PoolGrant{}, err
	}
	now := time.Now()
	b.mu.Lock()
	for _, d := range b.dedicated {
		if d.owner == "" && d.model == req.BaseModel && d.replicas == replicas && d.samplerReplicas == samplers {
			d.warmTimer.Stop()
			d.ws, d.owner, d.lastUse, d.since = req.Workspace, req.Owner, now, now
			b.mu.Unlock()
			b.log.Info("dedicated pool bound warm", slog.String("pool", d.id), slog.String("run", req.Owner))
			return backends.PoolGrant{Pool: d.id, Warm: true, GPUsPerReplica: b.opts.Pool.GPUsPerReplica, GPUKind: b.opts.Pool.GPUKind}, nil
		}
	}
	used := (b.poolReplicas + b.samplerReplicas) * len(b.opts.Models)
	for _, d := range b.dedicated {
		if !d.zero {
			used += d.replicas + d.samplerReplicas
		}
	}
	if used+replicas+samplers > b.poolSlots {
		b.mu.Unlock()
		return backends.PoolGrant{}, connect.NewError(connect.CodeResourceExhausted, fmt.Errorf("no room for a dedicated pool of %d replicas: %d of the backend's %d replica slots (pool_slots) are in use; end a dedicated run, or retry when a warm pool expires", replicas+samplers, used, b.poolSlots))
	}
	var r [4]byte
	_, _ = rand.Read(r[:])
	id := "ded-" + strings.TrimPrefix(PoolID(req.BaseModel), "torch-")
	id = id[:min(len(id), 110)] + "-" + hex.EncodeToString(r[:])
	d := &dedicatedPool{id: id, model: req.BaseModel, replicas: replicas, samplerReplicas: samplers, ws: req.Workspace, owner: req.Owner, lastUse: now, since: now}
	specs := []pools.Spec{{ID: id, Role: pools.RoleTrainer, BaseModel: marg, Replicas: replicas, GPUsPerReplica: b.opts.Pool.GPUsPerReplica, GPUKind: b.opts.Pool.GPUKind,
		Preemptible: b.opts.Pool.Preemptible, Args: b.poolArgs()}}
	if samplers > 0 {
		d.samplerID = id + "-s"
		s := specs[0]
		s.ID, s.Role, s.Replicas = d.samplerID, pools.RoleSampler, samplers
		specs = append(specs, s)
		b.roles[d.samplerID] = pools.RoleSampler
	}
	b.dedicated[id] = d
	b.mu.Unlock()
	for _, spec := range specs {
		if err := b.pools.EnsurePool(ctx, spec); err != nil {
			b.deleteDedicated(context.WithoutCancel(ctx), id, "it could not be started")
			return backends.PoolGrant{}, connect.NewError(connect.CodeUnavailable, fmt.Errorf("starting a dedicated pool: %w", err))
		}
	}
	b.log.Info("dedicated pool starting", slog.String("pool", id), slog.String("run", req.Owner), slog.Int("replicas", replicas))
	if err := b.waitStarting(ctx, d, false); err != nil {
		b.deleteDedicated(context.WithoutCancel(ctx), id, "no replica served in time")
		return backends.PoolGrant{}, err
	}
	return backends.PoolGrant{Pool: id, GPUsPerReplica: b.opts.Pool.GPUsPerReplica, GPUKind: b.opts.Pool.GPUKind}, nil
}

// waitPool waits until a trainer replica of pool serves (with sampling, one of its sampler
// replicas will do), up to the start timeout.
func (b *Backend) waitPool(ctx context.Context, pool string, sampling bool) error {
	wctx, cancel := context.WithTimeout(ctx, b.opts.StartTimeout)
	defer cancel()
	for !b.poolServes(pool, sampling) {
		select {
		case <-wctx.Done():
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("no replica of dedicated pool %s served within %v", pool, b.opts.StartTimeout))
		case <-time.After(100 * time.Millisecond):
		}
	}
	return nil
}

// poolServes reports whether an alive trainer replica of pool is attached (with sampling,
// or one of its sampler replicas).
func (b *Backend) poolServes(pool string, sampling bool) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, w := range b.workers {
		w.mu.Lock()
		ok := w.alive && (w.pool == pool || sampling && b.inPoolLocked(w.pool, pool))
		w.mu.Unlock()
		if ok {
			return true
		}
	}
	return false
}

// ReleasePool unbinds a dedicated pool and keeps it warm for KeepWarm (then deletes it).
func (b *Backend) ReleasePool(ctx context.Context, pool string) {
	now := time.Now()
	b.mu.Lock()
	d := b.dedicated[pool]
	if d == nil || d.owner == "" {
		b.mu.Unlock()
		return
	}
	d.count(now)
	d.ws, d.owner = "", ""
	keep := b.opts.Pool.KeepWarm
	if d.zero || keep <= 0 {
		b.mu.Unlock()
		b.deleteDedicated(context.WithoutCancel(ctx), pool, "released")
		return
	}
	d.warmTimer = time.AfterFunc(keep, func() { b.expireWarm(pool) })
	b.mu.Unlock()
	b.log.Info("dedicated pool released; kept warm", slog.String("pool", pool), slog.Duration("for", keep))
}

// expireWarm deletes a pool still warm (unbound) when its keep-warm period ends.
func (b *Backend) expireWarm(pool string) {
	b.mu.Lock()
	d := b.dedicated[pool]
	warm := d != nil && d.owner == ""
	b.mu.Unlock()
	if warm {
		b.deleteDedicated(b.ctx, pool, "its keep-warm period ended")
	}
}

// deleteDedicated forgets a dedicated pool and deletes it (and its sampler pool).
func (b *Backend) deleteDedicated(ctx context.Context, pool, why string) {
	b.mu.Lock()
	ids := []string{pool}
	if d := b.dedicated[pool]; d != nil && d.samplerID != "" {
		ids = append(ids, d.samplerID)
		delete(b.roles, d.samplerID)
	}
	delete(b.dedicated, pool)
	b.mu.Unlock()
	for _, id := range ids {
		if err := b.pools.DeletePool(ctx, id); err != nil {
			b.log.Error("deleting a dedicated pool", slog.String("pool", id), slog.Any("err", err))
			return
		}
	}
	b.log.Info("dedicated pool deleted", slog.String("pool", pool), slog.String("why", why))
}

// scaleDedicated scales a dedicated pool and its sampler pool to their sizes (up) or to zero.
func (b *Backend) scaleDedicated(ctx context.Context, d *dedicatedPool, up bool) error {
	n, s := 0, 0
	if up {
		n, s = d.replicas, d.samplerReplicas
	}
	if err := b.pools.ScalePool(ctx, d.id, n); err != nil {
		return err
	}
	if d.samplerID != "" {
		return b.pools.ScalePool(ctx, d.samplerID, s)
	}
	return nil
}

// count adds the replica-seconds since d.since (bound and not at zero). b.mu held.
func (d *dedicatedPool) count(now time.Time) {
	if d.owner != "" && !d.zero {
		d.seconds += now.Sub(d.since).Seconds() * float64(d.replicas+d.samplerReplicas)
	}
	d.since = now
}

// dedicatedInfo fills in who holds a dedicated pool (or its sampler pool), for the
// operator's views.
func (b *Backend) dedicatedInfo(info *backends.PoolInfo) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, d := range b.dedicated {
		if d.id == info.ID || d.samplerID == info.ID {
			info.Workspace, info.Run, info.Warm, info.Idle, info.ZeroReason = d.ws, d.owner, d.owner == "", d.zero, d.zeroReason
		}
	}
}

// ReplicaSeconds is the replica-seconds the pool ran bound (scaled-to-zero time excluded).
func (b *Backend) ReplicaSeconds(pool string) float64 {
	b.mu.Lock()
	defer b.mu.Unlock()
	d := b.dedicated[pool]
	if d == nil {
		return 0
	}
	d.count(time.Now())
	return d.seconds
}

// usePool records a call on a dedicated pool and, when it was scaled to zero, scales it up
// again and waits (up to the start timeout) until a replica serves. An unknown pool answers
// FailedPrecondition.
func (b *Backend) usePool(ctx context.Context, pool string, sampling bool) error {
	if pool == "" {
		return nil
	}
	now := time.Now()
	b.mu.Lock()
	d := b.dedicated[pool]
	if d == nil {
		b.mu.Unlock()
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("dedicated pool %s does not exist (it was released or deleted)", pool))
	}
	d.lastUse = now
	wake := d.zero
	if wake {
		d.zero, d.zeroReason, d.since = false, "", now
	}
	b.mu.Unlock()
	if wake {
		if err := b.scaleDedicated(ctx, d, true); err != nil {
			return connect.NewError(connect.CodeUnavailable, fmt.Errorf("scaling dedicated pool %s up again: %w", pool, err))
		}
		b.log.Info("dedicated pool scaled up again after idling at zero", slog.String("pool", pool), slog.Int("replicas", d.replicas), slog.Int("sampler_replicas", d.samplerReplicas))
	}
	return b.waitStarting(ctx, d, sampling) // Unavailable when it does not come up in time
}

// waitStarting is waitPool for a dedicated pool, which counts as in use (never scaled to
// zero for idleness) while the wait lasts and from its end.
func (b *Backend) waitStarting(ctx context.Context, d *dedicatedPool, sampling bool) error {
	b.mu.Lock()
	d.starting++
	b.mu.Unlock()
	defer func() {
		b.mu.Lock()
		d.starting--
		d.lastUse = time.Now()
		b.mu.Unlock()
	}()
	return b.waitPool(ctx, d.id, sampling)
}

// touchAdapter records a call on the dedicated pool holding the adapter bound to w. b.mu
// held.
func (b *Backend) touchLocked(w *worker) {
	w.mu.Lock()
	pool := w.pool
	w.mu.Unlock()
	if d := b.dedicated[pool]; d != nil {
		d.lastUse = time.Now()
	}
}

// ScaleIdleToZero scales a bound dedicated pool with no call for idle to zero now, for a
// reason of the gateway's (backends.PoolZeroer).
func (b *Backend) ScaleIdleToZero(ctx context.Context, pool string, idle time.Duration, reason string) (bool, error) {
	now := time.Now()
	b.mu.Lock()
	d := b.dedicated[pool]
	if d == nil || d.owner == "" || d.zero || d.starting > 0 || now.Sub(d.lastUse) < idle {
		b.mu.Unlock()
		return false, nil
	}
	d.count(now)
	d.zero, d.zeroReason = true, reason
	b.mu.Unlock()
	if err := b.scaleDedicated(ctx, d, false); err != nil {
		return false, err
	}
	b.log.Info("dedicated pool scaled to zero", slog.String("pool", pool), slog.String("why", reason))
	return true, nil
}

// idleToZero scales bound dedicated pools with no call for IdleToZero down to zero
// replicas; their runs' adapters are lost and rebuilt (step recovery) when they return.
func (b *Backend) idleToZero() {
	idle := b.opts.Pool.IdleToZero
	if idle <= 0 {
		return
	}
	t := time.NewTicker(max(idle/4, 50*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-b.ctx.Done():
			return
		case <-t.C:
		}
		now := time.Now()
		var down []*dedicatedPool
		b.mu.Lock()
		for _, d := range b.dedicated {
			if d.owner != "" && !d.zero && d.starting == 0 && now.Sub(d.lastUse) >= idle {
				d.count(now)
				d.zero, d.zeroReason = true, "idle_to_zero: no call for "+idle.String()
				down = append(down, d)
			}
		}
		b.mu.Unlock()
		for _, d := range down {
			if err := b.scaleDedicated(b.ctx, d, false); err != nil {
				b.log.Error("scaling an idle dedicated pool to zero", slog.String("pool", d.id), slog.Any("err", err))
				continue
			}
			b.log.Info("dedicated pool scaled to zero after idling", slog.String("pool", d.id), slog.Duration("idle", idle))
		}
	}
}

// modelArg is the worker --model argument of a served base model.
func (b *Backend) modelArg(base string) (string, error) {
	margs, err := b.modelArgs()
	if err != nil {
		return "", err
	}
	for i := 1; i < len(margs); i += 2 {
		if name, _, _ := strings.Cut(margs[i], "="); name == base {
			return margs[i], nil
		}
	}
	return "", connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("base model %q is not served by this backend", base))
}

// poolArgs are the worker arguments every pool of the backend gets.
func (b *Backend) poolArgs() []string {
	args := []string{"--max-lora-rank", strconv.Itoa(b.opts.MaxLoraRank)}
	for _, o := range b.opts.CheckpointOrigins {
		args = append(args, "--checkpoint-origin", o)
	}
	return append(args, b.opts.Args...)
}
