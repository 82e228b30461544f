package reference

import (
	"context"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"sort"

	"connectrpc.com/connect"

	"github.com/loops-dev/loops/backends/reference/nn"
	backendv1 "github.com/loops-dev/loops/gen/go/loops/backend/v1"
	loopsv1 "github.com/loops-dev/loops/gen/go/loops/v1"
	"github.com/loops-dev/loops/internal/semantics"
	"github.com/loops-dev/loops/internal/shape"
)

// datumLoss holds one datum's parsed loss inputs.
type datumLoss struct {
	n, k    int
	targets []int
	weights []float64 // cross_entropy, n*k
	q, adv  []float64 // RL losses, n
	mask    []float64 // gspo's sequence_ratio_mask, n
	// seqRatio is gspo's sequence ratio s = exp(mean over the marked positions of lp − q),
	// from a forward pass before the training one (a constant there: stop-gradient).
	seqRatio float64
}

// tokenLoss is the per-token loss of a loss function: it returns the loss and d loss/d lp.
type tokenLoss func(d *datumLoss, pos, k int, lp float64) (float64, float64)

func clip(x, lo, hi float64) float64 { return math.Min(math.Max(x, lo), hi) }

// LossFn returns the per-token loss and its derivative with respect to the learner
// log-prob for a loss name and config (already validated).
func lossFn(name string, cfg map[string]float64) tokenLoss {
	c, _ := semantics.LossConfig(name)
	maps.Copy(c, cfg)
	lo, hi, beta := c["clip_low_threshold"], c["clip_high_threshold"], c["beta"]
	switch name {
	case "cross_entropy":
		return func(d *datumLoss, pos, k int, lp float64) (float64, float64) {
			w := d.weights[pos*d.k+k]
			return -w * lp, -w
		}
	case "importance_sampling":
		return func(d *datumLoss, pos, _ int, lp float64) (float64, float64) {
			r := math.Exp(lp - d.q[pos])
			a := d.adv[pos]
			return -r * a, -r * a
		}
	case "ppo":
		return func(d *datumLoss, pos, _ int, lp float64) (float64, float64) {
			r := math.Exp(lp - d.q[pos])
			a := d.adv[pos]
			un, cl := r*a, clip(r, lo, hi)*a
			if un <= cl {
				return -un, -r * a
			}
			// the clipped branch is the minimum only where r is outside [lo, hi]: no gradient
			return -cl, 0
		}
	case "cispo":
		return func(d *datumLoss, pos, _ int, lp float64) (float64, float64) {
			c := clip(math.Exp(lp-d.q[pos]), lo, hi)
			a := d.adv[pos]
			return -c * a * lp, -c * a
		}
	case "dro":
		return func(d *datumLoss, pos, _ int, lp float64) (float64, float64) {
			a, q := d.adv[pos], d.q[pos]
			return -(lp*a - 0.5*beta*(lp-q)*(lp-q)), -(a - beta*(lp-q))
		}
	case "gspo":
		// s_t = sg(s)·exp(lp − sg(lp)): its value is s, its derivative in lp is s
		return func(d *datumLoss, pos, _ int, _ float64) (float64, float64) {
			s, a := d.seqRatio, d.adv[pos]
			un, cl := s*a, clip(s, lo, hi)*a
			if un <= cl {
				return -un, -s * a
			}
			return -cl, 0
		}
	}
	return nil
}

// tensorValues returns a tensor's values as float64 and its shape (empty shape = 1-D).
func tensorValues(t *loopsv1.Tensor) ([]float64, []int64, error) {
	var vals []float64
	switch t.Dtype {
	case loopsv1.Dtype_DTYPE_INT64:
		vals = make([]float64, len(t.Int64Data))
		for i, v := range t.Int64Data {
			vals[i] = float64(v)
		}
	case loopsv1.Dtype_DTYPE_FLOAT32:
		vals = make([]float64, len(t.Float32Data))
		for i, v := range t.Float32Data {
			vals[i] = float64(v)
		}
	default:
		if len(t.Int64Data) > 0 && len(t.Float32Data) == 0 {
			return tensorValues(&loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_INT64, Shape: t.Shape, Int64Data: t.Int64Data})
		}
		return tensorValues(&loopsv1.Tensor{Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: t.Shape, Float32Data: t.Float32Data})
	}
	dims := t.Shape
	if len(dims) == 0 {
		dims = []int64{int64(len(vals))}
	}
	if err := shape.Matches(dims, len(vals)); err != nil {
		return nil, nil, err
	}
	return vals, dims, nil
}

