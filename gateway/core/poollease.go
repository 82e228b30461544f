package core

import (
	"context"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
)

// Dedicated pool leases (docs/operations.md, "Budgets"). A dedicated pool bills for its
// time while its run holds it, busy or idle, so no operation's estimate covers it. A
// budgeted workspace's pool therefore holds a lease: the cost of the look-ahead
// (poolLookahead) of the pool's time at its full shape (every replica and GPU), reserved
// against the workspace's budgets beside the operations' estimates. The pool's metered time
// is taken off the lease as it is spent (spendPool), and the lease is topped up to a whole
// look-ahead again at each admission of the run's work or of a sample on its pool
// (holdPool), and at each janitor sweep (renewLeases). When topping it up would pass a
// budget:
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
// was reserved, and the workspace spends past its budget only by the pool's time after its
// lease ran out: none while the janitor sweeps on time and the backend stops the pool
// within those three sweeps (the worker backend stops it synchronously).

// poolLease is what a run's dedicated pool holds against its workspace's budgets.
type poolLease struct {
	ws string
	// held is reserved (part of the workspace spend's reserved), not yet metered.
	held money.USD
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
// against its workspace's budgets: the budget error (final) when that would pass a budget,
// its message ending with then. Nothing when r holds no pool, or its workspace has no
// budget or no price for the pool's time (a lease held is then given back). It may load
// the workspace's spend: call it before any lock is taken.
func (c *Core) holdPool(ctx context.Context, r *run, then string) error {
	pool := r.Pool()
	if pool == "" {
		return nil
	}
	ws := r.Workspace()
	l, budgeted := c.budgeted(ws)
	want, priced := c.leaseCost(r)
	if !budgeted || !priced {
		c.budgets.dropLease(r.ID())
		return nil
	}
	if err := c.loadSpend(ctx, spendID{ws: ws}, [2]money.USD{l.BudgetMonth, l.BudgetTotal}); err != nil {
		return internal("reading the workspace's spend for its budget", err)
	}
	c.meterPool(r, false) // what it ran so far comes off the lease first
	return c.budgets.topUpLease(ws, r.ID(), pool, l, want, c.poolLookahead(), then, c.now())
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
		c.log.Error("a dedicated pool passed its workspace's budget but its backend cannot scale it to zero; its run's work is refused", slog.String("pool", pool))
		return
	}
	reason := connectMessage(why)
	down, err := z.ScaleIdleToZero(ctx, pool, 0, reason)
	if err != nil {
		c.log.Error("stopping a dedicated pool at its workspace's budget", slog.String("pool", pool), slog.Any("err", err))
		return
	}
	if !down {
		return // at zero already, or a replica starting: asked again next sweep
	}
	c.meterPool(r, true) // up to the stop, a started second whole
	c.budgets.leaseStoppedDown(r.ID())
	c.log.Info("dedicated pool stopped at its workspace's budget", slog.String("pool", pool), slog.String("run", r.ID()), slog.String("why", reason))
	err = c.store.AppendAuditEvents(ctx, []store.OwnedAuditEvent{{Workspace: r.Workspace(), Event: store.AuditEvent{
		Time: c.now().UTC(), Surface: "budget", Action: reason, Event: "pool_scale_to_zero", Resource: "pool", Target: pool,
		Status: http.StatusOK, Code: "ok"}}})
	if err != nil {
		c.log.Error("auditing a dedicated pool stopped at its budget", slog.String("pool", pool), slog.Any("err", err))
	}
}

// releaseLease gives back what run's lease holds and forgets it (its pool is released).
func (c *Core) releaseLease(run string) { c.budgets.dropLease(run) }

// topUpLease makes run's lease of ws hold want (the look-ahead ahead of its pool) against
// ws's budgets l, clearing a stop; the budget error, ending with then, when holding it
// would pass a budget.
func (b *budgetBook) topUpLease(ws, run, pool string, l policy.Limits, want money.USD, ahead time.Duration, then string, now time.Time) error {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[spendID{ws: ws}]
	if e == nil || !e.loaded {
		return unavailable("workspace %q's spend is not loaded yet: retry", ws)
	}
	ls := b.leases[run]
	if ls == nil {
		ls = &poolLease{ws: ws}
		b.leases[run] = ls
	}
	e.rollLocked(now)
	need := max(want-ls.held, 0)
	if name, bud, ok := e.passes(l.BudgetMonth, l.BudgetTotal, need); !ok {
		b.alertLocked(spendID{ws: ws}, e, l.BudgetMonth, l.BudgetTotal, name, now) // the cap is reached
		return wsBudgetError(ws, e, name, bud, fmt.Sprintf("holding the next %s of training run %s's dedicated pool %s (%s USD at its full shape; %s USD more than its lease holds)",
			ahead, run, pool, want, need), then)
	}
	e.reserved += need // within the budget, so no overflow
	ls.held += need
	ls.stopped, ls.down = nil, false
	return nil
}

// spendPool adds a metered cost of run's dedicated pool to ws's loaded spend, taking it off
// the run's lease as far as the lease holds it. The caller holds the usage meter's mu (see
// spend).
func (b *budgetBook) spendPool(ws, run string, l policy.Limits, cost money.USD, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[spendID{ws: ws}]
	if e == nil || !e.loaded {
		return
	}
	var settled money.USD
	if ls := b.leases[run]; ls != nil {
		settled = min(ls.held, cost)
		ls.held -= settled
	}
	e.add(cost, settled, now)
	b.alertLocked(spendID{ws: ws}, e, l.BudgetMonth, l.BudgetTotal, "", now)
}

// giveBackLocked takes what ls holds off its workspace's reservations (b.mu held).
func (b *budgetBook) giveBackLocked(ls *poolLease) {
	if e := b.ws[spendID{ws: ls.ws}]; e != nil {
		e.reserved = max(e.reserved-ls.held, 0)
	}
	ls.held = 0
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
