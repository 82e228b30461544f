package core

import (
	"context"
	"fmt"
	"math/bits"
	"slices"

	"github.com/loops-dev/loops/gateway/auth"
	"github.com/loops-dev/loops/gateway/store"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/money"
)

// Bounds on an EstimateCost request, checked before any work.
const (
	estimateMaxList      = 100_000
	estimateMaxItem      = 1 << 20
	estimateMaxSteps     = 1_000_000
	estimateMaxBatch     = 100_000
	estimateMaxGroup     = 1024
	estimateMaxPasses    = 16
	estimateMaxEvalCalls = 10_000_000
	estimateMaxLines     = 16
	estimateMaxAmount    = 1 << 53
)

// estimateTokenKinds are the usage kinds an EstimateCostRequest.usage line may name.
var estimateTokenKinds = map[loopsv1.UsageKind]string{
	loopsv1.UsageKind_USAGE_KIND_TRAINING_TOKENS:                store.UsageTraining,
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_PREFILL_TOKENS:        store.UsageSamplingPrefill,
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_CACHED_PREFILL_TOKENS: store.UsageSamplingCachedPrefill,
	loopsv1.UsageKind_USAGE_KIND_SAMPLING_SAMPLE_TOKENS:         store.UsageSamplingSample,
}

// errEstimateTooLarge is the error of a run whose token counts do not fit an int64.
const errEstimateTooLarge = "the run is too large to estimate (its token count passes 2^63): estimate it in parts"

// EstimateCost prices a planned run with the workspace's price sheet: the tokens it would
// meter by usage kind, from its token counts and settings, and their cost.
func (s UsageService) EstimateCost(ctx context.Context, req *loopsv1.EstimateCostRequest) (*loopsv1.EstimateCostResponse, error) {
	ws, err := auth.RequireWorkspace(ctx)
	if err != nil {
		return nil, err
	}
	amounts, err := estimateAmounts(req)
	if err != nil {
		return nil, err
	}
	sheet := s.c.opts.Prices.Current()
	if sheet == nil {
		return nil, failedPrecondition("no prices are configured on this server (loops serve --prices FILE): there is nothing to estimate a cost with")
	}
	out := &loopsv1.EstimateCostResponse{PriceVersion: sheet.Version()}
	var total, low, high money.USD
	banded := len(req.GetUsage()) > 0
	for _, a := range amounts {
		line := &loopsv1.UsageEstimate{Kind: usageKinds[a.kind], Amount: a.n}
		// price adds what n tokens of a's kind cost to *sum; "" when the kind is unpriced.
		price := func(n int64, sum *money.USD) (string, error) {
			cost, ok, err := sheet.Cost(ws, req.GetBaseModel(), a.kind, "", n)
			if err != nil || !ok {
				return "", err
			}
			if *sum, err = money.Add(*sum, cost); err != nil {
				return "", err
			}
			return cost.String(), nil
		}
		if line.CostUsd, err = price(a.n, &total); err != nil {
			return nil, invalidArgument("%s: %v", errEstimateTooLarge, err)
		}
		if banded {
			line.AmountLow, line.AmountHigh = a.low, a.high
			if line.CostLowUsd, err = price(a.low, &low); err == nil {
				line.CostHighUsd, err = price(a.high, &high)
			}
			if err != nil {
				return nil, invalidArgument("%s: %v", errEstimateTooLarge, err)
			}
		}
		out.Usage = append(out.Usage, line)
	}
	out.TotalUsd = total.String()
	if banded {
		out.TotalLowUsd, out.TotalHighUsd = low.String(), high.String()
	}
	return out, nil
}

// kindAmount is the tokens of one usage kind of an estimate, and its band (low, high) when
// the caller gave one.
type kindAmount struct {
	kind      string
	n         int64
	low, high int64
}

