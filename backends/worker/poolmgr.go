package worker

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"slices"
	"strings"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/backends/pools"
)

// This file is the backend's backends.PoolManager: the pools of pool mode (pool.go) as an
// operator sees and changes them through the gateway's PoolService (docs/pools.md).

var _ backends.PoolManager = (*Backend)(nil)

// gpuAssigner is a provider that knows which GPUs each replica holds (the local provider).
type gpuAssigner interface {
	GPUs(pool string, replica int) []string
}

// poolDef is the shape of one pool the backend manages.
type poolDef struct {
	id, role, baseModel string
	gpusPerReplica      int
	gpuKind             string
	preemptible         bool
}

// poolDefs returns the pools the backend's provider manages now, by id: the shared pool of
// each model, and any other the backend made (sampler pools, dedicated pools). Their shape
// comes from the provider (pools.SpecReader); a provider without it is taken to run the
// backend's own shared pools, with the backend's options.
func (b *Backend) poolDefs() []poolDef {
	sr, _ := b.pools.(pools.SpecReader)
	var out []poolDef
	for _, id := range b.registry.Pools() {
		if _, managed := b.registry.Desired(id); !managed {
			continue // replicas registered for a pool no provider of ours runs
		}
		if sr != nil {
			if spec, ok := sr.Spec(id); ok {
				name, _, _ := strings.Cut(spec.BaseModel, "=")
				out = append(out, poolDef{id: id, role: string(spec.Role), baseModel: name, gpusPerReplica: spec.GPUsPerReplica, gpuKind: spec.GPUKind, preemptible: spec.Preemptible})
			}
			continue
		}
		for _, m := range b.opts.Models {
			if PoolID(m) == id {
				name, _, _ := strings.Cut(m, "=")
				out = append(out, poolDef{id: id, role: string(pools.RoleTrainer), baseModel: name,
					gpusPerReplica: b.opts.Pool.GPUsPerReplica, gpuKind: b.opts.Pool.GPUKind, preemptible: b.opts.Pool.Preemptible})
			}
		}
	}
	return out
}

// livePool returns the managed pool named id and its desired size, or NotFound.
func (b *Backend) livePool(id string) (poolDef, int, error) {
	for _, d := range b.poolDefs() {
		if d.id == id {
			n, _ := b.registry.Desired(id)
			return d, n, nil
		}
	}
	return poolDef{}, 0, connect.NewError(connect.CodeNotFound, fmt.Errorf("pool %q does not exist (or was deleted; the pools of the served models come back when loops serve restarts): loops pools list shows the pools", id))
}

// notDedicated refuses to change a dedicated pool: it follows its run (scaled to zero when
// idle and back on the next call, deleted after its keep-warm period), and the backend's
// bookkeeping of it would no longer match the provider's.
func (b *Backend) notDedicated(id string) error {
	b.mu.Lock()
	_, ded := b.dedicated[id]
	b.mu.Unlock()
	if ded {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf("pool %s is a dedicated run's pool and follows its run (scaled to zero when idle, deleted after its keep-warm period): end the run instead; loops allocations --pool %s names it", id, id))
	}
	return nil
}

// errNoPools is the error of every PoolManager method without pool mode.
func errNoPools() error {
	return fmt.Errorf("%w: the torch backend runs its workers without a pool provider (backend option provider=local|static|ray)", backends.ErrNoPools)
}

// ListPools implements backends.PoolManager.
func (b *Backend) ListPools(context.Context) ([]backends.PoolInfo, error) {
	if b.pools == nil {
		return nil, errNoPools()
	}
	var out []backends.PoolInfo
	for _, d := range b.poolDefs() {
		n, _ := b.registry.Desired(d.id)
		out = append(out, b.poolInfo(d, n))
	}
	return out, nil
}

// poolInfo describes pool d, scaled to desired.
func (b *Backend) poolInfo(d poolDef, desired int) backends.PoolInfo {
	info := backends.PoolInfo{ID: d.id, Role: d.role, BaseModel: d.baseModel, Provider: b.opts.Pool.Provider,
		DesiredReplicas: max(desired, 0), RegisteredReplicas: len(b.registry.Members(d.id)), GPUsPerReplica: d.gpusPerReplica,
		GPUKind: d.gpuKind, Preemptible: d.preemptible}
	for _, u := range b.registry.Usage(d.id) {
		info.ReplicaSeconds += u.Registered.Seconds()
	}
	info.GPUSeconds = info.ReplicaSeconds * float64(d.gpusPerReplica)
	b.dedicatedInfo(&info)
	return info
}

// ScalePool implements backends.PoolManager. The backend's pools share its pool_slots; a
// deployment that changes later scales the pool again to what the deployments want
// (ScaleSamplers). A dedicated run's pool follows its run and is not scaled by hand.
func (b *Backend) ScalePool(ctx context.Context, id string, replicas int) error {
	if b.pools == nil {
		return errNoPools()
	}
	if replicas < 0 || replicas > pools.MaxReplicas {
		return connect.NewError(connect.CodeInvalidArgument, fmt.Errorf("replicas %d must be between 0 and %d", replicas, pools.MaxReplicas))
	}
	_, _, err := b.livePool(id)
	b.mu.Lock()
	spec, shared := b.shared[id]
	b.mu.Unlock()
	if err != nil && !shared {
		return err
	}
	if err := b.notDedicated(id); err != nil {
		return err
	}
	others := 0
	for _, d := range b.poolDefs() {
		if n, _ := b.registry.Desired(d.id); d.id != id {
			others += max(n, 0)
		}
	}
	if others+replicas > b.poolSlots {
		return connect.NewError(connect.CodeFailedPrecondition, fmt.Errorf(
			"pool %s: %d replicas do not fit: the backend has %d worker slots for all its pools (backend option pool_slots) and the other pools want %d", id, replicas, b.poolSlots, others))
	}
	if err != nil { // a shared pool an operator deleted: created again at that size
		spec.Replicas = replicas
		if err := b.pools.EnsurePool(ctx, spec); err != nil {
			return providerErr(connect.CodeFailedPrecondition, err)
		}
		b.log.Info("pool created again by an operator", slog.String("pool", id), slog.Int("replicas", replicas))
		return nil
	}
	if err := b.pools.ScalePool(ctx, id, replicas); err != nil {
		return providerErr(connect.CodeFailedPrecondition, err)
	}
	b.log.Info("pool scaled by an operator", slog.String("pool", id), slog.Int("replicas", replicas))
	return nil
}

