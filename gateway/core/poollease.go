package core

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
)

// Dedicated pool leases (docs/operations.md, "Budgets"). A dedicated pool bills for its
// time while its run holds it, busy or idle, so no operation's estimate covers it. The
// pool's time is metered under the API key that created its run (the run record's owner),
// and a pool whose workspace or owner key has a budget therefore holds a lease: the cost
// of the look-ahead (poolLookahead) of the pool's time at its full shape (every replica
// and GPU), reserved against the workspace's budgets and the owner key's (the same
// reservation as an operation's estimate: reserveLocked) beside the operations'
// estimates. A run created before owners were recorded has none: its pool is held to the
// workspace's budgets only. The pool's metered time is taken off the lease as it is spent
// (spendPool), and the lease is topped up to a whole look-ahead again at each admission
// of the run's work or of a sample on its pool (holdPool), and at each janitor sweep
// (renewLeases). When topping it up would pass a budget (the workspace's or the key's):
//   - admission refuses the work with the budget error (ResourceExhausted, final, naming
//     the budget, what was spent and how to raise it);
//   - the janitor stops the pool at once, busy or idle (backends.PoolZeroer), audits it
//     (pool_scale_to_zero, the error as its reason), and the run's work, queued or new,
//     and samples on its pool are refused with that error until an admission finds the
//     budget raised; the pool scales up on its next call.
//
// The bound: a sweep that cannot top the lease up comes at most one sweep after the last
// top-up, so the lease still holds at least poolLookahead − SweepInterval (three sweeps)
// of the pool's time when it stops the pool. The pool's time is therefore paid for by what
// was reserved, and the workspace (or the key) spends past its budget only by the pool's
// time after its lease ran out: none while the janitor sweeps on time and the backend
// stops the pool within those three sweeps (the worker backend stops it synchronously).

// poolLease is what a run's dedicated pool holds against its workspace's budgets and its
// owner key's.
type poolLease struct {
	// ws is the run's workspace and key its owner key ("" for none).
	ws, key string
	// held is reserved, not yet metered: [0] part of the workspace spend's reserved, [1]
	// of the owner key's.
	held [2]money.USD
	// stopped is the budget error the pool was stopped with (nil while it may run); down
	// that the backend scaled it to zero for it (its held given back).
	stopped error
	down    bool
}

// poolLookahead is how much of a pool's time its lease holds: a minute, and at least four
// janitor sweeps, so the sweep that cannot top it up stops the pool before it runs out.
func (c *Core) poolLookahead() time.Duration {
	return max(time.Minute, 4*c.opts.SweepInterval)
}

// leaseCost is what poolLookahead of r's dedicated pool costs at its full shape under the
// sheet in force, and whether the sheet prices any of it.
func (c *Core) leaseCost(r *run) (money.USD, bool) {
	sheet := c.opts.Prices.Current()
	if sheet == nil {
		return 0, false
	}
	replicas, gpus, kind := r.PoolShape()
	n := int64(max(replicas, 1)) * int64(c.poolLookahead()/time.Second) // replica-seconds
	var sum money.USD
	priced := false
	for _, p := range []struct {
		kind, gpu string
		amount    int64
	}{
		{store.UsageDedicatedReplicaSeconds, "", n},
		{store.UsageDedicatedGPUSeconds, kind, n * int64(max(gpus, 0))},
	} {
		if p.amount <= 0 {
			continue
		}
		cost, ok, err := sheet.Cost(r.Workspace(), r.BaseModel(), p.kind, p.gpu, p.amount)
		if err == nil && ok {
			sum, err = money.Add(sum, cost)
			priced = true
		}
		if err != nil {
			return money.USD(1<<63 - 1), true // past any budget
		}
	}
	return sum, priced
}

// holdPool meters r's dedicated pool and tops its lease up to a whole look-ahead, reserved
// against its workspace's budgets and its owner key's: the budget error (final) when that
// would pass a budget, its message ending with then. Nothing when r holds no pool, or
// neither has a budget, or the sheet has no price for the pool's time (a lease held is
// then given back). It may read the owner key's record and load spends: call it before
// any lock is taken.
func (c *Core) holdPool(ctx context.Context, r *run, then string) error {
	pool := r.Pool()
	if pool == "" {
		return nil
	}
	want, priced := c.leaseCost(r)
	var holds []hold
	if priced {
		kb, keyOK, err := c.ownerBudget(ctx, r)
		if err != nil {
			return err
		}
		holds = c.holdsOf(r.Workspace(), kb, keyOK, want)
	}
	if len(holds) == 0 {
		c.budgets.dropLease(r.ID())
		return nil
	}
	if err := c.loadHolds(ctx, holds); err != nil {
		return err
	}
	c.meterPool(r, false) // what it ran so far comes off the lease first
	return c.budgets.topUpLease(r.ID(), pool, r.Record().GetOwner(), holds, c.poolLookahead(), then, c.now())
}

