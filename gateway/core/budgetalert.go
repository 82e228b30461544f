package core

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// Budget alerts (docs/operations.md, "Budget alerts"): when a workspace's or an API key's
// spend reaches 50%, 80% or 100% of one of its budgets (100% also when the budget refuses
// work: spend rarely lands on the cap exactly), an audit event budget_alert is written,
// exactly once per threshold per period (a UTC month for budget_usd_month, ever for
// budget_usd_total), and the thresholds crossed show in GetWorkspace (loops workspace, the
// console) and on the key (loops keys list/show).
//
// Exactly once: the store records each threshold (store.BudgetAlertStore) in the same
// transaction as its audit event, and records a threshold only once. A threshold crossed in
// memory is queued for writeAlerts, which retries until the store has it. If the gateway
// stops before that, the spend it loads at its next start (loadSpend) passes the threshold
// again, when the usage that crossed it was written, and the alert is queued then; when that
// usage was lost with the gateway, the threshold is not passed and alerts when spend crosses
// it again.

// periodLayout formats the month of a monthly budget's alerts ("2026-12").
const periodLayout = "2006-01"

// alertRetry is how long writeAlerts waits before it tries alerts the store failed again.
const alertRetry = 5 * time.Second

// alertThresholds are the percentages of a budget that alert, ascending.
var alertThresholds = [...]int{50, 80, 100}

// Budget names, as in the workspace policy.
const (
	budgetMonth = "budget_usd_month"
	budgetTotal = "budget_usd_total"
)

// maxPendingAlerts bounds the alerts waiting to be written; past it the oldest are dropped
// (and logged), never blocking metering.
const maxPendingAlerts = 4096

// budgetAlert is one threshold crossed.
type budgetAlert struct {
	// ws and key are whose budget it is (key "": the workspace's).
	ws, key, budget string
	percent         int
	// period is the month ("2026-12") of a monthly budget, "" for the total.
	period       string
	spent, limit money.USD
	at           time.Time
}

// reached is the set of thresholds spent reaches of limit: bit i for alertThresholds[i].
func reached(spent, limit money.USD) uint8 {
	var set uint8
	if limit <= 0 {
		return 0
	}
	for i, t := range alertThresholds {
		if reaches(spent, limit, t) {
			set |= 1 << i
		}
	}
	return set
}

// reaches reports spent ≥ limit×percent/100 (rounded half up to the pico-dollar).
func reaches(spent, limit money.USD, percent int) bool {
	need, err := money.MulDiv(limit, int64(percent), 100)
	return err == nil && spent >= need
}

// budgetOf is one of a spend's budgets: its name, limit (0: none), spend and period.
type budgetOf struct {
	name         string
	limit, spent money.USD
	period       string
}

// budgetsOf is e's two budgets (month, total) under limits.
func budgetsOf(e *wsSpend, limits [2]money.USD) [2]budgetOf {
	return [2]budgetOf{
		{budgetMonth, limits[0], e.monthSpent, e.month.Format(periodLayout)},
		{budgetTotal, limits[1], e.totalSpent, ""},
	}
}

// alertLocked queues the thresholds of id's budgets that its spend e now reaches and were
// not alerted yet in their period (b.mu held). atCap names a budget that refused work: its
// 100% alerts too.
func (b *budgetBook) alertLocked(id spendID, e *wsSpend, monthLimit, totalLimit money.USD, atCap string, now time.Time) {
	for i, bud := range budgetsOf(e, [2]money.USD{monthLimit, totalLimit}) {
		if bud.limit <= 0 {
			continue
		}
		set := reached(bud.spent, bud.limit)
		if atCap == bud.name {
			set |= 1 << (len(alertThresholds) - 1)
		}
		b.queueLocked(id, e, i, bud, set, now)
	}
}

