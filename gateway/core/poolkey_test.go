package core

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/google/go-cmp/cmp"
	"github.com/stretchr/testify/require"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/testing/protocmp"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/errs"
	"github.com/loops-dev/loops/internal/money"
)

// TestDedicatedPoolHeldToItsKeyBudget: two API keys of one workspace that has no budget of
// its own each create a dedicated run (1 H100 at gpu_hour 3.6: 0.001 USD a GPU-second),
// swept every 15 s on a fake clock. Key A has a total budget of 0.3 USD; key B has none.
//
// Run A's pool time is metered under key A and its lease holds the next minute (0.06 USD)
// against key A's budget. Sweep k meters 15 s (0.015 USD) off the lease and tops it up
// while 0.015k + 0.045 + 0.015 ≤ 0.3, that is up to k = 16 (240 s); sweep 17 (255 s, spent
// 0.255, lease 0.045) stops the pool with the budget error naming the key's budget:
//   - a pool that stops at once has spent 0.255 USD;
//   - one whose backend cannot stop it for 3 sweeps stops at 300 s, the end of its last
//     lease (240 + 60 s): spent 0.3 USD, exactly the budget, never past it.
//
// Run B's pool is held to nothing and runs on; its time is metered under key B. With a
// workspace budget of 10 USD as well, both pools' leases are also held against the
// workspace's, and key A's budget stops run A's pool the same way.
func TestDedicatedPoolHeldToItsKeyBudget(t *testing.T) {
	sheet := testPrices(t, "gpu_hour: {H100: \"3.6\"}\n")
	usd := func(s string) money.USD { return testUSD(t, s) }
	for _, tc := range []struct {
		refuse    int
		wsBudget  bool
		spent     string
		stoppedAt time.Duration
	}{
		{refuse: 0, spent: "0.255", stoppedAt: 255 * time.Second},
		{refuse: 3, spent: "0.3", stoppedAt: 300 * time.Second},
		{refuse: 0, wsBudget: true, spent: "0.255", stoppedAt: 255 * time.Second},
	} {
		t.Run(fmt.Sprintf("refused %d times, workspace budget %v", tc.refuse, tc.wsBudget), func(t *testing.T) {
			var pol *policy.Policy
			if tc.wsBudget {
				var err error
				pol, err = policy.Parse([]byte("workspaces:\n  ws-a: {budget_usd_total: \"10\"}\n"))
				require.NoError(t, err)
			}
			var (
				mu  sync.Mutex
				now = time.Date(2026, 12, 6, 10, 0, 0, 0, time.UTC)
			)
			t0 := now
			clock := func() time.Time { mu.Lock(); defer mu.Unlock(); return now }
			h := newHarness(t, t.TempDir(), Options{Prices: sheet, Policy: pol, Now: clock, SweepInterval: 15 * time.Second})
			pools := newClockPools(clock, tc.refuse)
			h.core.dedicatedPools = pools

			keyA := &loopsv1.ApiKey{Id: "key-aaaaaaaaaaaaaaaa", Workspace: "ws-a", Role: loopsv1.KeyRole_KEY_ROLE_MEMBER, BudgetUsdTotal: "0.3"}
			keyB := &loopsv1.ApiKey{Id: "key-bbbbbbbbbbbbbbbb", Workspace: "ws-a", Role: loopsv1.KeyRole_KEY_ROLE_MEMBER}
			for i, k := range []*loopsv1.ApiKey{keyA, keyB} {
				require.NoError(t, h.core.store.CreateAPIKey(h.ctx, k, [32]byte{byte(i + 1)}))
			}
			as := func(k *loopsv1.ApiKey) context.Context { // a request that came with stored key k
				ctx := auth.WithIdentity(h.ctx, auth.Identity{Workspace: "ws-a", KeyID: k.GetId(), Role: k.GetRole(), Source: auth.SourceRecord, Record: k})
				return auth.WithCaller(ctx, auth.Caller{KeyID: k.GetId()})
			}
			create := func(k *loopsv1.ApiKey) string {
				op, err := h.svc.Training.CreateTrainingRun(as(k), &loopsv1.CreateTrainingRunRequest{
					BaseModel: "fake/model", Lora: &loopsv1.LoraConfig{Rank: 4, TrainAttn: true}, Dedicated: &loopsv1.DedicatedPool{Replicas: 1},
				})
				require.NoError(t, err)
				done := h.wait(op)
				require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, done.GetState(), done.GetError().GetMessage())
				require.Equal(t, k.GetId(), done.GetTrainingRun().GetOwner(), "the run records the key that created it")
				return done.GetTrainingRunId()
			}
			runA, runB := create(keyA), create(keyB)
			fb := func(k *loopsv1.ApiKey, run string, seq int64) (*loopsv1.Operation, error) {
				return h.svc.Training.ForwardBackward(as(k), &loopsv1.ForwardBackwardRequest{TrainingRunId: run, SeqId: seq, Data: []*loopsv1.Datum{datum(1, 2, 3)}, LossFn: "cross_entropy"})
			}
			keyBook := func(k *loopsv1.ApiKey) (spent, reserved money.USD) {
				b := h.core.budgets
				b.mu.Lock()
				defer b.mu.Unlock()
				e := b.ws[spendID{"ws-a", k.GetId()}]
				return e.totalSpent, e.reserved
			}
			_, reserved := keyBook(keyA)
			require.Equal(t, usd("0.06"), reserved, "a minute of run A's pool ahead, held against key A")
			wsBook := func() (spent, reserved money.USD, leaseB bool) {
				b := h.core.budgets
				b.mu.Lock()
				defer b.mu.Unlock()
				if e := b.ws[spendID{ws: "ws-a"}]; e != nil {
					spent, reserved = e.totalSpent, e.reserved
				}
				return spent, reserved, b.leases[runB] != nil
			}
			_, wsReserved, leaseB := wsBook()
			if tc.wsBudget {
				require.Equal(t, usd("0.12"), wsReserved, "a minute of each pool ahead, held against the workspace")
				require.True(t, leaseB)
			} else {
				require.Zero(t, wsReserved, "the workspace has no budget: nothing is held against it")
				require.False(t, leaseB, "key B has no budget: its run's pool holds no lease")
			}

			sweep := func() { // the janitor's round of pools
				mu.Lock()
				now = now.Add(15 * time.Second)
				mu.Unlock()
				h.core.sweepPools(h.ctx)
			}
			for range 12 {
				sweep()
			}
			status, err := h.core.KeyBudgets(h.ctx, keyA)
			require.NoError(t, err)
			require.Empty(t, cmpBudget(&loopsv1.WorkspaceBudget{Name: budgetTotal, LimitUsd: "0.3", SpentUsd: "0.18", ReservedUsd: "0.06", Alerts: []int32{50}, KeyId: keyA.GetId()}, status),
				"the pool's time (180 s) counts toward the key's budget and its alerts")
			for range 4 {
				sweep()
			}
			spent, reserved := keyBook(keyA)
			require.Equal(t, usd("0.24"), spent)
			require.Equal(t, usd("0.06"), reserved, "topped up to a whole minute again")
			require.Empty(t, pools.calls)

			for now.Sub(t0) < tc.stoppedAt {
				sweep()
			}
			spent, reserved = keyBook(keyA)
			require.Equal(t, usd(tc.spent), spent)
			require.Zero(t, reserved, "the lease given back once the pool is at zero")
			require.LessOrEqual(t, spent, usd("0.3"), "never past the key's budget")

			first := "API key key-aaaaaaaaaaaaaaaa has spent 0.255 USD in all (and has 0.045 USD of work running) of its budget of 0.3 USD (budget_usd_total of the key); holding the next 1m0s of training run " + runA +
				"'s dedicated pool p-1 (0.06 USD at its full shape; 0.015 USD more than its lease holds) would pass it, so the pool is stopped (scaled to zero) and the run's work is refused until the budget is raised: ask a workspace admin to raise it (loops keys update key-aaaaaaaaaaaaaaaa --budget-usd-total USD)"
			calls := pools.calls
			require.Len(t, calls, tc.refuse+1, "asked each sweep until stopped, run A's pool only")
			require.Equal(t, "p-1 after 0s: "+first, calls[0], "the first stop (at 255 s) names the key's budget")
			why := connectMessage(h.core.poolRefusal(runA)) // as of the sweep that stopped it
			require.Equal(t, "p-1 after 0s: "+why, calls[tc.refuse])
			audited := h.poolStopsAudited()
			require.Equal(t, []string{"p-1: " + why}, audited)

			// Key A's new work on its run is refused at admission with the final error
			// naming the key's budget; key B's run trains on.
			_, err = fb(keyA, runA, 1)
			require.Equal(t, connect.CodeResourceExhausted, connect.CodeOf(err))
			require.Equal(t, errs.ReasonBudgetExceeded, errs.Reason(err))
			require.True(t, errs.IsFinal(err), "the SDK does not retry it: %v", err)
			require.Equal(t, "API key key-aaaaaaaaaaaaaaaa has spent "+tc.spent+" USD in all (and has 0 USD of work running) of its budget of 0.3 USD (budget_usd_total of the key); holding the next 1m0s of training run "+runA+
				"'s dedicated pool p-1 (0.06 USD at its full shape; 0.06 USD more than its lease holds) would pass it: ask a workspace admin to raise it (loops keys update key-aaaaaaaaaaaaaaaa --budget-usd-total USD)",
				connectMessage(err))
			op, err := fb(keyB, runB, 1)
			require.NoError(t, err)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
			// Key B's work on key A's run is held to key A's budget too: the pool is A's.
			_, err = fb(keyB, runA, 1)
			require.ErrorContains(t, err, "API key key-aaaaaaaaaaaaaaaa has spent")

			status, err = h.core.KeyBudgets(h.ctx, keyA)
			require.NoError(t, err)
			require.Empty(t, cmpBudget(&loopsv1.WorkspaceBudget{Name: budgetTotal, LimitUsd: "0.3", SpentUsd: tc.spent, ReservedUsd: "0", Alerts: []int32{50, 80, 100}, KeyId: keyA.GetId()}, status))

			// The usage rows of each pool carry its run's key (loops usage --by-key), and
			// each key's spend (KeyUsageCost) is its pool's time: B's ran all along.
			h.core.flushUsage(h.ctx)
			rows, err := h.core.store.ListUsage(h.ctx, "ws-a", t0, now.Add(time.Hour))
			require.NoError(t, err)
			keyOf := map[string]string{}
			for _, r := range rows {
				if poolKind(r.Kind) {
					require.Empty(t, keyOf[r.RunID+r.Kind], "one row per run and kind in the hour")
					keyOf[r.RunID+r.Kind] = r.KeyID
				}
			}
			require.Equal(t, map[string]string{
				runA + store.UsageDedicatedReplicaSeconds: keyA.GetId(), runA + store.UsageDedicatedGPUSeconds: keyA.GetId(),
				runB + store.UsageDedicatedReplicaSeconds: keyB.GetId(), runB + store.UsageDedicatedGPUSeconds: keyB.GetId(),
			}, keyOf)
			for k, want := range map[string]string{keyA.GetId(): tc.spent, keyB.GetId(): money.USD(int64(now.Sub(t0)/time.Second) * 1_000_000_000).String()} {
				cost, err := h.core.store.KeyUsageCost(h.ctx, "ws-a", k, t0, now.Add(time.Hour))
				require.NoError(t, err)
				require.Equal(t, want, money.USD(cost).String(), k)
			}

			wsSpent, wsReserved, _ := wsBook()
			if tc.wsBudget { // A's pool's time and B's, which still holds its minute ahead
				require.Equal(t, usd(tc.spent)+money.USD(int64(now.Sub(t0)/time.Second)*1_000_000_000), wsSpent)
				require.Equal(t, usd("0.06"), wsReserved)
			}

			// Raised, key A's budget admits the run's work again: its lease is topped up.
			raised := proto.CloneOf(keyA)
			raised.BudgetUsdTotal = "1"
			op, err = fb(raised, runA, 1)
			require.NoError(t, err)
			require.Equal(t, loopsv1.OperationState_OPERATION_STATE_SUCCEEDED, h.wait(op).GetState())
			require.NoError(t, h.core.poolRefusal(runA))
			_, reserved = keyBook(keyA)
			require.Equal(t, usd("0.06"), reserved)
		})
	}
}

// cmpBudget is the difference between want and the only budget in got ("" when equal).
func cmpBudget(want *loopsv1.WorkspaceBudget, got []*loopsv1.WorkspaceBudget) string {
	if len(got) != 1 {
		return fmt.Sprintf("want 1 budget, got %d", len(got))
	}
	return cmp.Diff(want, got[0], protocmp.Transform())
}