// givenAmounts checks the lines of an EstimateCostRequest.usage (the tokens by kind a
// caller worked out, with their bands) and returns them in UsageKind order.
func givenAmounts(req *loopsv1.EstimateCostRequest) ([]kindAmount, error) {
	if req.GetSteps() != 0 || req.GetBatchSize() != 0 || len(req.GetExampleTokens()) > 0 || len(req.GetPromptTokens()) > 0 ||
		req.GetPasses() != 0 || req.GetGroupSize() != 0 || req.GetCompletionTokens() != 0 || req.GetEvalRequests() != 0 || req.GetEvalPromptTokens() != 0 {
		return nil, invalidArgument("usage gives the run's tokens by kind: set it with base_model only, not with steps, batch_size or token counts")
	}
	if len(req.GetUsage()) > estimateMaxLines {
		return nil, invalidArgument("usage has %d lines; at most %d (one per token kind)", len(req.GetUsage()), estimateMaxLines)
	}
	seen := map[loopsv1.UsageKind]bool{}
	var out []kindAmount
	for i, u := range req.GetUsage() {
		kind, ok := estimateTokenKinds[u.GetKind()]
		if !ok {
			return nil, invalidArgument("usage[%d].kind is %s; want a token kind: training, sampling prefill, cached prefill or sampled tokens", i, u.GetKind())
		}
		if seen[u.GetKind()] {
			return nil, invalidArgument("usage[%d]: %s appears twice; give each kind once", i, u.GetKind())
		}
		seen[u.GetKind()] = true
		low, high := u.GetAmountLow(), u.GetAmountHigh()
		if low == 0 && high == 0 {
			low, high = u.GetAmount(), u.GetAmount()
		}
		for _, f := range []struct {
			name string
			v    int64
		}{{"amount", u.GetAmount()}, {"amount_low", low}, {"amount_high", high}} {
			if err := inRange(fmt.Sprintf("usage[%d].%s", i, f.name), f.v, 0, estimateMaxAmount); err != nil {
				return nil, err
			}
		}
		if low > u.GetAmount() || u.GetAmount() > high {
			return nil, invalidArgument("usage[%d]: want amount_low <= amount <= amount_high, got %d, %d, %d", i, low, u.GetAmount(), high)
		}
		if u.GetCostUsd() != "" || u.GetCostLowUsd() != "" || u.GetCostHighUsd() != "" {
			return nil, invalidArgument("usage[%d]: leave the costs empty: the server prices the amounts", i)
		}
		out = append(out, kindAmount{kind, u.GetAmount(), low, high})
	}
	slices.SortFunc(out, func(a, b kindAmount) int { return int(usageKinds[a.kind]) - int(usageKinds[b.kind]) })
	return out, nil
}

