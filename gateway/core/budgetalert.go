package core

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// Budget alerts (docs/operations.md, "Budget alerts"): when a workspace's spend reaches 50%,
// 80% or 100% of one of its budgets (100% also when the budget refuses work: spend rarely
// lands on the cap exactly), an audit event budget_alert is written, once per threshold
// per period (a UTC month for budget_usd_month, ever for budget_usd_total), and the
// thresholds crossed show in GetWorkspace (loops workspace, the console). A workspace's
// spend read back after a start marks the thresholds it already passes as alerted, without
// writing them again.

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
	ws, budget string
	percent    int
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

// alertLocked records the thresholds of e's budgets that its spend now reaches and were
// not alerted yet in their period (b.mu held). atCap names a budget that refused work: its
// 100% alerts too.
func (b *budgetBook) alertLocked(ws string, e *wsSpend, monthLimit, totalLimit money.USD, atCap string, now time.Time) {
	for i, bud := range []struct {
		name         string
		limit, spent money.USD
		period       string
	}{
		{budgetMonth, monthLimit, e.monthSpent, e.month.Format("2006-01")},
		{budgetTotal, totalLimit, e.totalSpent, ""},
	} {
		if bud.limit <= 0 {
			continue
		}
		set := reached(bud.spent, bud.limit)
		if atCap == bud.name {
			set |= 1 << (len(alertThresholds) - 1)
		}
		fresh := set &^ e.alerted[i]
		if fresh == 0 {
			continue
		}
		for j, t := range alertThresholds {
			if fresh&(1<<j) == 0 {
				continue
			}
			if len(b.alerts) >= maxPendingAlerts {
				b.dropped++
				b.alerts = b.alerts[1:]
			}
			b.alerts = append(b.alerts, budgetAlert{ws: ws, budget: bud.name, percent: t, period: bud.period,
				spent: bud.spent, limit: bud.limit, at: now})
		}
		e.alerted[i] |= fresh
		select {
		case b.kick <- struct{}{}:
		default:
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
	if err := c.budgetReady(ctx, ws); err != nil {
		return nil, err
	}
	b := c.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[spendID{ws: ws}]
	if e == nil {
		return nil, nil
	}
	e.rollLocked(c.now())
	var out []*loopsv1.WorkspaceBudget
	for i, bud := range []struct {
		name         string
		limit, spent money.USD
		period       string
	}{
		{budgetMonth, l.BudgetMonth, e.monthSpent, e.month.Format("2006-01")},
		{budgetTotal, l.BudgetTotal, e.totalSpent, ""},
	} {
		if bud.limit > 0 {
			out = append(out, &loopsv1.WorkspaceBudget{Name: bud.name, LimitUsd: bud.limit.String(), SpentUsd: bud.spent.String(),
				ReservedUsd: e.reserved.String(), Period: bud.period, Alerts: alertsOf(e.alerted[i])})
		}
	}
	return out, nil
}

// writeAlerts writes budget alerts to the audit log as they come, until ctx ends.
func (c *Core) writeAlerts(ctx context.Context) {
	b := c.budgets
	for {
		select {
		case <-ctx.Done():
			return
		case <-b.kick:
		}
		b.mu.Lock()
		batch, dropped := b.alerts, b.dropped
		b.alerts, b.dropped = nil, 0
		b.mu.Unlock()
		if dropped > 0 {
			c.log.Warn("budget alerts: too many waiting to be written; the oldest were dropped", "dropped", dropped)
		}
		if len(batch) == 0 {
			continue
		}
		events := make([]store.OwnedAuditEvent, 0, len(batch))
		for _, a := range batch {
			target := fmt.Sprintf("%s %d%%", a.budget, a.percent)
			if a.period != "" {
				target = fmt.Sprintf("%s %s %d%%", a.budget, a.period, a.percent)
			}
			c.log.Info("budget alert", "workspace", a.ws, "budget", a.budget, "percent", a.percent,
				"period", a.period, "spent_usd", a.spent.String(), "budget_usd", a.limit.String())
			events = append(events, store.OwnedAuditEvent{Workspace: a.ws, Event: store.AuditEvent{
				Time: a.at.UTC(), Surface: "budget", Action: fmt.Sprintf("spent %s of %s USD", a.spent, a.limit),
				Event: "budget_alert", Resource: "budget", Target: target, Status: http.StatusOK, Code: "ok"}})
		}
		wctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		if err := c.store.AppendAuditEvents(wctx, events); err != nil {
			c.log.Error("budget alerts: writing them to the audit log failed", "alerts", len(events), "err", err)
		}
		cancel()
	}
}
