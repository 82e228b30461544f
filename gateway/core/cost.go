package core

import (
	"log/slog"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// maxCostWorkspaceLabels bounds the workspace label values of loops_cost_usd_total: the
// first workspaces to spend get their own series, the rest share otherWorkspaceLabel.
const maxCostWorkspaceLabels = 1000

// otherWorkspaceLabel is the workspace label of the spend of workspaces past the bound.
const otherWorkspaceLabel = "_other"

// costMetric is the counter of USD spent by workspace, its label values bounded.
type costMetric struct {
	usd *prometheus.CounterVec
	mu  sync.Mutex
	ws  map[string]bool
}

func newCostMetric(reg prometheus.Registerer) *costMetric {
	m := &costMetric{
		usd: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_cost_usd_total",
			Help: "USD of metered usage priced by the price sheet, by workspace (the first 1000 workspaces to spend; the rest under _other). For dashboards: the usage API's costs are exact, this counter is a float.",
		}, []string{"workspace"}),
		ws: map[string]bool{},
	}
	if reg != nil {
		reg.MustRegister(m.usd)
	}
	return m
}

func (m *costMetric) add(ws string, c money.USD) {
	m.mu.Lock()
	if !m.ws[ws] {
		if len(m.ws) < maxCostWorkspaceLabels {
			m.ws[ws] = true
		} else {
			ws = otherWorkspaceLabel
		}
	}
	m.mu.Unlock()
	// Metrics only: the exact amount is in the store.
	m.usd.WithLabelValues(ws).Add(float64(c) / 1e12)
}

// opCost is what an operation's metered usage has cost so far.
type opCost struct {
	priced   bool
	usd      money.USD
	versions []string
}

// priceUsage prices amount of kind for a workspace on model (gpuKind: a dedicated pool's GPU
// kind, for GPU-seconds) with the sheet in force now:
// the cost, whether the sheet prices it, and the sheet's version. A cost that overflows
// is logged and left unpriced.
func (c *Core) priceUsage(ws, model, kind, gpuKind string, amount int64) (money.USD, bool, string) {
	sheet := c.opts.Prices.Current()
	if sheet == nil {
		return 0, false, ""
	}
	cost, ok, err := sheet.Cost(ws, model, kind, gpuKind, amount)
	if err != nil {
		c.log.Error("usage left unpriced", slog.String("workspace", ws), slog.Any("err", err))
		return 0, false, ""
	}
	if ok {
		c.costs.add(ws, cost)
	}
	return cost, ok, sheet.Version()
}

// addCost adds a priced part of an operation's usage to its cost.
func (ops *operations) addCost(o *operation, usd money.USD, version string) {
	o.mu.Lock()
	sum, err := money.Add(o.cost.usd, usd)
	if err == nil {
		o.cost.priced, o.cost.usd = true, sum
		if !slices.Contains(o.cost.versions, version) {
			o.cost.versions = append(o.cost.versions, version)
		}
	}
	o.mu.Unlock()
	if err != nil {
		ops.core.log.Error("operation cost overflows; kept at its last value", slog.String("op", o.id))
	}
}

// costUSD is the operation's cost so far as decimal USD, "" when none of it was priced.
func (o *operation) costUSD() string {
	o.mu.Lock()
	defer o.mu.Unlock()
	if !o.cost.priced {
		return ""
	}
	return o.cost.usd.String()
}

// costProtoLocked is the operation's cost for its record, nil when none of it was priced.
// o.mu is held.
func (o *operation) costProtoLocked() *loopsv1.OperationCost {
	if !o.cost.priced {
		return nil
	}
	return &loopsv1.OperationCost{Usd: o.cost.usd.String(), PriceVersions: slices.Clone(o.cost.versions)}
}
