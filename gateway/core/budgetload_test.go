package core

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"connectrpc.com/connect"
	"github.com/stretchr/testify/require"

	"github.com/loops-dev/loops/gateway/policy"
	"github.com/loops-dev/loops/gateway/store"
	"github.com/loops-dev/loops/internal/money"
)

// slowCostStore holds its first UsageCost call until release is closed (entered is closed
// when it arrives): a store read that takes as long as the test wants.
type slowCostStore struct {
	store.Store
	once             sync.Once
	entered, release chan struct{}
}

func (s *slowCostStore) UsageCost(ctx context.Context, ws string, from, to time.Time) (int64, error) {
	first := false
	s.once.Do(func() { first = true })
	if first {
		close(s.entered)
		<-s.release
	}
	return s.Store.UsageCost(ctx, ws, from, to)
}

// TestSpendLoadHoldsNoLockAndAdmitsNothingEarly: a workspace's spend is read from the store
// with no lock held (a flush of the usage counters runs meanwhile), work that arrives
// meanwhile waits for the load instead of being checked against the counters not yet
// written alone, and counters the flush moves into the store while it is read are counted
// once. The workspace spent 0.90 USD of its 1 USD before the gateway started and has 0.05
// not yet written: work estimated at 0.10 is refused (1.05 > 1), not admitted against 0.05.
func TestSpendLoadHoldsNoLockAndAdmitsNothingEarly(t *testing.T) {
	sheet := testPrices(t, "models:\n  \"*\": {train: \"1\"}\n")
	pol, err := policy.Parse([]byte("workspaces:\n  ws-a: {budget_usd_total: \"1\"}\n"))
	require.NoError(t, err)
	h := newHarness(t, t.TempDir(), Options{Prices: sheet, Policy: pol, SweepInterval: time.Hour})
	usd := func(s string) money.USD { return testUSD(t, s) }
	now := h.core.now().UTC().Truncate(usageBucket)
	require.NoError(t, h.core.store.AddUsage(h.ctx, "ws-a", store.UsageRecord{BucketStart: now.Add(-24 * time.Hour),
		BaseModel: "fake/model", Kind: store.UsageTraining, Amount: 900000, PricedAmount: 900000, Cost: int64(usd("0.9"))}))
	u := h.core.usage
	u.mu.Lock()
	u.pending[usageKey{ws: "ws-a", model: "fake/model", kind: store.UsageTraining, bucket: now}] = usageAmount{amount: 50000, priced: 50000, cost: usd("0.05")}
	u.mu.Unlock()
	slow := &slowCostStore{Store: h.core.store, entered: make(chan struct{}), release: make(chan struct{})}
	h.core.store = slow

	loaded := make(chan error, 1)
	go func() { loaded <- h.core.budgetReady(h.ctx, "ws-a") }()
	<-slow.entered // the load reads the store

	admitted := make(chan error, 1)
	go func() {
		if err := h.core.budgetReady(h.ctx, "ws-a"); err != nil {
			admitted <- err
			return
		}
		_, err := h.core.reserveBudget(h.ctx, "ws-a", usd("0.1"))
		admitted <- err
	}()
	flushed := make(chan struct{})
	go func() { h.core.flushUsage(h.ctx); close(flushed) }()
	select {
	case <-flushed: // the 0.05 moved into the store while the load read it
	case <-time.After(30 * time.Second):
		t.Fatal("a usage flush waited for a workspace's spend to load")
	}
	select {
	case err := <-admitted:
		t.Fatalf("work was checked before the spend was loaded: %v", err)
	case <-time.After(100 * time.Millisecond):
	}
	close(slow.release)
	require.NoError(t, <-loaded)
	err = <-admitted
	var ce *connect.Error
	require.True(t, errors.As(err, &ce), "%v", err)
	require.Equal(t, connect.CodeResourceExhausted, ce.Code())
	require.Contains(t, err.Error(), "has spent 0.95 USD in all")

	b := h.core.budgets
	b.mu.Lock()
	defer b.mu.Unlock()
	e := b.ws[spendID{ws: "ws-a"}]
	require.True(t, e.loaded)
	require.Equal(t, usd("0.95"), e.totalSpent, "the flushed counters counted once")
	require.Zero(t, e.reserved)
}
