package oracle

import (
	"math"
	"sort"
	"strings"
)

// NextLogProbs returns log softmax(logits/temperature) of the token after tokens.
func (m *Model) NextLogProbs(tokens []int, ad *Adapter, temperature float64) []float64 {
	l := m.Logits(tokens, ad)
	return LogSoftmax(l[len(l)-1], temperature)
}

// Ranked is a token and its log-prob.
type Ranked struct {
	Token   int
	LogProb float64
}

// TopK returns the k largest entries of logprobs, largest first (ties: smaller id first).
func TopK(logprobs []float64, k int) []Ranked {
	all := make([]Ranked, len(logprobs))
	for i, v := range logprobs {
		all[i] = Ranked{i, v}
	}
	sort.SliceStable(all, func(a, b int) bool { return all[a].LogProb > all[b].LogProb })
	return all[:min(k, len(all))]
}

// Continuation is a generated sequence.
type Continuation struct {
	Tokens  []int
	Stopped bool
	// MinGap is the smallest gap between the best and second-best logit over the steps;
	// a backend's float32 argmax may legitimately differ where it is tiny.
	MinGap float64
}

// StopRule says when a generated sequence ends: on a model EOS id, on one of Tokens, or
// when the decoded generated text contains one of Strings. The ending token is included.
type StopRule struct {
	Tokens  []int
	Strings []string
	Decode  func([]int) string
}

func (s StopRule) stops(m *Model, gen []int) bool {
	last := gen[len(gen)-1]
	if m.IsEOS(last) {
		return true
	}
	for _, t := range s.Tokens {
		if t == last {
			return true
		}
	}
	if len(s.Strings) > 0 && s.Decode != nil {
		text := s.Decode(gen)
		for _, str := range s.Strings {
			if str != "" && strings.Contains(text, str) {
				return true
			}
		}
	}
	return false
}

// Greedy generates up to maxTokens argmax tokens after prompt.
func (m *Model) Greedy(prompt []int, ad *Adapter, maxTokens int, stop StopRule) Continuation {
	seq := append([]int(nil), prompt...)
	c := Continuation{MinGap: math.Inf(1)}
	for len(c.Tokens) < maxTokens {
		lp := m.NextLogProbs(seq, ad, 1)
		top := TopK(lp, 2)
		c.MinGap = math.Min(c.MinGap, top[0].LogProb-top[1].LogProb)
		seq = append(seq, top[0].Token)
		c.Tokens = append(c.Tokens, top[0].Token)
		if stop.stops(m, c.Tokens) {
			c.Stopped = true
			break
		}
	}
	return c
}

// SequenceLogProbs returns, for each generated token gen[i], its log-prob under
// softmax(logits/temperature) given prompt and gen[:i] (one teacher-forced pass).
func (m *Model) SequenceLogProbs(prompt, gen []int, ad *Adapter, temperature float64) []float64 {
	if len(gen) == 0 {
		return nil
	}
	seq := append(append([]int(nil), prompt...), gen[:len(gen)-1]...)
	logits := m.Logits(seq, ad)
	out := make([]float64, len(gen))
	for i, tok := range gen {
		out[i] = LogSoftmax(logits[len(prompt)-1+i], temperature)[tok]
	}
	return out
}

// PromptLogProbs returns log p(prompt[i] | prompt[:i]) at temperature 1 for i ≥ 1, NaN
// first, and the top-k candidates of each position (nil first).
func (m *Model) PromptLogProbs(prompt []int, ad *Adapter, k int) ([]float64, [][]Ranked) {
	logits := m.Logits(prompt, ad)
	lps := []float64{math.NaN()}
	tops := [][]Ranked{nil}
	for i := 1; i < len(prompt); i++ {
		ls := LogSoftmax(logits[i-1], 1)
		lps = append(lps, ls[prompt[i]])
		if k > 0 {
			tops = append(tops, TopK(ls, k))
		}
	}
	return lps, tops
}

// PromptRows returns, for each prompt position i ≥ 1, log softmax(logits/temperature) of
// the token at i given prompt[:i] (row i-1; temperature <= 0 means 1): the distributions
// target_prompt_logprobs (temperature 1) and prompt_alt_tokens read.
func (m *Model) PromptRows(prompt []int, ad *Adapter, temperature float64) [][]float64 {
	if temperature <= 0 {
		temperature = 1
	}
	logits := m.Logits(prompt, ad)
	rows := make([][]float64, 0, len(prompt)-1)
	for i := 1; i < len(prompt); i++ {
		rows = append(rows, LogSoftmax(logits[i-1], temperature))
	}
	return rows
}
