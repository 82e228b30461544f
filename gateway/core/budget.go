package core

import (
	"context"
	"fmt"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
)

// Budgets (docs/operations.md, "Budgets"): a workspace policy's budget_usd_month and
// budget_usd_total cap what a workspace spends, as priced by the price sheet. Admission
// reserves an operation's estimated cost (ops.create, from the estimate its service put in
// the context) and refuses it when spent + reserved + estimate would pass a budget; the
// operation's exact cost is added to spent as it is metered (recordOpUsage) and its
// reservation released when it finishes. Estimates are upper bounds (a forward_backward's
// tokens are known; a sample's generated tokens are at most num_samples × max_tokens), so
// a workspace never spends past its budget by more than the usage no operation admits
// (dedicated pool time).

// budgetBook keeps each budgeted workspace's spend: loaded from the store the first time
// the workspace asks for work (budgetReady), then kept in memory.
type budgetBook struct {
	mu sync.Mutex
	ws map[string]*wsSpend
	// alerts wait for writeAlerts (budgetalert.go), which kick wakes; dropped counts those
	// dropped past maxPendingAlerts.
	alerts  []budgetAlert
	dropped int
	kick    chan struct{}
}

type wsSpend struct {
	loaded bool
	// month is the UTC month monthSpent is for.
	month                            time.Time
	monthSpent, totalSpent, reserved money.USD
	// alerted is the set of alert thresholds (budgetalert.go: bit i for alertThresholds[i])
	// alerted for the month's budget this month [0] and for the total budget [1].
	alerted [2]uint8
}

func newBudgetBook() *budgetBook {
	return &budgetBook{ws: map[string]*wsSpend{}, kick: make(chan struct{}, 1)}
}

func monthOf(t time.Time) time.Time {
	t = t.UTC()
	return time.Date(t.Year(), t.Month(), 1, 0, 0, 0, 0, time.UTC)
}

// rollLocked starts a new month's spend when now is past e's month.
func (e *wsSpend) rollLocked(now time.Time) {
	if m := monthOf(now); !m.Equal(e.month) {
		e.month, e.monthSpent, e.alerted[0] = m, 0, 0
	}
}

// spend adds a metered cost to a loaded workspace's spend and takes settled (the part of
// the cost its operation had reserved) off its reservations, at once, so the cost is never
// counted twice. The caller holds the usage meter's mu, so loading (budgetReady) sees every
// cost either in the pending counters or here, never both.
//
// It records the alerts the spend crosses, under l's budgets.
func (b *budgetBook) spend(ws string, l policy.Limits, cost, settled money.USD, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[ws]
	if e == nil || !e.loaded {
		return
	}
	e.reserved = max(e.reserved-settled, 0)
	e.rollLocked(now)
	if s, err := money.Add(e.monthSpent, cost); err == nil {
		e.monthSpent = s
	}
	if s, err := money.Add(e.totalSpent, cost); err == nil {
		e.totalSpent = s
	}
	b.alertLocked(ws, e, l.BudgetMonth, l.BudgetTotal, "", now)
}

// budgeted reports whether new work of ws is checked against budgets: a price sheet is in
// force and the workspace's policy has a budget.
func (c *Core) budgeted(ws string) (policy.Limits, bool) {
	if c.opts.Prices.Current() == nil {
		return policy.Limits{}, false
	}
	l := c.policy.Limits(ws)
	return l, l.BudgetMonth > 0 || l.BudgetTotal > 0
}

