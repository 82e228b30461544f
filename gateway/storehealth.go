package gateway

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/prometheus/client_golang/prometheus"

	"github.com/loops-dev/loops/gateway/ckstore"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/gateway/store/postgres"
	"github.com/loops-dev/loops/gateway/store/sqlite"
)

// StoreHealthTimeout bounds the store ping of /healthz: a store slower than this is
// reported unavailable.
const StoreHealthTimeout = 2 * time.Second

// storeKind names the kind of a store for /healthz and the loops_store_info metric:
// "sqlite", "postgres", or "other" for a store supplied by an embedding program.
func storeKind(st store.Store) string {
	switch st.(type) {
	case *sqlite.Store:
		return "sqlite"
	case *postgres.Store:
		return "postgres"
	default:
		return "other"
	}
}

// healthBody is the JSON answer of /healthz.
type healthBody struct {
	// Status is "ok" (200) or "unavailable" (503).
	Status string `json:"status"`
	// Store is "ok", or what went wrong with it: "timeout", "closed" or "error".
	Store string `json:"store"`
	// StoreKind is the store in use (see storeKind).
	StoreKind string `json:"store_kind"`
	// CheckpointStore is "ok", or what went wrong with the checkpoint store: "timeout" or
	// "error".
	CheckpointStore string `json:"checkpoint_store"`
	// CheckpointStoreKind is "local" (a folder) or "s3".
	CheckpointStoreKind string `json:"checkpoint_store_kind"`
	// Error says, when Status is "unavailable", what failed; details are in the server's log.
	Error string `json:"error,omitempty"`
	// Role is "leader" (this gateway runs the schedulers; always so without a lease) or
	// "standby" (it forwards to the leader; standby.go).
	Role string `json:"role"`
	// Lease is what this gateway knows of the leader lease (absent without one).
	Lease *leaseHealth `json:"lease,omitempty"`
}

// healthz answers /healthz: 200 when the store answers a ping and the checkpoint store a
// lookup within StoreHealthTimeout, else 503 naming the failure. A store that cannot be
// pinged (not a store.Pinger) counts as healthy.
func (s *Server) healthz(w http.ResponseWriter, r *http.Request) {
	body, code := s.storeHealth(r.Context(), s.log)
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(body)
}

// storeProblem is the health probe (opsvc.HealthOptions.Probe): "" when the store and the
// checkpoint store answer as /healthz requires, else what failed. It logs nothing: the
// health logs its changes.
func (s *Server) storeProblem(ctx context.Context) string {
	body, _ := s.storeHealth(ctx, slog.New(slog.DiscardHandler))
	return body.Error
}

// storeHealth pings the store and looks up the checkpoint store, each within
// StoreHealthTimeout, logging a failure to log; it returns /healthz's body and status.
func (s *Server) storeHealth(ctx context.Context, log *slog.Logger) (healthBody, int) {
	kind := storeKind(s.store)
	body, code := healthBody{Status: "ok", Store: "ok", StoreKind: kind, Role: s.role(), Lease: s.leaseStatus()}, http.StatusOK
	msg := s.checkpointStoreHealth(ctx, &body, log)
	s.storeMetrics.observe(storeCheckpoint, msg == "")
	if msg != "" {
		body.Status, body.Error, code = "unavailable", msg, http.StatusServiceUnavailable
	}
	if p, ok := s.store.(store.Pinger); ok {
		pctx, cancel := context.WithTimeout(ctx, StoreHealthTimeout)
		err := p.Ping(pctx)
		cancel()
		s.storeMetrics.observe(storeMetadata, err == nil)
		if err != nil {
			body.Status, code = "unavailable", http.StatusServiceUnavailable
			switch {
			case errors.Is(err, context.DeadlineExceeded) && ctx.Err() == nil:
				body.Store = "timeout"
				body.Error = fmt.Sprintf("the %s store did not answer a ping within %s", kind, StoreHealthTimeout)
			case isClosed(err):
				body.Store = "closed"
				body.Error = fmt.Sprintf("the %s store is closed (the server is shutting down)", kind)
			default:
				body.Store = "error"
				body.Error = fmt.Sprintf("the %s store's ping failed (the server's log has the details)", kind)
			}
			log.Warn("health check: store ping failed", slog.String("store", kind), slog.Any("err", err))
		}
	}
	return body, code
}

// healthCheckKey is the checkpoint key /healthz looks up: never a checkpoint (the core's
// keys have four segments), so a healthy store answers "not found".
const healthCheckKey = "loops-health-check"

