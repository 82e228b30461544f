package oracle

import (
	"fmt"
	"math"
	"sort"
)

// Loss defaults (Tinker's documented values; DRO's beta default is the project's decision).
const (
	DefaultClipLow  = 0.8
	DefaultClipHigh = 1.2
	DefaultDROBeta  = 0.05
	// gspo's defaults: the GSPO paper's clipping ranges (3e-4, 4e-4) around 1.
	DefaultGSPOClipLow  = 0.9997
	DefaultGSPOClipHigh = 1.0004
)

// LossConfigKeys are the loss_fn_config keys each loss accepts.
var LossConfigKeys = map[string][]string{
	"cross_entropy":       nil,
	"importance_sampling": nil,
	"ppo":                 {"clip_low_threshold", "clip_high_threshold"},
	"cispo":               {"clip_low_threshold", "clip_high_threshold"},
	"dro":                 {"beta"},
	"gspo":                {"clip_low_threshold", "clip_high_threshold"},
}

// LossNames lists the losses, sorted.
func LossNames() []string {
	var out []string
	for k := range LossConfigKeys {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Loss is a loss function name and its loss_fn_config.
type Loss struct {
	Name   string
	Config map[string]float64
}

// Datum is one example: N input tokens and per-position loss inputs. Targets and Weights
// are (N, K) row-major; SamplerLogprobs (q), Advantages (A) and SequenceRatioMask (gspo's
// M, nonzero = marked) are (N,).
type Datum struct {
	Tokens            []int
	Targets           []int
	K                 int
	Weights           []float64
	SamplerLogprobs   []float64
	Advantages        []float64
	SequenceRatioMask []float64
}

// SequenceRatio is gspo's sequence ratio of a datum whose learner log-probs are lps:
// s = exp(Σ_{t∈M} (lp_t − q_t) / |M|) over the positions M its SequenceRatioMask marks.
func SequenceRatio(d *Datum, lps []float64) float64 {
	sum, n := 0.0, 0
	for t, m := range d.SequenceRatioMask {
		if m != 0 {
			sum += lps[t] - d.SamplerLogprobs[t]
			n++
		}
	}
	if n == 0 {
		panic("oracle: gspo datum whose sequence_ratio_mask marks nothing")
	}
	return math.Exp(sum / float64(n))
}

func (l Loss) cfg(key string, def float64) float64 {
	if v, ok := l.Config[key]; ok {
		return v
	}
	return def
}

// Validate checks the loss name and config keys.
func (l Loss) Validate() error {
	keys, ok := LossConfigKeys[l.Name]
	if !ok {
		return fmt.Errorf("unknown loss %q", l.Name)
	}
	for k := range l.Config {
		found := false
		for _, kk := range keys {
			found = found || k == kk
		}
		if !found {
			return fmt.Errorf("loss %s has no config key %q", l.Name, k)
		}
	}
	return nil
}

func clamp(x, lo, hi float64) float64 { return math.Min(math.Max(x, lo), hi) }

// Token returns the loss of one (position, target) given the learner log-prob lp, and its
// derivative with respect to lp. Stop-gradient factors (cispo's clipped ratio) count as
// constants in the derivative.
//
//	cross_entropy:       −w·lp
//	importance_sampling: −r·A,                        r = exp(lp − q)
//	ppo:                 −min(r·A, clip(r, lo, hi)·A)
//	cispo:               −sg(clip(r, lo, hi))·A·lp
//	dro:                 −(lp·A − ½·β·(lp − q)²)
//
// gspo's loss is not a function of one token's lp alone: see GSPOToken.
func (l Loss) Token(d *Datum, pos, k int, lp float64) (loss, dlp float64) {
	switch l.Name {
	case "cross_entropy":
		w := d.Weights[pos*d.K+k]
		return -w * lp, -w
	}
	q, a := d.SamplerLogprobs[pos], d.Advantages[pos]
	r := math.Exp(lp - q)
	lo, hi := l.cfg("clip_low_threshold", DefaultClipLow), l.cfg("clip_high_threshold", DefaultClipHigh)
	switch l.Name {
	case "importance_sampling":
		return -r * a, -r * a
	case "ppo":
		unclipped, clipped := r*a, clamp(r, lo, hi)*a
		if unclipped <= clipped {
			return -unclipped, -r * a
		}
		return -clipped, 0 // clipped branch: constant in lp
	case "cispo":
		c := clamp(r, lo, hi)
		return -c * a * lp, -c * a
	case "dro":
		beta := l.cfg("beta", DefaultDROBeta)
		return -(lp*a - 0.5*beta*(lp-q)*(lp-q)), -(a - beta*(lp-q))
	}
	panic("oracle: unknown loss " + l.Name)
}

// GSPOToken returns gspo's loss at position pos given the datum's sequence ratio s (see
// SequenceRatio), and its derivative with respect to the position's lp. The token ratio is
// s_t = sg(s)·exp(lp − sg(lp)): its value is s and d s_t / d lp = s, so
//
//	gspo: −min(s·A, clip(s, lo, hi)·A), derivative −s·A on the unclipped branch, else 0.
func (l Loss) GSPOToken(d *Datum, pos int, s float64) (loss, dlp float64) {
	a := d.Advantages[pos]
	lo, hi := l.cfg("clip_low_threshold", DefaultGSPOClipLow), l.cfg("clip_high_threshold", DefaultGSPOClipHigh)
	unclipped, clipped := s*a, clamp(s, lo, hi)*a
	if unclipped <= clipped {
		return -unclipped, -s * a
	}
	return -clipped, 0
}

// Eval is the oracle's forward result for a batch.
type Eval struct {
	// LogProbs per datum, (N, K) row-major.
	LogProbs [][]float64
	// Elementwise per datum, (N,), summed over K.
	Elementwise [][]float64
	// Total is the sum over every datum, position and target.
	Total float64
	// Coef per datum, (N, K): d loss / d lp at this point.
	Coef [][]float64
}

// Evaluate computes log-probs and losses of a batch under an adapter.
func (m *Model) Evaluate(ad *Adapter, l Loss, data []*Datum) *Eval {
	ev := &Eval{}
	for _, d := range data {
		k := max(d.K, 1)
		lps := m.LogProbs(d.Tokens, ad, d.Targets, k)
		el := make([]float64, len(d.Tokens))
		coef := make([]float64, len(lps))
		var s float64
		if l.Name == "gspo" {
			s = SequenceRatio(d, lps)
		}
		for pos := range d.Tokens {
			for j := 0; j < k; j++ {
				var v, g float64
				if l.Name == "gspo" {
					v, g = l.GSPOToken(d, pos, s)
				} else {
					v, g = l.Token(d, pos, j, lps[pos*k+j])
				}
				el[pos] += v
				coef[pos*k+j] = g
				ev.Total += v
			}
		}
		ev.LogProbs = append(ev.LogProbs, lps)
		ev.Elementwise = append(ev.Elementwise, el)
		ev.Coef = append(ev.Coef, coef)
	}
	return ev
}

// surrogate is Σ coef·lp over the batch under ad.
func (m *Model) surrogate(ad *Adapter, data []*Datum, coef [][]float64) float64 {
	s := 0.0
	for i, d := range data {
		k := max(d.K, 1)
		lps := m.LogProbs(d.Tokens, ad, d.Targets, k)
		for j, v := range lps {
			s += coef[i][j] * v
		}
	}
	return s
}

// Slope returns the directional derivative of the batch loss along dir (keyed by PEFT key)
// by a central finite difference of step h on the surrogate Σ c·lp, where c are the loss
// derivatives of ev (from Evaluate at ad). For smooth losses this is the gradient of the
// loss; for cispo (the clipped ratio) and gspo (the sequence ratio) it treats the
// stop-gradient factors as constants, as the losses say.
func (m *Model) Slope(ad *Adapter, data []*Datum, ev *Eval, dir map[string][]float64, h float64) float64 {
	up := m.surrogate(ad.Shifted(dir, h), data, ev.Coef)
	down := m.surrogate(ad.Shifted(dir, -h), data, ev.Coef)
	return (up - down) / (2 * h)
}

// Coordinate returns the finite-difference gradient of the batch loss with respect to one
// parameter value (PEFT key, flat index).
func (m *Model) Coordinate(ad *Adapter, data []*Datum, ev *Eval, key string, idx int, h float64) float64 {
	p := ad.Param(key)
	if p == nil {
		panic("oracle: adapter has no parameter " + key)
	}
	dir := map[string][]float64{key: make([]float64, len(p.Data))}
	dir[key][idx] = 1
	return m.Slope(ad, data, ev, dir, h)
}
