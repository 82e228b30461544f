package core

import (
	"context"
	"log/slog"
	"math"
	"sync"
	"time"

	"github.com/loops-dev/loops/gateway/store"
)

// Checkpoint storage metering (docs/operations.md, "Prices"): every janitor sweep samples
// the bytes of each run's checkpoints (store.CheckpointBytes, one aggregate query) and
// integrates what was held since the previous sample into byte-seconds; each hour's
// integral is metered once, when the hour ends (and the current hour's part when the core
// closes), as usage of kind checkpoint_byte_seconds of the run and its session, priced at the sheet's
// storage_gb_month. A gateway that crashes loses at most the current hour's integral: it
// bills less, never more. Bytes count from the sample after a save and stop at the sample
// after a delete, so each change is off by at most one sweep (15 s by default).

// maxStorageRows bounds one sample: the runs with checkpoints metered per sweep.
const maxStorageRows = 100_000

// storageKey is whose checkpoints: a workspace's run's, of its session.
type storageKey struct{ ws, session, run string }

// storageMeter integrates checkpoint bytes held over time.
type storageMeter struct {
	mu sync.Mutex
	// at is when held was sampled (whole seconds, UTC); zero before the first sample.
	at   time.Time
	held map[storageKey]int64
	// hour is the hour bucket acc integrates.
	hour time.Time
	acc  map[storageKey]int64
}

// storageRecord is one run's byte-seconds in the hour bucket that starts at bucket.
type storageRecord struct {
	key         storageKey
	bucket      time.Time
	byteSeconds int64
}

func newStorageMeter() *storageMeter {
	return &storageMeter{held: map[storageKey]int64{}, acc: map[storageKey]int64{}}
}

// advance integrates what was held from the last sample to now and returns the hours that
// ended on the way, to meter; with final, the current hour's part too (the core closes).
func (m *storageMeter) advance(now time.Time, final bool) []storageRecord {
	m.mu.Lock()
	defer m.mu.Unlock()
	now = now.UTC().Truncate(time.Second)
	if m.at.IsZero() {
		m.at, m.hour = now, now.Truncate(usageBucket)
		return nil
	}
	var out []storageRecord
	for m.at.Before(now) {
		end := m.hour.Add(usageBucket)
		if now.Before(end) {
			end = now
		}
		secs := int64(end.Sub(m.at) / time.Second)
		for k, b := range m.held {
			m.acc[k] = addSat(m.acc[k], mulSat(b, secs))
		}
		m.at = end
		if end.Equal(m.hour.Add(usageBucket)) {
			out = m.drainLocked(out)
			m.hour = end
		}
	}
	if final {
		out = m.drainLocked(out)
	}
	return out
}

// drainLocked appends the current hour's integrals to out and starts the hour afresh.
func (m *storageMeter) drainLocked(out []storageRecord) []storageRecord {
	for k, v := range m.acc {
		if v > 0 {
			out = append(out, storageRecord{key: k, bucket: m.hour, byteSeconds: v})
		}
	}
	clear(m.acc)
	return out
}

// set makes held the bytes held from the last sample on.
func (m *storageMeter) set(held map[storageKey]int64) {
	m.mu.Lock()
	m.held = held
	m.mu.Unlock()
}

// mulSat and addSat are a*b and a+b of non-negative numbers, at most math.MaxInt64 (a
// petabyte held for a year is 3e22 byte-seconds past it: never reached by an hour's
// integral of a real store, but never wrapped either).
func mulSat(a, b int64) int64 {
	if a <= 0 || b <= 0 {
		return 0
	}
	if a > math.MaxInt64/b {
		return math.MaxInt64
	}
	return a * b
}

func addSat(a, b int64) int64 {
	if a > math.MaxInt64-b {
		return math.MaxInt64
	}
	return a + b
}

// meterStorage meters the hours of checkpoint storage that ended since the last sweep
// (with final, the current hour's part as well) and, unless final, samples the bytes held
// now. A failed sample keeps the last one.
func (c *Core) meterStorage(ctx context.Context, final bool) {
	for _, r := range c.storage.advance(c.now(), final) {
		c.recordUsageIn(nil, reading{bucket: r.bucket, ws: r.key.ws, session: r.key.session, run: r.key.run,
			kind: store.UsageCheckpointByteSeconds, amount: r.byteSeconds})
	}
	if final {
		return
	}
	rows, err := c.store.CheckpointBytes(ctx, maxStorageRows)
	if err != nil {
		c.log.Error("sampling checkpoint storage; metering the last sample", slog.Any("err", err))
		return
	}
	if len(rows) == maxStorageRows {
		c.log.Warn("sampling checkpoint storage: more runs hold checkpoints than one sample meters; the rest are not metered", slog.Int("max", maxStorageRows))
	}
	held := make(map[storageKey]int64, len(rows))
	for _, r := range rows {
		held[storageKey{r.Workspace, r.SessionID, r.RunID}] = r.Bytes
	}
	c.storage.set(held)
}
