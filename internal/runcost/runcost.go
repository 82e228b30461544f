package runcost

import (
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// Costs are a run's costs in a range of usage rows.
type Costs struct {
	// Storage is the run's checkpoint storage (its rows of USAGE_KIND_CHECKPOINT_BYTE_SECONDS).
	Storage money.Tally
	// SessionStorage is its session's storage rows of no run: metered before storage was
	// metered per run, they count every run of the session.
	SessionStorage money.Tally
	// Pool is its dedicated pool's time (GPU-seconds and replica-seconds).
	Pool money.Tally
}

// Of sums the rows of buckets that are run's (of session sessionID; "" for a run of no
// session, which then has no session rows).
func Of(buckets []*loopsv1.UsageBucket, run, sessionID string) Costs {
	var c Costs
	for _, b := range buckets {
		var t *money.Tally
		switch k := b.GetKind(); {
		case k == loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS && b.GetTrainingRunId() == run:
			t = &c.Storage
		case k == loopsv1.UsageKind_USAGE_KIND_CHECKPOINT_BYTE_SECONDS && b.GetTrainingRunId() == "" && sessionID != "" && b.GetSessionId() == sessionID:
			t = &c.SessionStorage
		case (k == loopsv1.UsageKind_USAGE_KIND_DEDICATED_GPU_SECONDS || k == loopsv1.UsageKind_USAGE_KIND_DEDICATED_REPLICA_SECONDS) &&
			b.GetTrainingRunId() == run:
			t = &c.Pool
		default:
			continue
		}
		t.Add(b.GetAmount(), b.GetCostUsd(), b.GetPricedAmount())
	}
	return c
}