// ownerBudget is the budgets of the API key that created r (its record's owner), and
// whether it has one: from ctx's identity when the request came with that key, else from
// the key's record in the store (a key given by flag or file has none; a run created
// before owners were recorded has no owner).
func (c *Core) ownerBudget(ctx context.Context, r *run) (keyBudget, bool, error) {
	owner := r.Record().GetOwner()
	if owner == "" || c.opts.Prices.Current() == nil {
		return keyBudget{}, false, nil
	}
	if who, ok := auth.IdentityOf(ctx); ok && who.KeyID == owner {
		kb, ok := c.keyBudgetIn(owner, who.Record)
		return kb, ok, nil
	}
	rec, err := c.store.GetAPIKey(ctx, r.Workspace(), owner)
	if errors.Is(err, store.ErrNotFound) {
		return keyBudget{}, false, nil
	}
	if err != nil {
		return keyBudget{}, false, internal("reading the budgets of the API key that created the run", err)
	}
	kb, ok := c.keyBudgetIn(owner, rec)
	return kb, ok, nil
}

// poolRefusal is the budget error run's dedicated pool was stopped with, nil while it may
// run: checked before each of the run's tasks, its rebuilds and each sample on its pool.
func (c *Core) poolRefusal(run string) error {
	b := c.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls := b.leases[run]; ls != nil {
		return ls.stopped
	}
	return nil
}

// stopThen ends the message of the budget error a pool is stopped with.
const stopThen = ", so the pool is stopped (scaled to zero) and the run's work is refused until the budget is raised"

// renewLeases tops up the lease of every live run's dedicated pool (the janitor's round,
// after meterPools) and stops each pool whose lease cannot be topped up, busy or idle.
func (c *Core) renewLeases(ctx context.Context) {
	if c.dedicatedPools == nil {
		return
	}
	held := map[string]bool{}
	for _, r := range c.runs.all() {
		if r.Pool() == "" {
			continue
		}
		held[r.ID()] = true
		if c.budgets.leaseDown(r.ID()) {
			continue // a pool stopped at the cap: its run's next admission tops it up
		}
		err := c.holdPool(ctx, r, stopThen)
		if err == nil {
			continue
		}
		if errs.Reason(err) != errs.ReasonBudgetExceeded {
			c.log.Error("topping up a dedicated pool's lease", slog.String("run", r.ID()), slog.Any("err", err))
			continue
		}
		c.stopPool(ctx, r, err)
	}
	c.budgets.dropLeasesBut(held) // of runs gone without releasing their pool
}

// stopPool scales r's dedicated pool to zero now, busy or idle, because its lease could not
// be topped up (why): the run's work is refused with why from now on, and once the backend
// has stopped the pool its time is metered and what the lease still held is given back;
// audited (pool_scale_to_zero). A backend that cannot (no PoolZeroer, a replica starting)
// is asked again at the next sweep.
func (c *Core) stopPool(ctx context.Context, r *run, why error) {
	pool := r.Pool()
	c.budgets.stopLease(r.ID(), why)
	z, ok := c.dedicatedPools.(backends.PoolZeroer)
	if !ok {
		c.log.Error("a dedicated pool passed a budget but its backend cannot scale it to zero; its run's work is refused", slog.String("pool", pool))
		return
	}
	reason := connectMessage(why)
	down, err := z.ScaleIdleToZero(ctx, pool, 0, reason)
	if err != nil {
		c.log.Error("stopping a dedicated pool at a budget", slog.String("pool", pool), slog.Any("err", err))
		return
	}
	if !down {
		return // at zero already, or a replica starting: asked again next sweep
	}
	c.meterPool(r, true) // up to the stop, a started second whole
	c.budgets.leaseStoppedDown(r.ID())
	c.log.Info("dedicated pool stopped at a budget", slog.String("pool", pool), slog.String("run", r.ID()), slog.String("why", reason))
	err = c.store.AppendAuditEvents(ctx, []store.OwnedAuditEvent{{Workspace: r.Workspace(), Event: store.AuditEvent{
		Time: c.now().UTC(), Surface: "budget", Action: reason, Event: "pool_scale_to_zero", Resource: "pool", Target: pool,
		Status: http.StatusOK, Code: "ok"}}})
	if err != nil {
		c.log.Error("auditing a dedicated pool stopped at its budget", slog.String("pool", pool), slog.Any("err", err))
	}
}

// releaseLease gives back what run's lease holds and forgets it (its pool is released).
func (c *Core) releaseLease(run string) { c.budgets.dropLease(run) }