// parseDatum validates one datum for a loss and returns its tokens and parsed inputs.
func parseDatum(i int, d *loopsv1.Datum, loss string, bm *baseModel) ([]int, *datumLoss, error) {
	if d == nil || len(d.Tokens) == 0 {
		return nil, nil, fmt.Errorf("datum %d has no tokens; every datum needs a non-empty model_input", i)
	}
	n := len(d.Tokens)
	V := bm.m.Cfg.Vocab
	if n > bm.m.Cfg.MaxSeq() {
		return nil, nil, fmt.Errorf("datum %d has %d tokens, over the model's limit of %d; shorten or split it", i, n, bm.m.Cfg.MaxSeq())
	}
	toks := make([]int, n)
	for j, t := range d.Tokens {
		if t < 0 || int(t) >= V {
			return nil, nil, fmt.Errorf("datum %d: token %d at position %d is outside the vocabulary [0, %d)", i, t, j, V)
		}
		toks[j] = int(t)
	}
	get := func(key string) ([]float64, []int64, error) {
		t, ok := d.LossFnInputs[key]
		if !ok || t == nil {
			return nil, nil, fmt.Errorf("datum %d: loss %q needs loss_fn_inputs[%q]", i, loss, key)
		}
		v, s, err := tensorValues(t)
		if err != nil {
			return nil, nil, fmt.Errorf("datum %d: loss_fn_inputs[%q]: %v", i, key, err)
		}
		if s[0] != int64(n) || len(s) > 2 {
			return nil, nil, fmt.Errorf("datum %d: loss_fn_inputs[%q] has shape %v but the input has %d tokens; per-token inputs must have length N (or shape (N, K) for cross_entropy targets and weights)", i, key, s, n)
		}
		return v, s, nil
	}
	tv, ts, err := get("target_tokens")
	if err != nil {
		return nil, nil, err
	}
	dl := &datumLoss{n: n, k: 1}
	if len(ts) == 2 {
		if loss != "cross_entropy" {
			return nil, nil, fmt.Errorf("datum %d: 2-D target_tokens are only supported by cross_entropy", i)
		}
		dl.k = int(ts[1])
		if dl.k < 1 {
			return nil, nil, fmt.Errorf("datum %d: target_tokens has shape %v; K must be at least 1", i, ts)
		}
	}
	dl.targets = make([]int, len(tv))
	for j, v := range tv {
		if v != math.Trunc(v) || v < 0 || v >= float64(V) {
			return nil, nil, fmt.Errorf("datum %d: target token %v at index %d is outside the vocabulary [0, %d)", i, v, j, V)
		}
		dl.targets[j] = int(v)
	}
	finite := func(key string, v []float64) error {
		for j, x := range v {
			if math.IsNaN(x) || math.IsInf(x, 0) {
				return fmt.Errorf("datum %d: loss_fn_inputs[%q][%d] is %v; values must be finite", i, key, j, x)
			}
		}
		return nil
	}
	if loss == "cross_entropy" {
		wv, ws, err := get("weights")
		if err != nil {
			return nil, nil, err
		}
		if len(ws) != len(ts) || (len(ws) == 2 && ws[1] != ts[1]) {
			return nil, nil, fmt.Errorf("datum %d: weights has shape %v but target_tokens has shape %v; they must match", i, ws, ts)
		}
		if err := finite("weights", wv); err != nil {
			return nil, nil, err
		}
		dl.weights = wv
		return toks, dl, nil
	}
	keys := []string{"logprobs", "advantages"}
	if loss == "gspo" {
		keys = append(keys, "sequence_ratio_mask")
	}
	for _, key := range keys {
		v, s, err := get(key)
		if err != nil {
			return nil, nil, err
		}
		if len(s) != 1 {
			return nil, nil, fmt.Errorf("datum %d: loss_fn_inputs[%q] must be 1-D of length %d, got shape %v", i, key, n, s)
		}
		if err := finite(key, v); err != nil {
			return nil, nil, err
		}
		switch key {
		case "logprobs":
			dl.q = v
		case "advantages":
			dl.adv = v
		default:
			if !slices.ContainsFunc(v, func(x float64) bool { return x != 0 }) {
				return nil, nil, fmt.Errorf("datum %d: sequence_ratio_mask marks no position; gspo's sequence ratio is the mean over the marked positions, so mark at least one", i)
			}
			dl.mask = v
		}
	}
	return toks, dl, nil
}