// DeletePool implements backends.PoolManager. A dedicated run's pool is not deleted by hand.
func (b *Backend) DeletePool(ctx context.Context, id string) error {
	if b.pools == nil {
		return errNoPools()
	}
	if _, _, err := b.livePool(id); err != nil {
		return err
	}
	if err := b.notDedicated(id); err != nil {
		return err
	}
	if err := b.pools.DeletePool(ctx, id); err != nil {
		return providerErr(connect.CodeUnavailable, err)
	}
	b.log.Info("pool deleted by an operator", slog.String("pool", id))
	return nil
}

// providerErr classifies a provider's error: a connect error keeps its code, an unknown
// pool is NotFound, anything else gets code (the provider's message says why).
func providerErr(code connect.Code, err error) error {
	var ce *connect.Error
	switch {
	case errors.As(err, &ce):
		return err
	case errors.Is(err, pools.ErrNoPool):
		return connect.NewError(connect.CodeNotFound, err)
	}
	return connect.NewError(code, err)
}

// Allocations implements backends.PoolManager.
func (b *Backend) Allocations(_ context.Context, id string) ([]backends.Allocation, error) {
	if b.pools == nil {
		return nil, errNoPools()
	}
	type poolAt struct {
		def     poolDef
		desired int
	}
	var want []poolAt
	if id != "" {
		d, n, err := b.livePool(id)
		if err != nil {
			return nil, err
		}
		want = append(want, poolAt{d, n})
	} else {
		for _, d := range b.poolDefs() {
			n, _ := b.registry.Desired(d.id)
			want = append(want, poolAt{d, n})
		}
	}
	held := b.heldAdapters()
	var out []backends.Allocation
	for _, p := range want {
		out = append(out, b.poolAllocations(p.def, p.desired, held)...)
	}
	return out, nil
}

// slotView is what one worker slot holds, read under its lock.
type slotView struct {
	addr     string
	alive    bool
	adapters []string
}

// heldAdapters maps the attached replicas (pool, replica) to their slot's address, health
// and adapters.
func (b *Backend) heldAdapters() map[slotKey]slotView {
	b.mu.Lock()
	byWorker := map[*worker][]string{}
	for id, w := range b.adapters {
		byWorker[w] = append(byWorker[w], id)
	}
	b.mu.Unlock()
	out := map[slotKey]slotView{}
	for _, w := range b.workers {
		if !w.pooled {
			continue
		}
		w.mu.Lock()
		k, v := slotKey{w.pool, w.replica}, slotView{addr: w.addr, alive: w.alive}
		w.mu.Unlock()
		if k.pool == "" {
			continue
		}
		v.adapters = byWorker[w]
		slices.Sort(v.adapters)
		out[k] = v
	}
	return out
}

// poolAllocations lists pool d's replicas: 0 .. desired-1 and any other registered one.
func (b *Backend) poolAllocations(d poolDef, desired int, held map[slotKey]slotView) []backends.Allocation {
	members := map[int]pools.Member{}
	for _, m := range b.registry.Members(d.id) {
		members[m.Replica] = m
	}
	usage := map[int]pools.SlotUsage{}
	for _, u := range b.registry.Usage(d.id) {
		usage[u.Replica] = u
	}
	idx := make([]int, 0, max(desired, 0)+len(members))
	for i := range max(desired, 0) {
		idx = append(idx, i)
	}
	for i := range members {
		if i >= desired {
			idx = append(idx, i)
		}
	}
	slices.Sort(idx)
	ga, _ := b.pools.(gpuAssigner)
	out := make([]backends.Allocation, 0, len(idx))
	for _, i := range idx {
		a := backends.Allocation{Pool: d.id, Role: d.role, BaseModel: d.baseModel, Replica: i, GPUs: d.gpusPerReplica}
		if ga != nil {
			if ids := ga.GPUs(d.id, i); len(ids) > 0 {
				a.GPUIDs, a.GPUs = ids, len(ids)
			}
		}
		u := usage[i]
		a.ReplicaSeconds = u.Registered.Seconds()
		a.GPUSeconds = a.ReplicaSeconds * float64(d.gpusPerReplica)
		if m, ok := members[i]; ok {
			a.State, a.Address, a.Incarnation, a.Since = backends.AllocationRegistered, m.Address, m.Incarnation, m.Since
			if v, ok := held[slotKey{d.id, i}]; ok && v.alive && v.addr == m.Address {
				a.State, a.Adapters = backends.AllocationAttached, v.adapters
			}
		} else if !u.LostAt.IsZero() {
			a.State, a.Since, a.Reason = backends.AllocationLost, u.LostAt, b.registry.LostReason(d.id, i)
		} else {
			a.State = backends.AllocationStarting
		}
		out = append(out, a)
	}
	return out
}