// topUpLease makes run's lease (its pool pool, its owner key) hold each hold's amount (the
// look-ahead ahead of the pool) against the hold's spend, reserving only what it lacks
// (reserveLocked), and gives back what it holds against a spend no longer in holds (its
// budget removed); it clears a stop. The budget error, ending with then, when holding it
// would pass a budget.
func (b *budgetBook) topUpLease(run, pool, key string, holds []hold, ahead time.Duration, then string, now time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	ls := b.leases[run]
	if ls == nil {
		ls = &poolLease{ws: holds[0].id.ws, key: key}
		b.leases[run] = ls
	}
	want := holds[0].amount
	needs := make([]hold, len(holds))
	kept := [2]bool{}
	for i, h := range holds {
		side := leaseSide(h.id)
		kept[side] = true
		needs[i] = h
		needs[i].amount = max(h.amount-ls.held[side], 0)
	}
	err := b.reserveLocked(needs, func(need money.USD) string {
		return fmt.Sprintf("holding the next %s of training run %s's dedicated pool %s (%s USD at its full shape; %s USD more than its lease holds)",
			ahead, run, pool, want, need)
	}, then, now)
	if err != nil {
		return err
	}
	for _, h := range needs {
		ls.held[leaseSide(h.id)] += h.amount
	}
	for side, ok := range kept {
		if !ok {
			b.giveBackSideLocked(ls, side)
		}
	}
	ls.stopped, ls.down = nil, false
	return nil
}

// leaseSide is the index in poolLease.held of what a lease holds against spend id: 0 the
// workspace's, 1 the owner key's.
func leaseSide(id spendID) int {
	if id.key == "" {
		return 0
	}
	return 1
}

// spendPool adds a metered cost of run's dedicated pool to its workspace's loaded spend and
// its owner key's (key, "" for none), taking it off what the run's lease holds against
// each as far as it holds it, and records the alerts each spend crosses. The caller holds
// the usage meter's mu (see spend).
func (b *budgetBook) spendPool(ws, key, run string, l policy.Limits, cost money.USD, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	ls := b.leases[run]
	for side, id := range []spendID{{ws: ws}, {ws, key}} {
		e := b.ws[id]
		if (side == 1 && key == "") || e == nil { // loaded or loading (loadSpend)
			continue
		}
		var settled money.USD
		if ls != nil {
			settled = min(ls.held[side], cost)
			ls.held[side] -= settled
		}
		e.add(cost, settled, now)
		if !e.loaded {
			continue // alerted when loaded (loadAlertsLocked)
		}
		limits := [2]money.USD{l.BudgetMonth, l.BudgetTotal}
		if side == 1 {
			limits = e.keyLimits
		}
		b.alertLocked(id, e, limits[0], limits[1], "", now)
	}
}

// giveBackLocked takes what ls holds off its workspace's and its owner key's reservations
// (b.mu held).
func (b *budgetBook) giveBackLocked(ls *poolLease) {
	b.giveBackSideLocked(ls, 0)
	b.giveBackSideLocked(ls, 1)
}

// giveBackSideLocked takes what ls holds against one spend (leaseSide) off its
// reservations (b.mu held).
func (b *budgetBook) giveBackSideLocked(ls *poolLease, side int) {
	id := spendID{ws: ls.ws}
	if side == 1 {
		id.key = ls.key
	}
	if e := b.ws[id]; e != nil && (side == 0 || ls.key != "") {
		e.reserved = max(e.reserved-ls.held[side], 0)
	}
	ls.held[side] = 0
}

// dropLease gives back what run's lease holds and forgets it.
func (b *budgetBook) dropLease(run string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls := b.leases[run]; ls != nil {
		b.giveBackLocked(ls)
		delete(b.leases, run)
	}
}

// dropLeasesBut gives back and forgets the leases of runs not in keep.
func (b *budgetBook) dropLeasesBut(keep map[string]bool) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for run, ls := range b.leases {
		if !keep[run] {
			b.giveBackLocked(ls)
			delete(b.leases, run)
		}
	}
}

// stopLease makes run's work refused with why.
func (b *budgetBook) stopLease(run string, why error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls := b.leases[run]; ls != nil {
		ls.stopped = why
	}
}

// leaseStoppedDown records that run's stopped pool is at zero and gives back what its
// lease still holds: a pool at zero bills nothing.
func (b *budgetBook) leaseStoppedDown(run string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if ls := b.leases[run]; ls != nil && ls.stopped != nil {
		b.giveBackLocked(ls)
		ls.down = true
	}
}

// leaseDown reports whether run's pool was stopped at a budget and is at zero.
func (b *budgetBook) leaseDown(run string) bool {
	b.mu.Lock()
	defer b.mu.Unlock()
	ls := b.leases[run]
	return ls != nil && ls.down
}