// estimateAmounts checks req's bounds and computes the tokens of each usage kind the run
// would meter, in UsageKind order (kinds with no tokens left out). It uses the rules the
// meter does: a forward or forward_backward meters its items' model input lengths; a
// sample request meters its prompt once and every generated token of its samples.
func estimateAmounts(req *loopsv1.EstimateCostRequest) ([]kindAmount, error) {
	if req.GetBaseModel() == "" {
		return nil, invalidArgument("base_model is required: the base model the run trains, as the price sheet names it")
	}
	if len(req.GetBaseModel()) > 512 {
		return nil, invalidArgument("base_model is longer than 512 bytes")
	}
	if len(req.GetUsage()) > 0 {
		return givenAmounts(req)
	}
	if err := inRange("steps", req.GetSteps(), 1, estimateMaxSteps); err != nil {
		return nil, err
	}
	if err := inRange("batch_size", req.GetBatchSize(), 1, estimateMaxBatch); err != nil {
		return nil, err
	}
	ex, pr := req.GetExampleTokens(), req.GetPromptTokens()
	switch {
	case len(ex) == 0 && len(pr) == 0:
		return nil, invalidArgument("set example_tokens (supervised examples' token counts) or prompt_tokens (RL prompts' token counts)")
	case len(ex) > 0 && len(pr) > 0:
		return nil, invalidArgument("set example_tokens or prompt_tokens, not both: estimate a run that does both in two calls")
	}
	for name, list := range map[string][]int64{"example_tokens": ex, "prompt_tokens": pr} {
		if len(list) > estimateMaxList {
			return nil, invalidArgument("%s has %d entries; at most %d: give a sample of the data that represents it", name, len(list), estimateMaxList)
		}
		for i, n := range list {
			if n < 0 || n > estimateMaxItem {
				return nil, invalidArgument("%s[%d] is %d; each count must be from 0 to %d", name, i, n, estimateMaxItem)
			}
		}
	}
	passes, group := max(req.GetPasses(), 1), max(req.GetGroupSize(), 1)
	for _, f := range []struct {
		name   string
		v, max int64
	}{
		{"passes", req.GetPasses(), estimateMaxPasses},
		{"group_size", req.GetGroupSize(), estimateMaxGroup},
		{"completion_tokens", req.GetCompletionTokens(), estimateMaxItem},
		{"eval_requests", req.GetEvalRequests(), estimateMaxEvalCalls},
		{"eval_prompt_tokens", req.GetEvalPromptTokens(), estimateMaxItem},
	} {
		if err := inRange(f.name, f.v, 0, f.max); err != nil {
			return nil, err
		}
	}
	if len(ex) > 0 && (req.GetGroupSize() != 0 || req.GetCompletionTokens() != 0) {
		return nil, invalidArgument("group_size and completion_tokens describe RL sampling: set them with prompt_tokens, not example_tokens")
	}

	m := checked{}
	items := m.mul(req.GetSteps(), req.GetBatchSize())
	var training, prefill, sampled int64
	if len(ex) > 0 {
		training = m.mul(cycledSum(ex, items, &m), passes)
	} else {
		prompts := cycledSum(pr, items, &m)
		samples := m.mul(items, group)
		prefill = prompts
		sampled = m.mul(samples, req.GetCompletionTokens())
		// Each sample is a next-token datum of prompt + completion tokens, whose model
		// input is one token shorter.
		perSample := m.add(m.mul(prompts, group), sampled)
		training = m.mul(max(perSample-samples, 0), passes)
	}
	if e := req.GetEvalRequests(); e > 0 {
		prefill = m.add(prefill, m.mul(e, req.GetEvalPromptTokens()))
		sampled = m.add(sampled, m.mul(m.mul(e, group), req.GetCompletionTokens()))
	}
	if m.overflow {
		return nil, invalidArgument(errEstimateTooLarge)
	}
	var out []kindAmount
	for _, a := range []kindAmount{
		{kind: store.UsageTraining, n: training},
		{kind: store.UsageSamplingPrefill, n: prefill},
		{kind: store.UsageSamplingSample, n: sampled},
	} {
		if a.n > 0 {
			out = append(out, a)
		}
	}
	return out, nil
}

// inRange is a clear InvalidArgument when v is outside [lo, hi].
func inRange(name string, v, lo, hi int64) error {
	if v < lo || v > hi {
		return invalidArgument("%s is %d; it must be from %d to %d", name, v, lo, hi)
	}
	return nil
}

// cycledSum is the sum of the first n entries of list repeated end to end.
func cycledSum(list []int64, n int64, m *checked) int64 {
	var all int64
	for _, v := range list {
		all = m.add(all, v)
	}
	k := int64(len(list))
	var rest int64
	for _, v := range list[:n%k] {
		rest = m.add(rest, v)
	}
	return m.add(m.mul(n/k, all), rest)
}

// checked is int64 arithmetic on non-negative values that remembers an overflow.
type checked struct{ overflow bool }

func (c *checked) mul(a, b int64) int64 {
	hi, lo := bits.Mul64(uint64(a), uint64(b))
	if hi != 0 || lo > 1<<63-1 {
		c.overflow = true
		return 0
	}
	return int64(lo)
}

func (c *checked) add(a, b int64) int64 {
	s, carry := bits.Add64(uint64(a), uint64(b), 0)
	if carry != 0 || s > 1<<63-1 {
		c.overflow = true
		return 0
	}
	return int64(s)
}
