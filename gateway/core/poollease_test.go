package core

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/backends"
	"github.com/loops-dev/loops/gateway/policy"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
)

// clockPoolSet is dedicated pools of one 1-GPU H100 replica each ("p-1", "p-2", … in the
// order they are acquired) that run on the test's clock from their acquisition until they
// are scaled to zero; ScaleIdleToZero answers false refuse times first, as a backend does
// while a replica is starting.
type clockPoolSet struct {
	mu          sync.Mutex
	now         func() time.Time
	start, stop map[string]time.Time
	refuse      int
	calls       []string
}

func (p *clockPoolSet) AcquirePool(context.Context, backends.PoolRequest) (backends.PoolGrant, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pool := fmt.Sprintf("p-%d", len(p.start)+1)
	p.start[pool] = p.now()
	return backends.PoolGrant{Pool: pool, GPUsPerReplica: 1, GPUKind: "H100"}, nil
}

func (p *clockPoolSet) ReleasePool(_ context.Context, pool string) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, "released "+pool)
}

func (p *clockPoolSet) ReplicaSeconds(pool string) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	end, ok := p.stop[pool]
	if !ok {
		end = p.now()
	}
	return end.Sub(p.start[pool]).Seconds()
}

func (p *clockPoolSet) ScaleIdleToZero(_ context.Context, pool string, idle time.Duration, reason string) (bool, error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.calls = append(p.calls, fmt.Sprintf("%s after %s: %s", pool, idle, reason))
	if _, ok := p.stop[pool]; ok {
		return false, nil
	}
	if p.refuse > 0 {
		p.refuse--
		return false, nil
	}
	p.stop[pool] = p.now()
	return true, nil
}

// newClockPools is a clockPoolSet on the clock now whose ScaleIdleToZero refuses refuse
// times first.
func newClockPools(now func() time.Time, refuse int) *clockPoolSet {
	return &clockPoolSet{now: now, start: map[string]time.Time{}, stop: map[string]time.Time{}, refuse: refuse}
}

