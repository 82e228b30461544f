package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/types/known/timestamppb"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// TestCheckpointStorageMetered: sess-1 holds 2 GB of checkpoints from 10:59:00 and sess-2
// 1 GB from 11:00:30; the janitor samples at 10:59:00, 11:00:30 and 12:00:00 and the core
// closes at 12:00:10. Each hour is metered once, split at the hour, in byte-seconds, and
// priced at storage_gb_month 0.031 (a GB-month: 1e9 bytes × 730 h), each figure checked by
// hand (exact rationals, rounded half up to the pico-dollar):
//
//	10:00 sess-1  2e9 × 60 s   = 1.2e11   → 0.031 × 1.2e11 / 2.628e15 = 1415525.11 p$
//	11:00 sess-1  2e9 × 3600 s = 7.2e12   → 84931506.85 p$
//	11:00 sess-2  1e9 × 3570 s = 3.57e12  → 42111872.15 p$
//	12:00 sess-1  2e9 × 10 s   = 2e10     → 235920.85 p$ (metered at close)
//	12:00 sess-2  1e9 × 10 s   = 1e10     → 117960.43 p$
func TestCheckpointStorageMetered(t *testing.T) {
	sheet := testPrices(t, "storage_gb_month: \"0.031\"\n")
	var (
		mu  sync.Mutex
		now = time.Date(2026, 12, 6, 10, 59, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	dir := t.TempDir()
	h, stop := openHarnessWith(t, dir, newFakeBackend(), nil, Options{Prices: sheet, Now: clock, SweepInterval: time.Hour})
	st := h.core.store
	hold := func(run, session string, bytes int64) {
		require.NoError(t, st.PutTrainingRun(h.ctx, "ws-a", &loopsv1.TrainingRun{Id: run, SessionId: session, BaseModel: "fake/model",
			CreateTime: timestamppb.New(clock())}))
		require.NoError(t, st.PutCheckpoint(h.ctx, "ws-a", &loopsv1.Checkpoint{Id: "c-" + run, TrainingRunId: run, SizeBytes: bytes,
			Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, TinkerPath: "tinker://" + run + "/weights/c", CreateTime: timestamppb.New(clock())}))
	}
	hold("run-1", "sess-1", 2e9)
	h.core.meterStorage(h.ctx, false) // 10:59:00
	set(time.Date(2026, 12, 6, 11, 0, 30, 0, time.UTC))
	h.core.meterStorage(h.ctx, false)
	hold("run-2", "sess-2", 1e9) // saved at 11:00:30 after that sweep: the next sample (also 11:00:30) counts it
	h.core.meterStorage(h.ctx, false)
	set(time.Date(2026, 12, 6, 12, 0, 0, 0, time.UTC))
	h.core.meterStorage(h.ctx, false)
	set(time.Date(2026, 12, 6, 12, 0, 10, 0, time.UTC))
	stop() // the current hour's part is metered at close

	h, _ = openHarnessWith(t, dir, newFakeBackend(), nil, Options{Prices: sheet, Now: clock, SweepInterval: time.Hour})
	res, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	type row struct {
		hour, session string
		amount        int64
		cost          string
	}
	var got []row
	for _, b := range res.GetBuckets() {
		if b.GetKind() == loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS {
			require.Equal(t, b.GetAmount(), b.GetPricedAmount())
			got = append(got, row{b.GetStartTime().AsTime().Format("15:04"), b.GetSessionId(), b.GetAmount(), b.GetCostUsd()})
		}
	}
	require.ElementsMatch(t, []row{
		{"10:00", "sess-1", 120_000_000_000, "0.000001415525"},
		{"11:00", "sess-1", 7_200_000_000_000, "0.000084931507"},
		{"11:00", "sess-2", 3_570_000_000_000, "0.000042111872"},
		{"12:00", "sess-1", 20_000_000_000, "0.000000235921"},
		{"12:00", "sess-2", 10_000_000_000, "0.00000011796"},
	}, got)
}

// TestCheckpointStoragePerRun: two runs of one session hold checkpoints of different sizes,
// and each run's storage is metered and priced on its own (storage_gb_month 0.031: a
// GB-month is 1e9 bytes × 730 h = 2.628e15 byte-seconds), checked by hand:
//
//	run-1  2e9 B from 10:00:00 to 11:00:00:              7.2e12 B·s → 0.031 × 7.2e12 / 2.628e15 = 84931506.85 p$
//	run-2  5e8 B to 10:30:00, then 1.5e9 B to 11:00:00: 9e11 + 2.7e12 = 3.6e12 B·s → 42465753.42 p$
//
// The usage API groups them by run (training_run_id), and the two add up to the session's.
func TestCheckpointStoragePerRun(t *testing.T) {
	sheet := testPrices(t, "storage_gb_month: \"0.031\"\n")
	var (
		mu  sync.Mutex
		now = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	)
	clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
	set := func(t time.Time) { mu.Lock(); now = t; mu.Unlock() }
	h := newHarness(t, t.TempDir(), Options{Prices: sheet, Now: clock, SweepInterval: time.Hour})
	st := h.core.store
	hold := func(run string, bytes int64) {
		require.NoError(t, st.PutTrainingRun(h.ctx, "ws-a", &loopsv1.TrainingRun{Id: run, SessionId: "sess-1", BaseModel: "fake/model",
			CreateTime: timestamppb.New(clock())}))
		require.NoError(t, st.PutCheckpoint(h.ctx, "ws-a", &loopsv1.Checkpoint{Id: "c", TrainingRunId: run, SizeBytes: bytes,
			Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_TRAINING, TinkerPath: "tinker://" + run + "/weights/c", CreateTime: timestamppb.New(clock())}))
	}
	hold("run-1", 2e9)
	hold("run-2", 5e8)
	h.core.meterStorage(h.ctx, false) // 10:00:00
	set(time.Date(2026, 12, 6, 10, 30, 0, 0, time.UTC))
	h.core.meterStorage(h.ctx, false)
	hold("run-2", 1.5e9) // its checkpoint overwritten, larger, after the 10:30 sample
	h.core.meterStorage(h.ctx, false)
	set(time.Date(2026, 12, 6, 11, 0, 0, 0, time.UTC))
	h.core.meterStorage(h.ctx, false) // the 10:00 hour ends: metered

	res, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	type row struct {
		hour, session, run string
		amount             int64
		cost               string
	}
	var got []row
	var sum money.USD
	for _, b := range res.GetBuckets() {
		if b.GetKind() == loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS {
			got = append(got, row{b.GetStartTime().AsTime().Format("15:04"), b.GetSessionId(), b.GetTrainingRunId(), b.GetAmount(), b.GetCostUsd()})
			c, err := money.ParseUSD(b.GetCostUsd(), money.Digits)
			require.NoError(t, err)
			sum += c
		}
	}
	require.Equal(t, []row{
		{"10:00", "sess-1", "run-1", 7_200_000_000_000, "0.000084931507"},
		{"10:00", "sess-1", "run-2", 3_600_000_000_000, "0.000042465753"},
	}, got)
	require.Equal(t, "0.00012739726", sum.String(), "the session's: both runs'")
}

// TestStorageMeterSaturates: an integral past int64 stays at the maximum, never wraps.
func TestStorageMeterSaturates(t *testing.T) {
	m := newStorageMeter()
	t0 := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	require.Empty(t, m.advance(t0, false))
	m.set(map[storageKey]int64{{"ws", "s", "r"}: 1 << 62})
	out := m.advance(t0.Add(time.Hour), false)
	require.Equal(t, []storageRecord{{key: storageKey{"ws", "s", "r"}, bucket: t0, byteSeconds: 1<<63 - 1}}, out)
	require.Empty(t, m.advance(t0.Add(time.Hour), true), "nothing held for no time")
}

// fakePools reports fixed replica-seconds per pool.
type fakePools struct{ seconds map[string]float64 }

func (f fakePools) AcquirePool(context.Context, backends.PoolRequest) (backends.PoolGrant, error) {
	return backends.PoolGrant{}, errors.New("not in this test")
}
func (f fakePools) ReleasePool(context.Context, string) {}
func (f fakePools) ReplicaSeconds(pool string) float64  { return f.seconds[pool] }

// TestDedicatedGPUTimePricedByKind: a dedicated pool's GPU-seconds are priced by the pool's
// GPU kind. Two runs hold pools of 2 GPUs a replica for 1800 replica-seconds (3600
// GPU-seconds = 1 GPU-hour each): the H100 pool at gpu_hour H100 3 → 3 USD, the A10 pool
// (not listed) at "*" 2.50 → 2.5 USD. Pool time is metered per run, so each run has its
// rows (of one session and model); replica-seconds have no price.
func TestDedicatedGPUTimePricedByKind(t *testing.T) {
	sheet := testPrices(t, "gpu_hour: {\"*\": \"2.50\", H100: 3}\n")
	h := newHarness(t, t.TempDir(), Options{Prices: sheet, SweepInterval: time.Hour})
	h.core.dedicatedPools = fakePools{seconds: map[string]float64{"p-h100": 1800, "p-a10": 1800}}
	want := map[string]string{}
	for pool, kind := range map[string]string{"p-h100": "H100", "p-a10": "A10"} {
		run := h.newRun()
		r := h.core.runs.peek(run)
		require.NotNil(t, r)
		r.SetPool(pool, 1, 2, kind)
		h.core.meterPool(r, false)
		want[run] = map[string]string{"H100": "3", "A10": "2.5"}[kind]
	}
	res, err := h.svc.Usage.GetUsage(h.ctx, &loopsv1.GetUsageRequest{})
	require.NoError(t, err)
	got := map[string]string{}
	var replica int
	for _, b := range res.GetBuckets() {
		switch b.GetKind() {
		case loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS:
			require.Equal(t, int64(3600), b.GetAmount())
			got[b.GetTrainingRunId()] = b.GetCostUsd()
		case loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS:
			replica++
			require.Equal(t, int64(1800), b.GetAmount())
			require.Empty(t, b.GetCostUsd())
		}
	}
	require.Equal(t, want, got)
	require.Equal(t, 2, replica)
}

// zeroingPools is fakePools that can scale a pool to zero: it records each call, and scales
// each pool once.
type zeroingPools struct {
	fakePools
	mu    sync.Mutex
	calls []string
	zero  map[string]bool
}

func (z *zeroingPools) ScaleIdleToZero(_ context.Context, pool string, idle time.Duration, reason string) (bool, error) {
	z.mu.Lock()
	defer z.mu.Unlock()
	z.calls = append(z.calls, pool+" after "+idle.String()+": "+reason)
	if z.zero[pool] {
		return false, nil
	}
	z.zero[pool] = true
	return true, nil
}

// TestPoolsScaledToZeroAtTheCap: a workspace under its total budget keeps its dedicated
// pool; at the cap (spent = budget) the janitor asks the backend to scale the pool to zero
// once it has idled a minute, with a reason naming the budget, and audits it once
// (pool_scale_to_zero); a pool already at zero is not audited again.
func TestPoolsScaledToZeroAtTheCap(t *testing.T) {
	sheet := testPrices(t, "models:\n  \"*\": {train: \"1\"}\n")
	pol, err := policy.Parse([]byte("workspaces:\n  ws-a: {budget_usd_total: \"0.00001\"}\n"))
	require.NoError(t, err)
	h := newHarness(t, t.TempDir(), Options{Prices: sheet, Policy: pol, SweepInterval: time.Hour})
	z := &zeroingPools{zero: map[string]bool{}}
	h.core.dedicatedPools = z
	r := h.core.runs.peek(h.newRun())
	r.SetPool("p-1", 1, 1, "H100")
	require.NoError(t, h.core.budgetReady(h.ctx, "ws-a"))
	spend := func(usd string) {
		v := testUSD(t, usd)
		b := h.core.budgets
		b.mu.Lock()
		b.ws[spendID{ws: "ws-a"}].totalSpent = v
		b.mu.Unlock()
	}
	spend("0.000009")
	h.core.zeroPoolsAtCap(h.ctx)
	require.Empty(t, z.calls, "under the budget")
	spend("0.00001")
	h.core.zeroPoolsAtCap(h.ctx)
	h.core.zeroPoolsAtCap(h.ctx)
	why := "workspace ws-a reached its budget_usd_total (0.00001 of 0.00001 USD spent): its idle dedicated pools are scaled to zero until an operator raises it"
	require.Equal(t, []string{"p-1 after 1m0s: " + why, "p-1 after 1m0s: " + why}, z.calls)
	got := h.poolStopsAudited()
	require.Equal(t, []string{"p-1: " + why}, got, "audited once")
}