// queueLocked queues the thresholds in set of id's budget bud (e's i: 0 the month's, 1 the
// total) that were not alerted yet, and marks them alerted.
func (b *budgetBook) queueLocked(id spendID, e *wsSpend, i int, bud budgetOf, set uint8, now time.Time) {
	fresh := set &^ e.alerted[i]
	if fresh == 0 {
		return
	}
	for j, t := range alertThresholds {
		if fresh&(1<<j) == 0 {
			continue
		}
		if len(b.alerts) >= maxPendingAlerts {
			b.dropped++
			b.alerts = b.alerts[1:]
		}
		b.alerts = append(b.alerts, budgetAlert{ws: id.ws, key: id.key, budget: bud.name, percent: t, period: bud.period,
			spent: bud.spent, limit: bud.limit, at: now})
	}
	e.alerted[i] |= fresh
	select {
	case b.kick <- struct{}{}:
	default:
	}
}

// loadAlertsLocked sets the alerts of a spend just loaded: the thresholds recorded in the
// store are alerted, and those its spend passes under limits that are neither recorded nor
// queued yet are queued (the gateway stopped between crossing and recording them).
func (b *budgetBook) loadAlertsLocked(id spendID, e *wsSpend, limits [2]money.USD, recorded []store.BudgetAlert, now time.Time) {
	for i, bud := range budgetsOf(e, limits) {
		for _, a := range recorded {
			if a.Budget != bud.name || a.Period != bud.period {
				continue
			}
			for j, t := range alertThresholds {
				if a.Percent == t {
					e.alerted[i] |= 1 << j
				}
			}
		}
		if bud.limit > 0 {
			b.queueLocked(id, e, i, bud, reached(bud.spent, bud.limit), now)
		}
	}
}

// alertsOf lists the thresholds in set, ascending.
func alertsOf(set uint8) []int32 {
	var out []int32
	for i, t := range alertThresholds {
		if set&(1<<i) != 0 {
			out = append(out, int32(t))
		}
	}
	return out
}

// budgetStatus is ws's budgets with their spend and the alerts crossed, for GetWorkspace
// (none when it has no budget or no price sheet is loaded). It may read the store.
func (c *Core) budgetStatus(ctx context.Context, ws string) ([]*loopsv1.WorkspaceBudget, error) {
	l, ok := c.budgeted(ws)
	if !ok {
		return nil, nil
	}
	limits := [2]money.USD{l.BudgetMonth, l.BudgetTotal}
	if err := c.loadSpend(ctx, spendID{ws: ws}, limits); err != nil {
		return nil, internal("reading the workspace's spend for its budget", err)
	}
	return c.statusOf(spendID{ws: ws}, limits), nil
}

// KeyBudgets is an API key's budgets with its spend and the alerts crossed (none when it
// has no budget or no price sheet is loaded), for KeyService (loops keys list/show) and
// GetWorkspace. It may read the store.
func (c *Core) KeyBudgets(ctx context.Context, k *loopsv1.ApiKey) ([]*loopsv1.WorkspaceBudget, error) {
	if c.opts.Prices.Current() == nil || k.GetRevokeTime() != nil {
		return nil, nil
	}
	var limits [2]money.USD
	for i, v := range []string{k.GetBudgetUsdMonth(), k.GetBudgetUsdTotal()} {
		if v != "" {
			limits[i], _ = policy.ParseBudget(v) // KeyService checked it when it set it
		}
	}
	if limits == [2]money.USD{} {
		return nil, nil
	}
	id := spendID{k.GetWorkspace(), k.GetId()}
	if err := c.loadSpend(ctx, id, limits); err != nil {
		return nil, internal("reading the API key's spend for its budget", err)
	}
	b := c.budgets
	b.mu.Lock()
	if e := b.ws[id]; e != nil {
		e.keyLimits = limits // as the record has them now
	}
	b.mu.Unlock()
	return c.statusOf(id, limits), nil
}