// checkpointStoreHealth looks up healthCheckKey in the core's checkpoint store within
// StoreHealthTimeout and fills in body's checkpoint store fields; it returns what failed,
// or "".
func (s *Server) checkpointStoreHealth(ctx context.Context, body *healthBody, log *slog.Logger) string {
	cs := s.cfg.Core.CheckpointStore // a standby has no core yet
	if c := s.leaderCore(); c != nil {
		cs = c.CheckpointStore()
	}
	if cs == nil { // a standby's default local folder, opened when it takes over
		body.CheckpointStore, body.CheckpointStoreKind = "ok", "local"
		return ""
	}
	body.CheckpointStore, body.CheckpointStoreKind = "ok", "s3"
	if _, ok := cs.(ckstore.LocalDirs); ok {
		body.CheckpointStoreKind = "local"
	}
	ctx, cancel := context.WithTimeout(ctx, StoreHealthTimeout)
	defer cancel()
	_, err := cs.Stat(ctx, healthCheckKey)
	switch {
	case err == nil || errors.Is(err, ckstore.ErrNotFound):
		return ""
	case errors.Is(err, context.DeadlineExceeded):
		body.CheckpointStore = "timeout"
		log.Warn("health check: checkpoint store lookup timed out", slog.String("checkpoint_store", cs.String()))
		return fmt.Sprintf("the checkpoint store did not answer a lookup within %s", StoreHealthTimeout)
	default:
		body.CheckpointStore = "error"
		log.Warn("health check: checkpoint store lookup failed", slog.String("checkpoint_store", cs.String()), slog.Any("err", err))
		return "the checkpoint store's lookup failed (the server's log has the details)"
	}
}

// isClosed reports whether err says the store's connections are closed.
func isClosed(err error) bool {
	for e := err; e != nil; e = errors.Unwrap(e) {
		switch e.Error() {
		case "sql: database is closed", "closed pool":
			return true
		}
	}
	return false
}

// registerStoreMetrics registers loops_store_info, and the connection pool's gauges and
// counters when st is a PostgreSQL store.
func registerStoreMetrics(reg prometheus.Registerer, st store.Store) {
	info := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "loops_store_info", Help: "The metadata store in use (always 1), by kind: sqlite, postgres or other.",
	}, []string{"kind"})
	info.WithLabelValues(storeKind(st)).Set(1)
	reg.MustRegister(info)
	if p, ok := st.(interface{ Stat() *pgxpool.Stat }); ok {
		reg.MustRegister(newPoolCollector(p.Stat))
	}
}

// poolCollector exports a pgxpool's statistics, read once per scrape.
type poolCollector struct {
	stat  func() *pgxpool.Stat
	descs []poolMetric
}

// poolMetric is one statistic of the pool.
type poolMetric struct {
	desc  *prometheus.Desc
	kind  prometheus.ValueType
	value func(*pgxpool.Stat) float64
}

func newPoolCollector(stat func() *pgxpool.Stat) *poolCollector {
	m := func(name, help string, kind prometheus.ValueType, value func(*pgxpool.Stat) float64) poolMetric {
		return poolMetric{desc: prometheus.NewDesc(name, help, nil, nil), kind: kind, value: value}
	}
	return &poolCollector{stat: stat, descs: []poolMetric{
		m("loops_store_pool_total_conns", "PostgreSQL pool: connections open (idle, acquired and being established).",
			prometheus.GaugeValue, func(s *pgxpool.Stat) float64 { return float64(s.TotalConns()) }),
		m("loops_store_pool_idle_conns", "PostgreSQL pool: idle connections.",
			prometheus.GaugeValue, func(s *pgxpool.Stat) float64 { return float64(s.IdleConns()) }),
		m("loops_store_pool_acquired_conns", "PostgreSQL pool: connections in use.",
			prometheus.GaugeValue, func(s *pgxpool.Stat) float64 { return float64(s.AcquiredConns()) }),
		m("loops_store_pool_constructing_conns", "PostgreSQL pool: connections being established.",
			prometheus.GaugeValue, func(s *pgxpool.Stat) float64 { return float64(s.ConstructingConns()) }),
		m("loops_store_pool_max_conns", "PostgreSQL pool: the most connections it opens.",
			prometheus.GaugeValue, func(s *pgxpool.Stat) float64 { return float64(s.MaxConns()) }),
		m("loops_store_pool_acquires_total", "PostgreSQL pool: connections acquired.",
			prometheus.CounterValue, func(s *pgxpool.Stat) float64 { return float64(s.AcquireCount()) }),
		m("loops_store_pool_acquire_duration_seconds_total", "PostgreSQL pool: time spent acquiring connections, summed.",
			prometheus.CounterValue, func(s *pgxpool.Stat) float64 { return s.AcquireDuration().Seconds() }),
		m("loops_store_pool_empty_acquires_total", "PostgreSQL pool: acquires that had to wait for a connection (none was idle).",
			prometheus.CounterValue, func(s *pgxpool.Stat) float64 { return float64(s.EmptyAcquireCount()) }),
		m("loops_store_pool_canceled_acquires_total", "PostgreSQL pool: acquires given up because their context ended.",
			prometheus.CounterValue, func(s *pgxpool.Stat) float64 { return float64(s.CanceledAcquireCount()) }),
	}}
}

// Describe implements prometheus.Collector.
func (c *poolCollector) Describe(ch chan<- *prometheus.Desc) {
	for _, d := range c.descs {
		ch <- d.desc
	}
}

// Collect implements prometheus.Collector.
func (c *poolCollector) Collect(ch chan<- prometheus.Metric) {
	s := c.stat()
	for _, d := range c.descs {
		ch <- prometheus.MustNewConstMetric(d.desc, d.kind, d.value(s))
	}
}
