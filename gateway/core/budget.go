package core

import (
	"context"
	"fmt"
	"strings"
	"sync"
	"time"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
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
// operations never take a workspace past its budget. Dedicated pool time, which no
// operation's estimate covers, is reserved by its pool's lease (poollease.go), against the
// workspace's budgets and those of the API key that created the run.
//
// An API key's budgets (its record's budget_usd_month and budget_usd_total, set by
// KeyService) are checked the same way against the key's own usage: the book keeps a
// spend per (workspace, key) for keys with a budget, and admission reserves the estimate
// against the workspace's budgets and the key's, refusing when either would be passed.

// budgetBook keeps each budgeted workspace's spend: loaded from the store the first time
// the workspace asks for work (budgetReady), then kept in memory.
type budgetBook struct {
	mu sync.Mutex
	// ws is the spend of each budgeted workspace (key "") and of each budgeted API key.
	ws map[spendID]*wsSpend
	// leases are the dedicated pools' leases (poollease.go), by run: one per live run
	// holding a pool of a budgeted workspace.
	leases map[string]*poolLease
	// alerts wait for writeAlerts (budgetalert.go), which kick wakes; dropped counts those
	// dropped past maxPendingAlerts.
	alerts  []budgetAlert
	dropped int
	kick    chan struct{}
}

// spendID names a spend in the book: a workspace's (key "") or one of its API keys'.
type spendID struct{ ws, key string }

// wsSpend is a workspace's or an API key's spend.
type wsSpend struct {
	// loaded: its stored costs are in and work is checked against it; until then ready is
	// open while one loadSpend call loads it, and closed when that call is done.
	loaded bool
	ready  chan struct{}
	// month is the UTC month monthSpent is for.
	month                            time.Time
	monthSpent, totalSpent, reserved money.USD
	// alerted is the set of alert thresholds (budgetalert.go: bit i for alertThresholds[i])
	// alerted for the month's budget this month [0] and for the total budget [1].
	alerted [2]uint8
	// keyLimits are an API key's budgets (month, total) as its record had them when its work
	// was last admitted, which its alerts are of (a workspace's are in its policy).
	keyLimits [2]money.USD
}

func newBudgetBook() *budgetBook {
	return &budgetBook{ws: map[spendID]*wsSpend{}, leases: map[string]*poolLease{}, kick: make(chan struct{}, 1)}
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

// spend adds a metered cost to a workspace's spend, and to its API key's (key, "" for
// none), each when it is loaded or loading (loadSpend), and takes settled (the part of the cost its
// operation had reserved) off their reservations (the key's only when keySettled: the
// operation reserved against the key's budgets), at once, so the cost is never counted
// twice. The caller holds the usage meter's mu, so loading (budgetReady) sees every cost
// either in the pending counters or here, never both.
//
// It records the alerts the workspace's spend crosses, under l's budgets.
func (b *budgetBook) spend(ws, key string, keySettled bool, l policy.Limits, cost, settled money.USD, now time.Time) {
	b.mu.Lock()
	defer b.mu.Unlock()
	if e := b.ws[spendID{ws: ws}]; e != nil {
		e.add(cost, settled, now)
		if e.loaded { // a spend loading is alerted when loaded (loadAlertsLocked)
			b.alertLocked(spendID{ws: ws}, e, l.BudgetMonth, l.BudgetTotal, "", now)
		}
	}
	if key == "" {
		return
	}
	if e := b.ws[spendID{ws, key}]; e != nil {
		if !keySettled {
			settled = 0
		}
		e.add(cost, settled, now)
		if e.loaded {
			b.alertLocked(spendID{ws, key}, e, e.keyLimits[0], e.keyLimits[1], "", now)
		}
	}
}

// add adds cost to e's spend and takes settled off its reservations.
func (e *wsSpend) add(cost, settled money.USD, now time.Time) {
	e.reserved = max(e.reserved-settled, 0)
	e.rollLocked(now)
	if s, err := money.Add(e.monthSpent, cost); err == nil {
		e.monthSpent = s
	}
	if s, err := money.Add(e.totalSpent, cost); err == nil {
		e.totalSpent = s
	}
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

// keyBudget is an API key's own budgets.
type keyBudget struct {
	id           string
	month, total money.USD
}

// keyBudgetOf is the budgets of the stored API key that ctx's request came with, and
// whether it has one and a price sheet is in force.
func (c *Core) keyBudgetOf(ctx context.Context) (keyBudget, bool) {
	who, ok := auth.IdentityOf(ctx)
	if !ok {
		return keyBudget{}, false
	}
	return c.keyBudgetIn(who.KeyID, who.Record)
}

// keyBudgetIn is the budgets of API key id in its record (nil: a key given by flag or
// file, which has none), and whether it has one and a price sheet is in force. KeyService
// checked them when it set them.
func (c *Core) keyBudgetIn(id string, rec *loopsv1.ApiKey) (keyBudget, bool) {
	if rec == nil || c.opts.Prices.Current() == nil {
		return keyBudget{}, false
	}
	kb := keyBudget{id: id}
	if s := rec.GetBudgetUsdMonth(); s != "" {
		kb.month, _ = policy.ParseBudget(s)
	}
	if s := rec.GetBudgetUsdTotal(); s != "" {
		kb.total, _ = policy.ParseBudget(s)
	}
	return kb, kb.month > 0 || kb.total > 0
}

// hold is a spend that work is checked against, with that spend's budgets (month, total;
// 0 for none), and what the work reserves there: the workspace's spend (key "") under
// its policy's budgets, or an API key's under the key's own.
type hold struct {
	id     spendID
	limits [2]money.USD
	amount money.USD
}

// holdsOf is the spends that work in ws is checked against, amount at each: the
// workspace's when its policy has a budget, and API key kb's when keyOK (it has one).
func (c *Core) holdsOf(ws string, kb keyBudget, keyOK bool, amount money.USD) []hold {
	var holds []hold
	if l, ok := c.budgeted(ws); ok {
		holds = append(holds, hold{id: spendID{ws: ws}, limits: [2]money.USD{l.BudgetMonth, l.BudgetTotal}, amount: amount})
	}
	if keyOK {
		holds = append(holds, hold{id: spendID{ws, kb.id}, limits: [2]money.USD{kb.month, kb.total}, amount: amount})
	}
	return holds
}

// loadHolds loads the spends of holds from the store the first time each is needed
// (loadSpend). It does I/O: call it before any lock is taken.
func (c *Core) loadHolds(ctx context.Context, holds []hold) error {
	for _, h := range holds {
		if err := c.loadSpend(ctx, h.id, h.limits); err != nil {
			if h.id.key != "" {
				return internal("reading the API key's spend for its budget", err)
			}
			return internal("reading the workspace's spend for its budget", err)
		}
	}
	return nil
}

// anyBudget reports whether the work of ctx in ws is checked against a budget: the
// workspace's or its API key's.
func (c *Core) anyBudget(ctx context.Context, ws string) bool {
	if _, ok := c.budgeted(ws); ok {
		return true
	}
	_, ok := c.keyBudgetOf(ctx)
	return ok
}

// budgetReady loads the spends that the work of ctx in ws is checked against from the
// store the first time each is needed: the budgeted workspace's and the budgeted API
// key's. It does I/O: call it before any lock is taken.
func (c *Core) budgetReady(ctx context.Context, ws string) error {
	kb, keyOK := c.keyBudgetOf(ctx)
	return c.loadHolds(ctx, c.holdsOf(ws, kb, keyOK, 0))
}

// loadSpend loads a spend (a workspace's, or an API key's) unless it is loaded: the costs
// of its usage this month and in all, the counters not yet written included. limits are
// its budgets (month, total): the alert thresholds its spend passes that were never
// recorded (the gateway stopped between crossing and recording them) are alerted now
// (budgetalert.go).
//
// One call loads a spend; others that need it meanwhile wait for it (or their ctx), and no
// work is checked against a spend before its stored costs are in (reserveLocked refuses a
// spend not loaded). The store is read with no lock held: the loader takes the pending
// counters of the spend, then reads what the store holds, and the two are disjoint when no
// flush moved counters from one to the other meanwhile (usageMeter.flushing, flushes);
// when one did, it loads again. Costs metered after the pending snapshot go to the spend as
// they are metered (spend, spendPool count a spend that is loading). After
// loadSpendAttempts such tries it reads the store with flushes held off (flushMu), which a
// tenant calling GetUsage in a loop could otherwise cause without end.
func (c *Core) loadSpend(ctx context.Context, id spendID, limits [2]money.USD) error {
	for attempt := 1; ; attempt++ {
		done, err := c.loadSpendOnce(ctx, id, limits, attempt >= loadSpendAttempts)
		if done || err != nil {
			return err
		}
	}
}

// loadSpendAttempts is how many times loadSpend reads the store with flushes running before
// it holds them off.
const loadSpendAttempts = 3

// loadSpendOnce is one try of loadSpend: done when the spend is loaded (by it or by
// another call), false to try again (a flush moved counters while the store was read, or
// another call's load failed or moved).
func (c *Core) loadSpendOnce(ctx context.Context, id spendID, limits [2]money.USD, holdFlushes bool) (bool, error) {
	ws := id.ws
	b, u := c.budgets, c.usage
	b.mu.Lock()
	if e := b.ws[id]; e != nil {
		loaded, ready := e.loaded, e.ready
		b.mu.Unlock()
		if loaded {
			return true, nil
		}
		select { // another call loads it
		case <-ready:
			return false, nil
		case <-ctx.Done():
			return false, ctx.Err()
		}
	}
	b.mu.Unlock()
	if holdFlushes {
		u.flushMu.Lock()
		defer u.flushMu.Unlock()
	}
	now := c.now()
	month := monthOf(now)
	u.mu.Lock()
	if u.flushing { // wait for it to end (no lock of ours held), then snapshot
		u.mu.Unlock()
		u.flushMu.Lock()
		u.flushMu.Unlock() //nolint:staticcheck // an empty critical section: waiting for the flush
		return false, nil
	}
	flushes := u.flushes
	b.mu.Lock()
	if b.ws[id] != nil { // another call started meanwhile
		b.mu.Unlock()
		u.mu.Unlock()
		return false, nil
	}
	e := &wsSpend{month: month, keyLimits: limits, ready: make(chan struct{})}
	var err error
	for k, a := range u.pending {
		if k.ws != ws || (id.key != "" && k.key != id.key) || err != nil {
			continue
		}
		if e.totalSpent, err = money.Add(e.totalSpent, a.cost); err == nil && !k.bucket.Before(month) {
			e.monthSpent, err = money.Add(e.monthSpent, a.cost)
		}
	}
	b.ws[id] = e
	b.mu.Unlock()
	u.mu.Unlock()

	var recorded []store.BudgetAlert
	cost := func(from time.Time) (int64, error) {
		if id.key != "" {
			return c.store.KeyUsageCost(ctx, ws, id.key, from, now.Add(usageBucket))
		}
		return c.store.UsageCost(ctx, ws, from, now.Add(usageBucket))
	}
	var month0, total0 int64
	if err == nil {
		total0, err = cost(time.Unix(0, 0))
	}
	if err == nil {
		month0, err = cost(month)
	}
	if err == nil {
		recorded, err = c.store.ListBudgetAlerts(ctx, ws, id.key, month.Format(periodLayout))
	}
	u.mu.Lock()
	defer u.mu.Unlock()
	b.mu.Lock()
	defer b.mu.Unlock()
	moved := u.flushing || u.flushes != flushes
	if err == nil && !moved {
		if e.totalSpent, err = money.Add(e.totalSpent, money.USD(total0)); err == nil && e.month.Equal(month) {
			e.monthSpent, err = money.Add(e.monthSpent, money.USD(month0))
		}
	}
	if err != nil || moved {
		delete(b.ws, id) // loaded again, by this call (moved) or the next
		close(e.ready)
		return false, err
	}
	e.loaded = true
	close(e.ready)
	b.loadAlertsLocked(id, e, limits, recorded, now)
	return true, nil
}

// reserveBudget admits the work of ctx in ws with an estimated cost against the
// workspace's budgets and its API key's, holding the estimate against each until release:
// ResourceExhausted, marked final (the SDK does not retry it), when spent + reserved +
// estimate would pass a budget. It returns the key the estimate is held against ("" for
// none), for release.
func (c *Core) reserveBudget(ctx context.Context, ws string, estimate money.USD) (string, error) {
	kb, keyOK := c.keyBudgetOf(ctx)
	holds := c.holdsOf(ws, kb, keyOK, estimate)
	if len(holds) == 0 {
		return "", nil
	}
	b := c.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	err := b.reserveLocked(holds, func(amount money.USD) string {
		return fmt.Sprintf("this work's estimated cost, %s USD,", amount)
	}, "", c.now())
	if err != nil || !keyOK {
		return "", err
	}
	return kb.id, nil
}

// reserveLocked checks each hold's spend, what it has reserved and the hold's amount
// against the hold's budgets and, only when every one passes, reserves each amount
// (b.mu held). A spend not loaded yet is Unavailable (retry). A hold that would pass a
// budget records the cap's alert and is the budget error (budgetError), which says that
// what(amount) ("… X USD,") would pass it, then then.
func (b *budgetBook) reserveLocked(holds []hold, what func(money.USD) string, then string, now time.Time) error {
	for _, h := range holds {
		e := b.ws[h.id]
		if e == nil || !e.loaded {
			if h.id.key != "" {
				return unavailable("API key %s's spend is not loaded yet: retry", h.id.key)
			}
			return unavailable("workspace %q's spend is not loaded yet: retry", h.id.ws)
		}
		e.rollLocked(now)
		if h.id.key != "" {
			e.keyLimits = h.limits
		}
		if name, bud, ok := e.passes(h.limits[0], h.limits[1], h.amount); !ok {
			b.alertLocked(h.id, e, h.limits[0], h.limits[1], name, now) // the cap is reached
			return budgetError(h.id, e, name, bud, what(h.amount), then)
		}
	}
	for _, h := range holds {
		b.ws[h.id].reserved += h.amount // within the budget, so no overflow
	}
	return nil
}

// budgetError is the error that refuses work whose cost (what, "… X USD,") would pass
// budget name of spend id (a workspace's or an API key's): ResourceExhausted, marked
// final (the SDK does not retry it), naming the budget, what was spent and how to raise
// it; then says what else happens.
func budgetError(id spendID, e *wsSpend, name string, bud spentOf, what, then string) error {
	if id.key == "" {
		return wsBudgetError(id.ws, e, name, bud, what, then)
	}
	return errs.Final(errs.New(connect.CodeResourceExhausted, errs.ReasonBudgetExceeded, fmt.Errorf(
		"API key %s has spent %s USD %s (and has %s USD of work running) of its budget of %s USD (%s of the key); %s would pass it%s: ask a workspace admin to raise it (loops keys update %s --%s USD)",
		id.key, bud.spent, bud.when, e.reserved, bud.limit, name, what, then, id.key, strings.ReplaceAll(name, "_", "-"))))
}

// wsBudgetError is the error that refuses work of ws whose cost (what, "… X USD,") would
// pass its budget name: ResourceExhausted, marked final (the SDK does not retry it), naming
// the budget, what was spent and how to raise it; then says what else happens.
func wsBudgetError(ws string, e *wsSpend, name string, bud spentOf, what, then string) error {
	return errs.Final(errs.New(connect.CodeResourceExhausted, errs.ReasonBudgetExceeded, fmt.Errorf(
		"workspace %q has spent %s USD %s (and has %s USD of work running) of its budget of %s USD (%s in its policy); %s would pass it%s: ask an operator to raise %s in the workspace policy (loops serve --workspace-policy)",
		ws, bud.spent, bud.when, e.reserved, bud.limit, name, what, then, name)))
}

// spentOf is one budget of a spend: its limit, what was spent and when.
type spentOf struct {
	when         string
	limit, spent money.USD
}

// passes checks e's spend, its reservations and estimate against a monthly and a total
// budget (0: none): ok, or the name of the budget it would pass.
func (e *wsSpend) passes(month, total, estimate money.USD) (string, spentOf, bool) {
	for _, bud := range []struct {
		name string
		spentOf
	}{
		{budgetMonth, spentOf{"this month (UTC)", month, e.monthSpent}},
		{budgetTotal, spentOf{"in all", total, e.totalSpent}},
	} {
		if bud.limit <= 0 {
			continue
		}
		after, err := money.Add(bud.spent, e.reserved)
		if err == nil {
			after, err = money.Add(after, estimate)
		}
		if err != nil || after > bud.limit {
			return bud.name, bud.spentOf, false
		}
	}
	return "", spentOf{}, true
}

// releaseBudget gives back a reservation held against ws's budgets and its API key's
// (key, "" for none).
func (c *Core) releaseBudget(ws, key string, estimate money.USD) {
	if estimate == 0 {
		return
	}
	b := c.budgets
	b.mu.Lock()
	if e := b.ws[spendID{ws: ws}]; e != nil {
		e.reserved = max(e.reserved-estimate, 0)
	}
	if key != "" {
		if e := b.ws[spendID{ws, key}]; e != nil {
			e.reserved = max(e.reserved-estimate, 0)
		}
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
