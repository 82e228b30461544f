package compat

import (
	"cmp"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"time"

	"google.golang.org/protobuf/types/known/timestamppb"

	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// maxBillingSessions caps the sessions whose user_metadata a usage answer looks up.
const maxBillingSessions = 1000

// billingUsageEvent is one hour bucket of one kind of usage (SDK BillingUsageEvent). The
// SDK's user fields are left out (null). Its cost and rate are exact decimals written as
// JSON numbers, present when the price sheet priced all of the bucket's tokens (absent,
// so None in the SDK, otherwise, and always without a price sheet).
type billingUsageEvent struct {
	BucketStart string  `json:"bucket_start"`
	BucketEnd   string  `json:"bucket_end"`
	BaseModel   *string `json:"base_model"`
	SessionID   *string `json:"session_id"`
	// ProjectID is the session's current project (SDK: "resolved from the current project
	// associated with the session").
	ProjectID        *string      `json:"project_id"`
	EstimatedCostUSD *json.Number `json:"estimated_cost_usd,omitempty"`
	// RatePerMillion is estimated_cost_usd * 1e6 / token_count (SDK
	// effective_rate_usd_per_million_tokens), to the pico-dollar.
	RatePerMillion *json.Number `json:"effective_rate_usd_per_million_tokens,omitempty"`
	EventInfo      any          `json:"event_info"`
}

// billingCost is a bucket's cost and rate per million tokens for Tinker, when the price
// sheet priced all of its amount (nil, nil otherwise). The rate is exact to the
// pico-dollar (rounded half up past it: a bucket priced by two sheets has a mean rate).
func billingCost(b *loopsv1.UsageBucket) (cost, rate *json.Number) {
	if b.GetCostUsd() == "" || b.GetPricedAmount() != b.GetAmount() || b.GetAmount() <= 0 {
		return nil, nil
	}
	c, err := money.ParseUSD(b.GetCostUsd(), money.Digits)
	if err != nil {
		return nil, nil
	}
	cn := json.Number(c.String())
	r, err := money.MulDiv(c, 1_000_000, b.GetAmount())
	if err != nil {
		return &cn, nil
	}
	rn := json.Number(r.String())
	return &cn, &rn
}

// The SDK's BillingEventInfo variants, discriminated by type.
type (
	tokenBillingEvent struct {
		Type       string `json:"type"`
		TokenCount int64  `json:"token_count"`
	}
	prefillBillingEvent struct {
		Type       string `json:"type"`
		Cached     bool   `json:"cached"`
		TokenCount int64  `json:"token_count"`
	}
	checkpointBillingEvent struct {
		Type  string `json:"type"`
		Count int64  `json:"count"`
	}
)

// billingUsageSession is SDK BillingUsageSession.
type billingUsageSession struct {
	UserMetadata map[string]string `json:"user_metadata"`
}

// billingUsageResponse is SDK BillingUsageResponse.
type billingUsageResponse struct {
	Data     []billingUsageEvent            `json:"data"`
	Sessions map[string]billingUsageSession `json:"sessions"`
}

// billingUsageEvents answers GET billing/usage/events?starting_on=&ending_before= from the
// core's usage: hour buckets ordered by start, then by amount, largest first. Either bound
// may be left out (the core's defaults: the 30 days before now).
func (s *server) billingUsageEvents(w http.ResponseWriter, r *http.Request) error {
	req := &loopsv1.GetUsageRequest{}
	var err error
	if req.StartTime, err = queryTime(r, "starting_on"); err != nil {
		return err
	}
	if req.EndTime, err = queryTime(r, "ending_before"); err != nil {
		return err
	}
	res, err := s.svc.Usage.GetUsage(r.Context(), req)
	if err != nil {
		return err
	}
	buckets := slices.Clone(res.GetBuckets())
	slices.SortStableFunc(buckets, func(a, b *loopsv1.UsageBucket) int {
		if c := a.GetStartTime().AsTime().Compare(b.GetStartTime().AsTime()); c != 0 {
			return c
		}
		return -cmpInt64(a.GetAmount(), b.GetAmount())
	})
	out := billingUsageResponse{Data: []billingUsageEvent{}, Sessions: map[string]billingUsageSession{}}
	projects := map[string]string{} // session -> its project, of the sessions looked up
	for _, b := range buckets {
		var info any
		switch b.GetKind() {
		case loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS:
			info = tokenBillingEvent{Type: "training", TokenCount: b.GetAmount()}
		case loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS:
			info = prefillBillingEvent{Type: "sampling_prefill", TokenCount: b.GetAmount()}
		case loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS:
			info = prefillBillingEvent{Type: "sampling_prefill", Cached: true, TokenCount: b.GetAmount()}
		case loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:
			info = tokenBillingEvent{Type: "sampling_sample", TokenCount: b.GetAmount()}
		case loopsv1.UsageKind_USAGE_KIND_CHECKPOINTS:
			info = checkpointBillingEvent{Type: "checkpoint", Count: b.GetAmount()}
		default:
			continue // a kind this SDK has no event for
		}
		ev := billingUsageEvent{
			BucketStart: b.GetStartTime().AsTime().UTC().Format(time.RFC3339),
			BucketEnd:   b.GetEndTime().AsTime().UTC().Format(time.RFC3339),
			EventInfo:   info,
		}
		if _, checkpoint := info.(checkpointBillingEvent); !checkpoint {
			ev.EstimatedCostUSD, ev.RatePerMillion = billingCost(b)
		}
		if m := b.GetBaseModel(); m != "" {
			ev.BaseModel = &m
		}
		if id := b.GetSessionId(); id != "" {
			ev.SessionID = &id
			if _, ok := out.Sessions[id]; !ok && len(out.Sessions) < maxBillingSessions {
				sess, err := s.svc.Sessions.GetSession(r.Context(), &loopsv1.GetSessionRequest{Id: id})
				if err == nil {
					out.Sessions[id] = billingUsageSession{UserMetadata: sess.GetUserMetadata()}
					projects[id] = cmp.Or(sess.GetProjectId(), "default")
				}
			}
			if p, ok := projects[id]; ok {
				ev.ProjectID = &p
			}
		}
		out.Data = append(out.Data, ev)
	}
	s.edge.WriteJSON(w, http.StatusOK, out)
	return nil
}

func cmpInt64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// queryTime parses an ISO 8601 date-time query parameter (RFC 3339; without an offset it
// is UTC; a '+' decoded to a space is taken back). Absent means nil.
func queryTime(r *http.Request, name string) (*timestamppb.Timestamp, error) {
	v := strings.TrimSpace(r.URL.Query().Get(name))
	if v == "" {
		return nil, nil
	}
	v = strings.ReplaceAll(v, " ", "+")
	for _, layout := range []string{time.RFC3339Nano, "2006-01-02T15:04:05.999999999", "2006-01-02"} {
		if t, err := time.Parse(layout, v); err == nil {
			return timestamppb.New(t), nil
		}
	}
	return nil, badRequest("query parameter %s=%q must be an ISO 8601 date-time such as 2025-03-01T00:00:00Z", name, v)
}