type fbItem struct {
	idx    int
	ad     *adapterState
	datums []*datumLoss
	loss   tokenLoss
	first  int // index of its first sequence in the pass
	err    error
}

func itemError(err error) *backendv1.ForwardBackwardItemResult {
	code, msg := connect.CodeInternal, err.Error()
	var ce *connect.Error
	if errors.As(err, &ce) { // a wrapped connect error keeps its code
		code, msg = ce.Code(), ce.Message()
	}
	return &backendv1.ForwardBackwardItemResult{Outcome: &backendv1.ForwardBackwardItemResult_Error{
		Error: &backendv1.ItemError{Code: int32(code), Message: msg}}}
}

func (e *Engine) prepareItem(idx int, it *backendv1.ForwardBackwardItem) *fbItem {
	fi := &fbItem{idx: idx}
	a, err := e.adapter(it.AdapterId)
	if err != nil {
		fi.err = err
		return fi
	}
	fi.ad = a
	accepted, ok := semantics.LossConfig(it.LossFn)
	if !ok {
		fi.err = invalid("unknown loss_fn %q; use one of %v", it.LossFn, LossFunctions)
		return fi
	}
	for k, v := range it.LossFnConfig {
		if _, ok := accepted[k]; !ok {
			fi.err = invalid("loss_fn_config key %q is not used by %s (accepted keys: %v)", k, it.LossFn, slices.Sorted(maps.Keys(accepted)))
			return fi
		}
		if math.IsNaN(v) || math.IsInf(v, 0) {
			fi.err = invalid("loss_fn_config[%q] must be finite", k)
			return fi
		}
		if lo, hi := semantics.LossConfigRange(k); v < lo || v > hi {
			fi.err = invalid("loss_fn_config[%q] is %v; it must be in [%v, %v]", k, v, lo, hi)
			return fi
		}
	}
	if len(it.Data) == 0 {
		fi.err = invalid("the batch for adapter %q is empty; send at least one datum", it.AdapterId)
		return fi
	}
	fi.loss = lossFn(it.LossFn, it.LossFnConfig)
	for i, d := range it.Data {
		_, dl, err := parseDatum(i, d, it.LossFn, a.base)
		if err != nil {
			fi.err = invalid("%v", err)
			return fi
		}
		fi.datums = append(fi.datums, dl)
	}
	return fi
}