// budgetReady loads a budgeted workspace's spend from the store the first time it is
// needed: the costs of its usage this month and in all, the counters not yet written
// included. It does I/O: call it before any lock is taken.
func (c *Core) budgetReady(ctx context.Context, ws string) error {
	if _, ok := c.budgeted(ws); !ok {
		return nil
	}
	b := c.budgets
	b.mu.Lock()
	loaded := b.ws[ws] != nil && b.ws[ws].loaded
	b.mu.Unlock()
	if loaded {
		return nil
	}
	u := c.usage
	// No flush runs while the store is read, so what it holds and what is pending are
	// disjoint; costs metered after the pending snapshot go to the book (spend).
	u.flushMu.Lock()
	defer u.flushMu.Unlock()
	now := c.now()
	month := monthOf(now)
	u.mu.Lock()
	b.mu.Lock()
	if e := b.ws[ws]; e != nil && e.loaded {
		b.mu.Unlock()
		u.mu.Unlock()
		return nil
	}
	e := &wsSpend{loaded: true, month: month}
	var err error
	for k, a := range u.pending {
		if k.ws != ws || err != nil {
			continue
		}
		if e.totalSpent, err = money.Add(e.totalSpent, a.cost); err == nil && !k.bucket.Before(month) {
			e.monthSpent, err = money.Add(e.monthSpent, a.cost)
		}
	}
	b.ws[ws] = e
	b.mu.Unlock()
	u.mu.Unlock()
	var month0, total0 int64
	if err == nil {
		total0, err = c.store.UsageCost(ctx, ws, time.Unix(0, 0), now.Add(usageBucket))
	}
	if err == nil {
		month0, err = c.store.UsageCost(ctx, ws, month, now.Add(usageBucket))
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	if err == nil {
		if e.totalSpent, err = money.Add(e.totalSpent, money.USD(total0)); err == nil && e.month.Equal(month) {
			e.monthSpent, err = money.Add(e.monthSpent, money.USD(month0))
		}
	}
	if err == nil { // thresholds passed before: alerted then, not again (budgetalert.go)
		l := c.policy.Limits(ws)
		e.alerted = [2]uint8{reached(e.monthSpent, l.BudgetMonth), reached(e.totalSpent, l.BudgetTotal)}
	}
	if err != nil {
		delete(b.ws, ws) // loaded again next time
		return internal("reading the workspace's spend for its budget", err)
	}
	return nil
}

// reserveBudget admits work of ws with an estimated cost against its budgets, holding the
// estimate until release: ResourceExhausted, marked final (the SDK does not retry it), when
// spent + reserved + estimate would pass a budget.
func (c *Core) reserveBudget(ws string, estimate money.USD) error {
	l, ok := c.budgeted(ws)
	if !ok {
		return nil
	}
	b := c.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[ws]
	if e == nil || !e.loaded {
		return connect.NewError(connect.CodeUnavailable, fmt.Errorf("workspace %q's spend is not loaded yet: retry", ws))
	}
	e.rollLocked(c.now())
	for _, bud := range []struct {
		name, when   string
		limit, spent money.USD
	}{
		{budgetMonth, "this month (UTC)", l.BudgetMonth, e.monthSpent},
		{budgetTotal, "in all", l.BudgetTotal, e.totalSpent},
	} {
		if bud.limit <= 0 {
			continue
		}
		after, err := money.Add(bud.spent, e.reserved)
		if err == nil {
			after, err = money.Add(after, estimate)
		}
		if err != nil || after > bud.limit {
			b.alertLocked(ws, e, l.BudgetMonth, l.BudgetTotal, bud.name, c.now()) // the cap is reached
			return errs.Final(errs.New(connect.CodeResourceExhausted, errs.ReasonBudgetExceeded, fmt.Errorf(
				"workspace %q has spent %s USD %s (and has %s USD of work running) of its budget of %s USD (%s in its policy); this work's estimated cost, %s USD, would pass it: ask an operator to raise %s in the workspace policy (loops serve --workspace-policy)",
				ws, bud.spent, bud.when, e.reserved, bud.limit, bud.name, estimate, bud.name)))
		}
	}
	e.reserved += estimate // within the budget, so no overflow
	return nil
}

// releaseBudget gives back a reservation.
func (c *Core) releaseBudget(ws string, estimate money.USD) {
	if estimate == 0 {
		return
	}
	b := c.budgets
	b.mu.Lock()
	if e := b.ws[ws]; e != nil {
		e.reserved = max(e.reserved-estimate, 0)
	}
	b.mu.Unlock()
}

type estimateKey struct{}

// withEstimate returns ctx carrying the estimated cost of the work its request creates, for
// ops.create to reserve.
func withEstimate(ctx context.Context, usd money.USD) context.Context {
	return context.WithValue(ctx, estimateKey{}, usd)
}

// estimateOf is the estimate withEstimate put in ctx, and whether there is one (work
// without one, such as creating a run, is not checked against budgets).
func estimateOf(ctx context.Context) (money.USD, bool) {
	v, ok := ctx.Value(estimateKey{}).(money.USD)
	return v, ok
}

// estimate is the cost of amounts of kinds on model for ws under the sheet in force (0
// for what it does not price).
func (c *Core) estimate(ws, model string, amounts map[string]int64) money.USD {
	sheet := c.opts.Prices.Current()
	var sum money.USD
	for kind, n := range amounts {
		cost, ok, err := sheet.Cost(ws, model, kind, "", n)
		if err != nil {
			return money.USD(1<<63 - 1) // past any budget
		}
		if ok {
			if sum, err = money.Add(sum, cost); err != nil {
				return money.USD(1<<63 - 1)
			}
		}
	}
	return sum
}

// settle takes up to cost off an operation's reservation and returns what it took, which
// the caller takes off the workspace's reservations as it adds the cost (spend).
func (o *operation) settle(cost money.USD) money.USD {
	o.mu.Lock()
	defer o.mu.Unlock()
	take := min(o.reserved, cost)
	o.reserved -= take
	return take
}
