package core

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
	"google.golang.org/protobuf/types/known/timestamppb"
)

// Usage ranges: GetUsage looks back usageDefaultRange when no start is given and refuses
// ranges longer than usageMaxRange.
const (
	usageBucket       = time.Hour
	usageDefaultRange = 30 * 24 * time.Hour
	usageMaxRange     = 366 * 24 * time.Hour
)

// usageKey is one usage counter: a workspace's amount of one kind for a base model,
// session, training run (the kinds metered per run: checkpoint storage, dedicated pool
// time; "" for the others), deployment and API key in one hour bucket.
type usageKey struct {
	ws, model, session, run, deployment, key, kind string
	bucket                                         time.Time
}

// usageMeter accumulates usage in memory; flush adds it to the store. Work that succeeds
// records usage with one map update under mu, never a store write, so metering stays off
// the hot paths. The janitor flushes every sweep (15 s), GetUsage flushes before it reads,
// and Close flushes last: a crash loses at most the usage since the last sweep.
type usageMeter struct {
	mu      sync.Mutex
	pending map[usageKey]usageAmount
	// flushMu serializes flushes, so a flush that returns has written everything recorded
	// before it started (GetUsage reads its own writes).
	flushMu sync.Mutex
	// flushing is set (under mu) while a flush moves counters from pending to the store,
	// and flushes counts the flushes that did (under mu): a reader of the store that saw
	// neither change while it read knows the store and pending were disjoint (loadSpend).
	flushing bool
	flushes  uint64
}

// usageAmount is a pending counter: the amount, the part of it priced, and that part's
// cost under the price sheets in force when each part was recorded.
type usageAmount struct {
	amount, priced int64
	cost           money.USD
}

// add adds b to a; a cost that overflows leaves b's part unpriced.
func (a usageAmount) add(b usageAmount) usageAmount {
	out := usageAmount{amount: a.amount + b.amount, priced: a.priced, cost: a.cost}
	if sum, err := money.Add(a.cost, b.cost); err == nil {
		out.priced, out.cost = a.priced+b.priced, sum
	}
	return out
}

func newUsageMeter() *usageMeter { return &usageMeter{pending: map[usageKey]usageAmount{}} }

// recordUsage adds amount of kind to the workspace's counter for model and session in the
// current hour bucket, priced with the price sheet in force now. Amounts <= 0 are ignored.
func (c *Core) recordUsage(ws, model, session, kind string, amount int64) {
	c.recordOpUsage(nil, ws, model, session, "", kind, amount)
}

// recordOpUsage is recordUsage for the work of operation o (nil: none), kept under the API
// key that created o and added to o's cost, done through a deployment ("<owner>:<name>", "" for none), which the counter is kept
// under.
func (c *Core) recordOpUsage(o *operation, ws, model, session, deployment, kind string, amount int64) {
	c.recordUsageIn(o, reading{bucket: c.now().UTC().Truncate(usageBucket), ws: ws, model: model, session: session,
		deployment: deployment, kind: kind, amount: amount})
}

// reading is one meter reading: amount of kind, for whom, in the hour bucket that starts at
// bucket. run is the training run of the kinds metered per run; gpuKind prices dedicated
// GPU-seconds (the pool's GPU kind, "" unnamed); key is the API key the reading is kept
// under when no operation is (a dedicated pool's time: its run's owner).
type reading struct {
	bucket                                                  time.Time
	ws, model, session, run, deployment, kind, gpuKind, key string
	amount                                                  int64
}

// poolKind reports whether kind meters a dedicated pool's time, which its run's pool lease
// pays for (poollease.go).
func poolKind(kind string) bool {
	return kind == store.UsageDedicatedReplicaSeconds || kind == store.UsageDedicatedGPUSeconds
}

// recordUsageIn records a meter reading for the work of operation o (nil: none): priced
// with the sheet in force now, kept under o's API key (else rd.key), added to o's cost and
// taken off its reservation (budget.go), or, for a run's dedicated pool time, taken off
// the run's pool lease (poollease.go).
func (c *Core) recordUsageIn(o *operation, rd reading) {
	if rd.amount <= 0 {
		return
	}
	u := usageAmount{amount: rd.amount}
	if cost, ok, version := c.priceUsage(rd.ws, rd.model, rd.kind, rd.gpuKind, rd.amount); ok {
		u.priced, u.cost = rd.amount, cost
		if o != nil {
			c.ops.addCost(o, cost, version)
		}
	}
	var (
		key     = rd.key
		settled money.USD
	)
	if o != nil {
		key = o.keyID
		if u.priced > 0 {
			settled = o.settle(u.cost) // its reservation becomes spend (budget.go)
		}
	}
	k := usageKey{ws: rd.ws, model: rd.model, session: rd.session, run: rd.run, deployment: rd.deployment, key: key, kind: rd.kind, bucket: rd.bucket}
	lim := c.policy.Limits(rd.ws)
	c.usage.mu.Lock()
	c.usage.pending[k] = c.usage.pending[k].add(u)
	switch {
	case u.priced == 0:
	case o == nil && rd.run != "" && poolKind(rd.kind):
		c.budgets.spendPool(rd.ws, key, rd.run, lim, u.cost, c.now()) // under mu: see budgetReady
	default:
		c.budgets.spend(rd.ws, key, o != nil && o.budgetKey != "", lim, u.cost, settled, c.now()) // under mu: see budgetReady
	}
	c.usage.mu.Unlock()
}