// TestDedicatedPoolHeldToItsBudget: a dedicated pool of 1 H100 at gpu_hour 3.6 (0.001 USD a
// GPU-second) under a total budget of 0.5 USD, swept every 15 s on a fake clock. Its lease
// holds the next minute (0.06 USD). Each sweep meters 15 s (0.015 USD) off the lease and
// tops it up again while spent + lease + top-up ≤ 0.5: 0.015k + 0.06 ≤ 0.5 holds up to the
// 29th sweep (435 s), so the 30th (450 s, spent 0.45, lease 0.045) stops the pool, busy or
// idle (scaled to zero with idle 0), with the budget error, and gives the lease back.
//   - A pool that stops at once has spent 0.45 USD: under the budget, never past it.
//   - One whose backend cannot stop it for 4 sweeps (a replica starting) stops at 510 s,
//     15 s past the end of its last lease (435 + 60 = 495 s): spent 0.51 USD, 0.01 past the
//     budget, within the stated bound (the pool's time past its lease: 15 s × 0.001 USD).
//
// The run's work queued before the stop is refused with the error the pool was stopped
// with, and new work (a forward_backward, a sample of its checkpoint, which its pool
// samples) with the final ResourceExhausted error naming the budget.
func TestDedicatedPoolHeldToItsBudget(t *testing.T) {
	sheet := testPrices(t, "gpu_hour: {H100: \"3.6\"}\n")
	pol, err := policy.Parse([]byte("workspaces:\n  ws-a: {budget_usd_total: \"0.5\"}\n"))
	require.NoError(t, err)
	usd := func(s string) money.USD { return testUSD(t, s) }
	for _, tc := range []struct {
		refuse     int
		spent      string
		stoppedAt  time.Duration
		overBudget string
	}{
		{refuse: 0, spent: "0.45", stoppedAt: 450 * time.Second, overBudget: "0"},
		{refuse: 4, spent: "0.51", stoppedAt: 510 * time.Second, overBudget: "0.01"},
	} {
		t.Run(fmt.Sprintf("refused %d times", tc.refuse), func(t *testing.T) {
			var (
				mu  sync.Mutex
				now = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
			)
			t0 := now
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			h := newHarness(t, t.TempDir(), Options{Prices: sheet, Policy: pol, Now: clock, SweepInterval: 15 * time.Second})
			pools := newClockPools(clock, tc.refuse)
			pools.start["p-1"] = t0 // bound below, as acquirePool binds it
			h.core.dedicatedPools = pools
			run := h.newRun()
			r := h.core.runs.peek(run)
			r.SetPool("p-1", 1, 1, "H100") // as acquirePool binds it, then holds its lease
			require.NoError(t, h.core.holdPool(h.ctx, r, ""))
			book := func() (spent, reserved money.USD) {
				b := h.core.budgets
				b.mu.Lock()
				defer b.mu.Unlock()
				e := b.ws[spendID{ws: "ws-a"}]
				return e.totalSpent, e.reserved
			}
			_, reserved := book()
			require.Equal(t, usd("0.06"), reserved, "a minute of the pool ahead")
			// A sampler of the run's checkpoint samples on its pool.
			sop, err := h.svc.Training.SaveWeights(h.ctx, &loopsv1.SaveWeightsRequest{TrainingRunId: run, SeqId: 1, Kind: loopsv1.CheckpointKind_CHECKPOINT_KIND_SAMPLER, Name: "s"})
			require.NoError(t, err)
			smp, err := h.svc.Sampling.CreateSampler(h.ctx, &loopsv1.CreateSamplerRequest{ModelPath: h.wait(sop).GetSaveWeights().GetPath()})
			require.NoError(t, err)
			sample := func() (*loopsv1.Operation, error) {
				return h.svc.Sampling.Sample(h.ctx, &loopsv1.SampleRequest{SamplerId: smp.GetId(), Prompt: []int32{1}, NumSamples: 1, Params: &loopsv1.SamplingParams{MaxTokens: 2}})
			}
			op, err := sample()
			require.NoError(t, err)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())

			sweep := func() { // the janitor's round of pools
				mu.Lock()
				now = now.Add(15 * time.Second)
				mu.Unlock()
				h.core.sweepPools(h.ctx)
			}
			for range 29 {
				sweep()
			}
			spent, reserved := book()
			require.Equal(t, usd("0.435"), spent)
			require.Equal(t, usd("0.06"), reserved, "topped up to a whole minute again")
			require.Empty(t, pools.calls)

			// Work admitted before the stop: one running (held in the backend), one queued.
			h.fake.gate, h.fake.entered = make(chan struct{}), make(chan struct{}, 1)
			running, err := h.fb(run, 2, datum(1, 2, 3))
			require.NoError(t, err)
			<-h.fake.entered
			queued, err := h.fb(run, 3, datum(1, 2, 3))
			require.NoError(t, err)

			for now.Sub(t0) < tc.stoppedAt {
				sweep()
			}
			spent, reserved = book()
			require.Equal(t, usd(tc.spent), spent)
			require.Zero(t, reserved, "the lease given back once the pool is at zero")
			over := spent - usd("0.5") // both far from an overflow
			require.Equal(t, usd(tc.overBudget), max(over, 0))
			// The bound: what ran past the end of the last lease (435 s + 60 s).
			past := tc.stoppedAt - 495*time.Second
			require.LessOrEqual(t, over, money.USD(int64(max(past, 0)/time.Second)*1_000_000_000))

			// The first sweep that could not top the lease up asked to stop it, busy or idle.
			calls := pools.calls
			require.Len(t, calls, tc.refuse+1+map[bool]int{true: 1}[tc.refuse > 0], "asked each sweep until stopped (and once more by the idle rule at 100%%)")
			require.Equal(t, `p-1 after 0s: workspace "ws-a" has spent 0.45 USD in all (and has 0.045 USD of work running) of its budget of 0.5 USD (budget_usd_total in its policy); holding the next 1m0s of training run `+run+`'s dedicated pool p-1 (0.06 USD at its full shape; 0.015 USD more than its lease holds) would pass it, so the pool is stopped (scaled to zero) and the run's work is refused until the budget is raised: ask an operator to raise budget_usd_total in the workspace policy (loops serve --workspace-policy)`, calls[0])
			why := connectMessage(h.core.poolRefusal(run)) // as of the sweep that stopped it
			require.Equal(t, "p-1 after 0s: "+why, calls[tc.refuse])
			audited := h.poolStopsAudited()
			require.Equal(t, []string{"p-1: " + why}, audited)

			close(h.fake.gate)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(running).GetState())
			got := h.wait(queued)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, got.GetState())
			require.Equal(t, why, got.GetError().GetMessage(), "queued work is refused once its pool is stopped")

			_, fbErr := h.fb(run, 4, datum(1, 2, 3))
			_, sampleErr := sample()
			for _, err := range []error{fbErr, sampleErr} { // new work on the pool: refused at admission
				require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
				require.Equal(t, errs.ReasonBudgetExceeded, errs.Reason(err))
				require.True(t, errs.IsFinal(err), "the SDK does not retry it: %v", err)
				require.ErrorContains(t, err, "budget_usd_total")
				require.ErrorContains(t, err, "dedicated pool p-1")
			}
		})
	}
}

// TestDedicatedRunRefusedAtItsBudget: a dedicated run whose pool's first minute (0.06 USD)
// does not fit what is left of its workspace's budget (0.05 USD) is not created: its pool is
// released at once and the creation fails with the final budget error; no lease is left
// reserved.
func TestDedicatedRunRefusedAtItsBudget(t *testing.T) {
	sheet := testPrices(t, "gpu_hour: {H100: \"3.6\"}\n")
	pol, err := policy.Parse([]byte("workspaces:\n  ws-a: {budget_usd_total: \"0.05\"}\n"))
	require.NoError(t, err)
	now := time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	h := newHarness(t, t.TempDir(), Options{Prices: sheet, Policy: pol, Now: clock, SweepInterval: 15 * time.Second})
	pools := newClockPools(clock, 0)
	h.core.dedicatedPools = pools
	op, err := h.svc.Training.CreateTrainingRun(h.ctx, &loopsv1.CreateTrainingRunRequest{
		BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}, Dedicated: &loopsv1.DedicatedPool{Replicas: 1},
	})
	require.NoError(t, err)
	done := h.wait(op)
	require.Equal(t, loopsv1.OperationState_OPERATION_STATE_FAILED, done.GetState())
	require.Contains(t, done.GetError().GetMessage(), `workspace "ws-a" has spent 0 USD in all (and has 0 USD of work running) of its budget of 0.05 USD (budget_usd_total in its policy); holding the next 1m0s of training run `+done.GetTrainingRunId()+`'s dedicated pool p-1 (0.06 USD at its full shape; 0.06 USD more than its lease holds) would pass it, so the pool is released and the run is not created`)
	require.Equal(t, []string{"released p-1"}, pools.calls)
	b := h.core.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	require.Zero(t, b.ws[spendID{ws: "ws-a"}].reserved)
	require.Empty(t, b.leases)
}
