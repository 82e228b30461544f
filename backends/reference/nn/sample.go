package nn

import (
	"math"
	"math/rand/v2"
	"sort"
	"strings"
)

// SampleParams control generation.
type SampleParams struct {
	MaxTokens   int
	Temperature float64 // <= 0: greedy
	TopK        int     // <= 0: no limit
	TopP        float64 // >= 1 (or <= 0): no limit
	Seed        *uint64 // nil: random
	StopTokens  []int
	StopStrings []string
	EOS         []int
	// Decode turns token ids into text; needed only for StopStrings.
	Decode func([]int) string
}

// Sampled is one generated continuation.
type Sampled struct {
	Tokens   []int
	LogProbs []float64
	Stopped  bool // ended on a stop token, stop string or end-of-sequence token
}

// TopEntry is one candidate token of a top-k prompt log-prob row.
type TopEntry struct {
	Token   int
	LogProb float64
}

// PromptScores are the log-probs of the prompt tokens under the model (temperature 1).
type PromptScores struct {
	LogProbs []float64    // one per prompt token; the first is NaN
	TopK     [][]TopEntry // one row per prompt token; the first is empty
}

// Sample generates n continuations of prompt. The prompt is run once and its cache is
// copied to each sample; the samples then decode together, one row each. Sample i draws
// from a generator seeded with (seed, i), so the same seed gives the same tokens. When
// promptLP or topK > 0, it also scores the prompt.
func (m *Model[T]) Sample(prompt []int, ad *Adapter[T], n int, p SampleParams, promptLP bool, topK int) ([]Sampled, *PromptScores) {
	V := m.Cfg.Vocab
	base := m.NewCache()
	pos := make([]int, len(prompt))
	caches := make([]*KVCache[T], len(prompt))
	for i := range pos {
		pos[i] = i
		caches[i] = base
	}
	h := m.Step(prompt, pos, caches, ad)
	D := m.Cfg.Hidden
	var scores *PromptScores
	var last []T
	if promptLP || topK > 0 {
		scores = &PromptScores{}
		if promptLP {
			scores.LogProbs = make([]float64, len(prompt))
			scores.LogProbs[0] = math.NaN()
		}
		if topK > 0 {
			scores.TopK = make([][]TopEntry, len(prompt))
		}
		for c0 := 0; c0 < len(prompt); c0 += headChunk {
			c1 := min(c0+headChunk, len(prompt))
			lg := m.Logits(h[c0*D:c1*D], c1-c0, ad)
			for r := c0; r < c1; r++ {
				row := lg[(r-c0)*V : (r-c0+1)*V]
				if r == len(prompt)-1 {
					last = append([]T(nil), row...)
				}
				if r+1 >= len(prompt) {
					continue
				}
				lse := logSumExp(row)
				if promptLP {
					scores.LogProbs[r+1] = float64(row[prompt[r+1]]) - lse
				}
				if topK > 0 {
					idx := topIndices(row, topK)
					ent := make([]TopEntry, len(idx))
					for e, t := range idx {
						ent[e] = TopEntry{Token: t, LogProb: float64(row[t]) - lse}
					}
					scores.TopK[r+1] = ent
				}
			}
		}
	} else {
		last = m.Logits(h[(len(prompt)-1)*D:], 1, ad)
	}
	out := make([]Sampled, n)
	rngs := make([]*rand.Rand, n)
	var seed uint64
	if p.Seed != nil {
		seed = *p.Seed
	} else {
		seed = rand.Uint64()
	}
	for i := range rngs {
		rngs[i] = rand.New(rand.NewPCG(seed, uint64(i)+0x5851f42d4c957f2d))
	}
	stops := map[int]bool{}
	for _, t := range p.StopTokens {
		stops[t] = true
	}
	for _, t := range p.EOS {
		stops[t] = true
	}
	sc := make([]*KVCache[T], n)
	for i := range sc {
		if i == 0 {
			sc[i] = base
		} else {
			sc[i] = base.Clone()
		}
	}
	active := make([]int, n)
	for i := range active {
		active[i] = i
	}
	logits := make([][]T, n)
	for i := range logits {
		logits[i] = last
	}
	for step := 0; step < p.MaxTokens && len(active) > 0; step++ {
		var next []int
		for _, i := range active {
			tok, lp := sampleToken(logits[i], p, rngs[i])
			s := &out[i]
			s.Tokens = append(s.Tokens, tok)
			s.LogProbs = append(s.LogProbs, lp)
			if stops[tok] {
				s.Stopped = true
				continue
			}
			if len(p.StopStrings) > 0 && p.Decode != nil {
				text := p.Decode(s.Tokens)
				hit := false
				for _, st := range p.StopStrings {
					if st != "" && strings.Contains(text, st) {
						hit = true
						break
					}
				}
				if hit {
					s.Stopped = true
					continue
				}
			}
			next = append(next, i)
		}
		active = next
		if len(active) == 0 || step+1 >= p.MaxTokens {
			break
		}
		toks := make([]int, len(active))
		ps := make([]int, len(active))
		cs := make([]*KVCache[T], len(active))
		for r, i := range active {
			toks[r] = out[i].Tokens[len(out[i].Tokens)-1]
			ps[r] = len(prompt) + len(out[i].Tokens) - 1
			cs[r] = sc[i]
		}
		hs := m.Step(toks, ps, cs, ad)
		lg := m.Logits(hs, len(active), ad)
		for r, i := range active {
			logits[i] = lg[r*V : (r+1)*V]
		}
	}
	return out, scores
}