// flushUsage writes the accumulated usage to the store. Counters that fail to write are
// kept for the next flush.
func (c *Core) flushUsage(ctx context.Context) {
	u := c.usage
	u.flushMu.Lock()
	defer u.flushMu.Unlock()
	u.mu.Lock()
	batch := u.pending
	if len(batch) == 0 {
		u.mu.Unlock()
		return
	}
	u.pending = map[usageKey]usageAmount{}
	u.flushing = true
	u.mu.Unlock()
	defer func() {
		u.mu.Lock()
		u.flushing = false
		u.flushes++
		u.mu.Unlock()
	}()

	var failed int
	for k, a := range batch {
		err := c.store.AddUsage(ctx, k.ws, store.UsageRecord{
			BucketStart: k.bucket, BaseModel: k.model, SessionID: k.session, RunID: k.run, Deployment: k.deployment, KeyID: k.key, Kind: k.kind, Amount: a.amount,
			PricedAmount: a.priced, Cost: int64(a.cost),
		})
		if err != nil {
			failed++
			u.mu.Lock()
			u.pending[k] = u.pending[k].add(a)
			u.mu.Unlock()
		}
	}
	if failed > 0 {
		c.log.Error("writing usage; kept in memory for the next flush", slog.Int("counters", failed))
	}
}

// usageKinds maps the store's usage kinds to loops.v1's.
var usageKinds = map[string]loopsv1.UsageKind{
	store.UsageTraining:                loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS,
	store.UsageSamplingPrefill:         loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS,
	store.UsageSamplingSample:          loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS,
	store.UsageSamplingCachedPrefill:   loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS,
	store.UsageCheckpoint:              loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS,
	store.UsageDedicatedReplicaSeconds: loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS,
	store.UsageDedicatedGPUSeconds:     loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS,
	store.UsageCheckpointByteSeconds:   loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS,
}

// UsageService implements loops.v1.UsageService.
type UsageService struct{ c *Core }

// GetUsage returns the workspace's usage in the hour buckets that overlap [start_time,
// end_time): end defaults to now, start to 30 days before end; the range may not be longer
// than 366 days.
func (s UsageService) GetUsage(ctx context.Context, req *loopsv1.GetUsageRequest) (*loopsv1.GetUsageResponse, error) {
	c := s.c
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	end := c.now()
	if req.GetEndTime() != nil {
		if err := req.GetEndTime().CheckValid(); err != nil {
			return nil, invalidArgument("end_time: %v", err)
		}
		end = req.GetEndTime().AsTime()
	}
	start := end.Add(-usageDefaultRange)
	if req.GetStartTime() != nil {
		if err := req.GetStartTime().CheckValid(); err != nil {
			return nil, invalidArgument("start_time: %v", err)
		}
		start = req.GetStartTime().AsTime()
	}
	if end.Before(start) {
		return nil, invalidArgument("end_time (%s) is before start_time (%s)", end.UTC().Format(time.RFC3339), start.UTC().Format(time.RFC3339))
	}
	if end.Sub(start) > usageMaxRange {
		return nil, invalidArgument("the range from start_time to end_time is longer than 366 days: ask for it in parts")
	}
	c.flushUsage(ctx)
	// A bucket overlaps the range when it starts at or after the hour holding start.
	recs, err := c.store.ListUsage(ctx, ws, start.UTC().Truncate(usageBucket), end)
	if err != nil {
		return nil, internal("reading usage", err)
	}
	out := &loopsv1.GetUsageResponse{Buckets: make([]*loopsv1.UsageBucket, 0, len(recs))}
	for _, r := range recs {
		out.Buckets = append(out.Buckets, &loopsv1.UsageBucket{
			StartTime:     timestamppb.New(r.BucketStart),
			EndTime:       timestamppb.New(r.BucketStart.Add(usageBucket)),
			BaseModel:     r.BaseModel,
			SessionId:     r.SessionID,
			TrainingRunId: r.RunID,
			Kind:          usageKinds[r.Kind],
			Amount:        r.Amount,
			Deployment:    r.Deployment,
			KeyId:         r.KeyID,
		})
		if r.PricedAmount > 0 {
			b := out.Buckets[len(out.Buckets)-1]
			b.PricedAmount, b.CostUsd = r.PricedAmount, money.USD(r.Cost).String()
		}
	}
	return out, nil
}