// keyBudgetsOf is the budgets of ws's API keys that have one, for GetWorkspace.
func (c *Core) keyBudgetsOf(ctx context.Context, ws string) ([]*loopsv1.WorkspaceBudget, error) {
	if c.opts.Prices.Current() == nil {
		return nil, nil
	}
	keys, err := c.store.ListAPIKeys(ctx, ws, store.MaxPageLimit)
	if err != nil {
		return nil, internal("listing the workspace's API keys for their budgets", err)
	}
	var out []*loopsv1.WorkspaceBudget
	for _, k := range keys {
		kb, err := c.KeyBudgets(ctx, k)
		if err != nil {
			return nil, err
		}
		out = append(out, kb...)
	}
	return out, nil
}

// statusOf is the loaded spend id's budgets under limits (month, total).
func (c *Core) statusOf(id spendID, limits [2]money.USD) []*loopsv1.WorkspaceBudget {
	b := c.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[id]
	if e == nil {
		return nil
	}
	e.rollLocked(c.now())
	var out []*loopsv1.WorkspaceBudget
	for i, bud := range budgetsOf(e, limits) {
		if bud.limit > 0 {
			out = append(out, &loopsv1.WorkspaceBudget{Name: bud.name, LimitUsd: bud.limit.String(), SpentUsd: bud.spent.String(),
				ReservedUsd: e.reserved.String(), Period: bud.period, Alerts: alertsOf(e.alerted[i]), KeyId: id.key})
		}
	}
	return out
}

// writeAlerts records budget alerts (each with its audit event, once: store.BudgetAlertStore)
// as they come, until ctx ends; alerts the store fails are tried again after alertRetry.
func (c *Core) writeAlerts(ctx context.Context) {
	b := c.budgets
	retry := time.NewTimer(time.Hour)
	retry.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.kick:
		case <-retry.C:
		}
		b.mu.Lock()
		batch, dropped := b.alerts, b.dropped
		b.alerts, b.dropped = nil, 0
		b.mu.Unlock()
		if dropped > 0 {
			c.log.Warn("budget alerts: too many waiting to be written; the oldest were dropped", "dropped", dropped)
		}
		var failed []budgetAlert
		for i, a := range batch {
			if err := c.recordAlert(ctx, a); err != nil {
				c.log.Error("budget alerts: recording them failed; trying again", "alerts", len(batch)-i, "err", err)
				failed = batch[i:]
				break
			}
		}
		if len(failed) > 0 {
			b.mu.Lock()
			b.alerts = append(failed, b.alerts...)
			if over := len(b.alerts) - maxPendingAlerts; over > 0 {
				b.dropped += over
				b.alerts = b.alerts[over:]
			}
			b.mu.Unlock()
			retry.Reset(alertRetry)
		}
	}
}

// recordAlert records one alert with its audit event, unless the store has it.
func (c *Core) recordAlert(ctx context.Context, a budgetAlert) error {
	target := fmt.Sprintf("%s %d%%", a.budget, a.percent)
	if a.period != "" {
		target = fmt.Sprintf("%s %s %d%%", a.budget, a.period, a.percent)
	}
	if a.key != "" {
		target = a.key + " " + target
	}
	ev := store.OwnedAuditEvent{Workspace: a.ws, Event: store.AuditEvent{
		Time: a.at.UTC(), KeyID: a.key, Surface: "budget", Action: fmt.Sprintf("spent %s of %s USD", a.spent, a.limit),
		Event: "budget_alert", Resource: "budget", Target: target, Status: http.StatusOK, Code: "ok"}}
	wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	ok, err := c.store.RecordBudgetAlert(wctx, store.BudgetAlert{Workspace: a.ws, KeyID: a.key, Budget: a.budget, Period: a.period,
		Percent: a.percent, Spent: int64(a.spent), Limit: int64(a.limit), Time: a.at.UTC()}, ev)
	if err == nil && ok {
		c.log.Info("budget alert", "workspace", a.ws, "key", a.key, "budget", a.budget, "percent", a.percent,
			"period", a.period, "spent_usd", a.spent.String(), "budget_usd", a.limit.String())
	}
	return err
}
