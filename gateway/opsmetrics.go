package gateway

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/ckstore"
)

// The stores the health probe checks (the store label of loops_store_up and
// loops_store_probe_failures_total): the metadata store and the checkpoint store.
const (
	storeMetadata   = "metadata"
	storeCheckpoint = "checkpoint"
)

// storeMetrics are the outcomes of the store probes (storeHealth: the health's every
// opsvc.DefaultProbeEvery, and every /healthz).
type storeMetrics struct {
	up       *prometheus.GaugeVec
	failures *prometheus.CounterVec
}

func newStoreMetrics() *storeMetrics {
	m := &storeMetrics{
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "loops_store_up", Help: "1 when the store answered its last health probe (a ping of the metadata store, a lookup in the checkpoint store) within the probe timeout, else 0; by store (metadata, checkpoint).",
		}, []string{"store"}),
		failures: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "loops_store_probe_failures_total", Help: "Health probes of a store that failed or timed out, by store (metadata, checkpoint).",
		}, []string{"store"}),
	}
	for _, st := range []string{storeMetadata, storeCheckpoint} {
		m.up.WithLabelValues(st).Set(1)
		m.failures.WithLabelValues(st)
	}
	return m
}

// observe records a probe of store st.
func (m *storeMetrics) observe(st string, ok bool) {
	if m == nil {
		return
	}
	if ok {
		m.up.WithLabelValues(st).Set(1)
		return
	}
	m.up.WithLabelValues(st).Set(0)
	m.failures.WithLabelValues(st).Inc()
}

// registerOpsMetrics registers the store probes' metrics, the checkpoint store's space
// and the backend's workers on reg.
func (s *Server) registerOpsMetrics(reg prometheus.Registerer) {
	reg.MustRegister(s.storeMetrics.up, s.storeMetrics.failures, opsCollector{s})
}

// opsCollector serves, at scrape time, the checkpoint store's space (a statfs of its
// folder; nothing for a store that cannot tell, such as S3) and the backend's workers.
type opsCollector struct{ s *Server }

var (
	descCkTotal = prometheus.NewDesc("loops_checkpoint_store_capacity_bytes",
		"Size of the file system holding the checkpoint store's folder (absent for S3).", nil, nil)
	descCkAvail = prometheus.NewDesc("loops_checkpoint_store_available_bytes",
		"Bytes of the checkpoint store's file system still available to the gateway (absent for S3).", nil, nil)
	descWorkers = prometheus.NewDesc("loops_backend_workers",
		"The backend's worker processes by state: up (serving) or down (exited, not answering or NOT_SERVING, not yet back); 0 and 0 for the embedded engine, which has none.",
		[]string{"state"}, nil)
)

// Describe implements prometheus.Collector.
func (c opsCollector) Describe(ch chan<- *prometheus.Desc) {
	ch <- descCkTotal
	ch <- descCkAvail
	ch <- descWorkers
}

// Collect implements prometheus.Collector.
func (c opsCollector) Collect(ch chan<- prometheus.Metric) {
	cs := c.s.cfg.Core.CheckpointStore
	if core := c.s.leaderCore(); core != nil {
		cs = core.CheckpointStore()
	}
	if sp, ok := cs.(ckstore.Space); ok {
		if total, avail, err := sp.Space(); err == nil {
			ch <- prometheus.MustNewConstMetric(descCkTotal, prometheus.GaugeValue, float64(total))
			ch <- prometheus.MustNewConstMetric(descCkAvail, prometheus.GaugeValue, float64(avail))
		}
	}
	up, down := 0, 0
	if wh, ok := c.s.backend.(backends.WorkerHealth); ok {
		up, down = wh.WorkerHealth()
	}
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(up), "up")
	ch <- prometheus.MustNewConstMetric(descWorkers, prometheus.GaugeValue, float64(down), "down")
}