// ForwardBackward computes the loss of every item and, unless forward_only, accumulates
// its gradient into the item's adapter. Items on one base model share one pass.
func (e *Engine) ForwardBackward(ctx context.Context, req *backendv1.ForwardBackwardRequest) (*backendv1.ForwardBackwardResponse, error) {
	if len(req.Items) == 0 {
		return nil, invalid("the request has no items")
	}
	items := make([]*fbItem, len(req.Items))
	for i, it := range req.Items {
		items[i] = e.prepareItem(i, it)
	}
	// lock every adapter involved, in id order
	locked := map[string]*adapterState{}
	for _, fi := range items {
		if fi.err == nil {
			locked[fi.ad.id] = fi.ad
		}
	}
	ids := make([]string, 0, len(locked))
	for id := range locked {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		locked[id].mu.Lock()
	}
	defer func() {
		for _, id := range ids {
			locked[id].mu.Unlock()
		}
	}()
	results := make([]*backendv1.ForwardBackwardItemResult, len(items))
	// group by base model and by forward_only
	type groupKey struct {
		base *baseModel
		fwd  bool
	}
	groups := map[groupKey][]*fbItem{}
	var order []groupKey
	for _, fi := range items {
		if fi.err != nil {
			results[fi.idx] = itemError(fi.err)
			continue
		}
		k := groupKey{fi.ad.base, req.Items[fi.idx].ForwardOnly}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], fi)
	}
	for _, k := range order {
		if err := ctx.Err(); err != nil {
			return nil, connect.NewError(connect.CodeCanceled, err)
		}
		g := groups[k]
		sequenceRatios(k.base, req, g)
		var seqs []nn.Seq[float32]
		var owner []*fbItem
		for _, fi := range g {
			fi.first = len(seqs)
			// the adapter may have been replaced by LoadAdapter before we locked it
			ad := fi.ad.ad
			for j, d := range req.Items[fi.idx].Data {
				toks := make([]int, len(d.Tokens))
				for t, v := range d.Tokens {
					toks[t] = int(v)
				}
				dl := fi.datums[j]
				seqs = append(seqs, nn.Seq[float32]{Tokens: toks, Adapter: ad, Targets: dl.targets, K: dl.k})
				owner = append(owner, fi)
			}
		}
		outs := k.base.m.ForwardBackward(seqs, func(s, pos, kk int, lp float64) (float64, float64) {
			fi := owner[s]
			return fi.loss(fi.datums[s-fi.first], pos, kk, lp)
		}, !k.fwd)
		for _, fi := range g {
			res := &loopsv1.ForwardBackwardResult{Metrics: map[string]float64{}}
			var total float64
			for j, dl := range fi.datums {
				o := outs[fi.first+j]
				lp := make([]float32, len(o.LogProbs))
				for t, v := range o.LogProbs {
					lp[t] = float32(v)
				}
				el := make([]float32, len(o.Loss))
				for t, v := range o.Loss {
					el[t] = float32(v)
					total += v
				}
				lpShape := []int64{int64(dl.n)}
				if dl.k > 1 || len(shapeOf(req.Items[fi.idx].Data[j].LossFnInputs["target_tokens"])) == 2 {
					lpShape = []int64{int64(dl.n), int64(dl.k)}
				}
				res.Outputs = append(res.Outputs, &loopsv1.DatumOutput{Outputs: map[string]*loopsv1.Tensor{
					"logprobs":         {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: lpShape, Float32Data: lp},
					"elementwise_loss": {Dtype: loopsv1.Dtype_DTYPE_FLOAT32, Shape: []int64{int64(dl.n)}, Float32Data: el},
				}})
			}
			res.Metrics["loss:sum"] = total
			results[fi.idx] = &backendv1.ForwardBackwardItemResult{Outcome: &backendv1.ForwardBackwardItemResult_Result{Result: res}}
		}
	}
	return &backendv1.ForwardBackwardResponse{Results: results}, nil
}

func shapeOf(t *loopsv1.Tensor) []int64 {
	if t == nil {
		return nil
	}
	return t.Shape
}

// sequenceRatios sets the sequence ratio of every gspo datum in g from a forward pass of
// their sequences: s = exp(Σ_M (lp − q) / |M|) over the positions M its
// sequence_ratio_mask marks. The training pass then takes s as a constant, as gspo's
// stop-gradient says.
func sequenceRatios(bm *baseModel, req *backendv1.ForwardBackwardRequest, g []*fbItem) {
	var seqs []nn.Seq[float32]
	var dls []*datumLoss
	for _, fi := range g {
		if req.Items[fi.idx].LossFn != "gspo" {
			continue
		}
		for j, d := range req.Items[fi.idx].Data {
			toks := make([]int, len(d.Tokens))
			for t, v := range d.Tokens {
				toks[t] = int(v)
			}
			dl := fi.datums[j]
			seqs = append(seqs, nn.Seq[float32]{Tokens: toks, Adapter: fi.ad.ad, Targets: dl.targets, K: dl.k})
			dls = append(dls, dl)
		}
	}
	if len(seqs) == 0 {
		return
	}
	outs := bm.m.ForwardBackward(seqs, func(int, int, int, float64) (float64, float64) { return 0, 0 }, false)
	for i, dl := range dls {
		var sum, n float64
		for pos, m := range dl.mask {
			if m != 0 {
				sum += outs[i].LogProbs[pos] - dl.q[pos]
				n++
			}
		}
		dl.seqRatio = math.Exp(sum / n)
	}
}