// topIndices returns the indices of the k largest values, largest first (ties: lower id).
func topIndices[T Float](x []T, k int) []int {
	k = min(k, len(x))
	idx := make([]int, 0, k)
	for i, v := range x {
		if len(idx) < k {
			idx = append(idx, i)
			for j := len(idx) - 1; j > 0 && x[idx[j]] > x[idx[j-1]]; j-- {
				idx[j], idx[j-1] = idx[j-1], idx[j]
			}
			continue
		}
		if v <= x[idx[k-1]] {
			continue
		}
		idx[k-1] = i
		for j := k - 1; j > 0 && x[idx[j]] > x[idx[j-1]]; j-- {
			idx[j], idx[j-1] = idx[j-1], idx[j]
		}
	}
	return idx
}

// sampleToken draws one token. The distribution is softmax(logits/temperature), cut to the
// top_k most likely tokens, then to the smallest set whose mass reaches top_p, and
// renormalised; the returned log-prob is the token's log-prob under exactly that
// distribution. With temperature <= 0 it returns the argmax and its log-prob at
// temperature 1.
func sampleToken[T Float](logits []T, p SampleParams, r *rand.Rand) (int, float64) {
	if p.Temperature <= 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		return best, float64(logits[best]) - logSumExp(logits)
	}
	inv := 1 / p.Temperature
	V := len(logits)
	cand := []int(nil)
	if p.TopK > 0 && p.TopK < V {
		cand = topIndices(logits, p.TopK)
	}
	if p.TopP > 0 && p.TopP < 1 {
		if cand == nil {
			cand = make([]int, V)
			for i := range cand {
				cand[i] = i
			}
			sort.SliceStable(cand, func(a, b int) bool { return logits[cand[a]] > logits[cand[b]] })
		}
	}
	if cand == nil {
		// full vocabulary
		mx := math.Inf(-1)
		for _, v := range logits {
			mx = max(mx, float64(v)*inv)
		}
		var sum float64
		for _, v := range logits {
			sum += math.Exp(float64(v)*inv - mx)
		}
		u := r.Float64() * sum
		var acc float64
		tok := V - 1
		for i, v := range logits {
			acc += math.Exp(float64(v)*inv - mx)
			if acc > u {
				tok = i
				break
			}
		}
		return tok, float64(logits[tok])*inv - mx - math.Log(sum)
	}
	// cand is sorted by decreasing logit
	mx := float64(logits[cand[0]]) * inv
	w := make([]float64, len(cand))
	var sum float64
	for i, t := range cand {
		w[i] = math.Exp(float64(logits[t])*inv - mx)
		sum += w[i]
	}
	if p.TopP > 0 && p.TopP < 1 {
		var acc float64
		keep := len(cand)
		for i := range w {
			acc += w[i] / sum
			if acc >= p.TopP {
				keep = i + 1
				break
			}
		}
		cand, w = cand[:keep], w[:keep]
		sum = 0
		for _, x := range w {
			sum += x
		}
	}
	u := r.Float64() * sum
	var acc float64
	pick := len(cand) - 1
	for i, x := range w {
		acc += x
		if acc > u {
			pick = i
			break
		}
	}
	return cand[pick], math.Log(w[pick] / sum)
}
