package nn

import (
	"math"
	"math/rand/v2"
	"slices"
	"sort"
	"strings"
	"sync"
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
	// TopLogprobs > 0 also returns, per sampled token, the TopLogprobs most likely tokens
	// of the distribution it was drawn from (Sampled.Top).
	TopLogprobs int
	// LogitBias is added to the logits of its token ids.
	LogitBias map[int]float64
	// PresencePenalty is subtracted from the logit of every token the sequence has
	// sampled; FrequencyPenalty once per time it has sampled it.
	PresencePenalty, FrequencyPenalty float64
	// MinP > 0 (with Temperature > 0) drops the tokens whose probability is below MinP
	// times the most likely token's.
	MinP float64
	// Constraint, when set, allows only the tokens it masks in at each step
	// (structured outputs).
	Constraint Constraint
}

// Constraint restricts what a sequence may sample: a state machine over tokens. It must
// be safe for concurrent use (sequences decode on several threads).
type Constraint interface {
	// Start is the state before the first token.
	Start() int32
	// Mask is the tokens allowed in a state, a bitset over the vocabulary (bit id%64 of
	// word id/64); an end-of-sequence token is in it only once the text is complete.
	Mask(state int32) []uint64
	// Next is the state after a token.
	Next(state int32, token int) int32
}

// adjusts reports whether p changes the logits before the draw (adjustLogits).
func (p *SampleParams) adjusts() bool {
	return len(p.LogitBias) > 0 || p.PresencePenalty != 0 || p.FrequencyPenalty != 0 || p.MinP > 0 || p.Constraint != nil
}

// adjustLogits turns the model's logits into those the sequence samples from, in place,
// in this order: l[t] += logit_bias[t] − frequency_penalty·c[t] − presence_penalty·[c[t] >
// 0] (c[t]: how many times the sequence has sampled t); tokens the constraint does not
// allow to −∞; with temperature > 0 and min_p > 0, tokens with l[t] < max(l) +
// temperature·ln(min_p) (probability below min_p times the largest) to −∞. It reports
// false when no token is left.
func (s *GenSeq[T]) adjustLogits(row []T) bool {
	p := &s.g.p
	for t, b := range p.LogitBias {
		row[t] = T(float64(row[t]) + b)
	}
	if p.PresencePenalty != 0 || p.FrequencyPenalty != 0 {
		for t, c := range s.counts {
			row[t] = T(float64(row[t]) - (float64(c)*p.FrequencyPenalty + p.PresencePenalty))
		}
	}
	ninf := T(math.Inf(-1))
	if p.Constraint != nil {
		m := p.Constraint.Mask(s.cstate)
		left := false
		for i := range row {
			if m[i>>6]>>(i&63)&1 == 0 {
				row[i] = ninf
			} else {
				left = true
			}
		}
		if !left {
			return false
		}
	}
	if p.MinP > 0 && p.Temperature > 0 {
		mx := math.Inf(-1)
		for _, v := range row {
			mx = max(mx, float64(v))
		}
		thr := mx + p.Temperature*math.Log(p.MinP)
		for i, v := range row {
			if float64(v) < thr {
				row[i] = ninf
			}
		}
	}
	return true
}

// Sampled is one generated continuation.
type Sampled struct {
	Tokens   []int
	LogProbs []float64
	Stopped  bool // ended on a stop token, stop string or end-of-sequence token
	// Top holds, with SampleParams.TopLogprobs, per token the most likely tokens of the
	// distribution it was drawn from (at most TopLogprobs; fewer when top_k or top_p leave
	// fewer), most likely first, ties by lower id: at temperature <= 0 the model's
	// (temperature 1), otherwise softmax(logits/temperature) cut to top_k and top_p and
	// renormalised, the distribution of LogProbs.
	Top [][]TopEntry
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
	// Targets holds, with Gen.WantTargets, the log-prob of each target id: row i (prompt
	// position i + 1) has one per id of its target row, NaN where the id is negative.
	Targets [][]float64
	// Alts holds, with Gen.WantAlts k, k draws per prompt position after the first (row i:
	// position i + 1) with their log-probs at temperature 1.
	Alts [][]TopEntry
}

// altStream is the PCG stream of a generation's prompt draws (Gen.WantAlts): sample i
// draws from stream i + 0x5851f42d4c957f2d, so the draws take the one before sample 0's.
const altStream = 0x5851f42d4c957f2d - 1

// PrefillChunk is the longest prompt chunk: a prompt is cut into chunks at multiples of
// PrefillChunk, and a chunk's products are chosen by its length (prefillRowsMax), so its
// results depend on the prompt alone. A chunk may run in pieces of any size
// (PrefillPieces: sampling under load, backends/reference/batch.go) and gets the same bits.
const PrefillChunk = 512

// prefillRowsMax is the longest prompt chunk whose products go through the unpacked,
// row-stable kernels (as decoding does) rather than the packed SGEMM: below it, packing the
// weights costs more than the product (BenchmarkPrefill).
const prefillRowsMax = 64

// Sample generates n continuations of prompt. The prompt is run once and its cache is
// copied to each sample; the samples then decode together, one row each. Sample i draws
// from a generator seeded with (seed, i), so the same seed gives the same tokens. When
// promptLP or topK > 0, it also scores the prompt. It is a Gen run alone: decoding it in a
// batch with other generations (Decode) gives the same bits.
func (m *Model[T]) Sample(prompt []int, ad *Adapter[T], n int, p SampleParams, promptLP bool, topK int) ([]Sampled, *PromptScores) {
	g := m.NewGen(prompt, ad, n, p, promptLP, topK)
	for !g.Prefilled() {
		g.Prefill()
	}
	var seqs []*GenSeq[T]
	for g.Pending() > 0 {
		seqs = append(seqs, g.Start())
	}
	for !g.Done() {
		m.Decode(seqs)
	}
	return g.Out, g.Scores
}

// Gen is one sampling request in progress: its prompt is prefilled chunk by chunk
// (Prefill), then each of its n sequences is started (Start) and decoded one token per
// Decode call, possibly beside sequences of other generations. A Gen is not safe for
// concurrent use.
type Gen[T Float] struct {
	m        *Model[T]
	prompt   []int
	ad       *Adapter[T]
	p        SampleParams
	n        int
	promptLP bool
	topK     int
	targets  [][]int    // per prompt position after the first, the ids to score (-1: none)
	altK     int        // prompt draws per position
	altRng   *rand.Rand // the prompt draws' generator
	stops    map[int]bool
	seed     uint64
	base     *KVCache[T] // the prompt's cache; nil once the last sequence took it
	filled   int         // prompt tokens prefilled
	last     []T         // logits after the last prompt token
	started  int
	running  int // started and not finished

	// Scores are the prompt's scores (nil unless asked for), complete once Prefilled.
	Scores *PromptScores
	// Out holds the sequences, complete once Done.
	Out []Sampled
	// OnPrefilled, when set, is called once the whole prompt has run, with the prompt's
	// cache (its first Prompt() positions are the prompt's keys and values). It runs on the
	// decoding goroutine, must not block, and must not change or keep kv.
	OnPrefilled func(kv *KVCache[T])
	// OnToken, when set, is called with every token as it is sampled: its sequence's
	// index, the token and its log-prob (those appended to Out). It runs on the decoding
	// goroutine and must not block.
	OnToken func(seq, token int, logprob float64, top []TopEntry)
}

// GenSeq is one sequence of a Gen being decoded.
type GenSeq[T Float] struct {
	g     *Gen[T]
	i     int
	cache *KVCache[T]
	rng   *rand.Rand
	done  bool
	// with SampleParams.Constraint: its state after the tokens so far
	cstate int32
	// with a presence or frequency penalty: how many times each token was sampled
	counts map[int]int
}

// NewGen prepares a generation (see Sample); it computes nothing yet.
func (m *Model[T]) NewGen(prompt []int, ad *Adapter[T], n int, p SampleParams, promptLP bool, topK int) *Gen[T] {
	g := &Gen[T]{m: m, prompt: prompt, ad: ad, p: p, n: n, promptLP: promptLP, topK: topK,
		stops: map[int]bool{}, base: m.NewCache(), Out: make([]Sampled, n)}
	if p.Seed != nil {
		g.seed = *p.Seed
	} else {
		g.seed = rand.Uint64()
	}
	for _, t := range p.StopTokens {
		g.stops[t] = true
	}
	for _, t := range p.EOS {
		g.stops[t] = true
	}
	if promptLP || topK > 0 {
		g.Scores = &PromptScores{}
		if promptLP {
			g.Scores.LogProbs = make([]float64, len(prompt))
			g.Scores.LogProbs[0] = math.NaN()
		}
		if topK > 0 {
			g.Scores.TopK = make([][]TopEntry, len(prompt))
		}
	}
	return g
}

// WantTargets asks for the log-probs of targets[i] at prompt position i + 1 (Scores.
// Targets; a negative id gets NaN). Call it before the first Prefill; len(targets) must be
// len(prompt) - 1 and every id below the vocabulary size.
func (g *Gen[T]) WantTargets(targets [][]int) {
	if g.Scores == nil {
		g.Scores = &PromptScores{}
	}
	g.targets = targets
	g.Scores.Targets = make([][]float64, len(targets))
}

// WantAlts asks for k draws at every prompt position after the first (Scores.Alts): from
// softmax(logits / temperature) over the whole vocabulary (temperature <= 0: the argmax k
// times), drawn as sampleToken draws, by a generator seeded with (seed, altStream); each
// with its log-prob at temperature 1. Call it before the first Prefill.
func (g *Gen[T]) WantAlts(k int) {
	if k <= 0 {
		return
	}
	if g.Scores == nil {
		g.Scores = &PromptScores{}
	}
	g.altK = k
	g.altRng = rand.New(rand.NewPCG(g.seed, altStream))
	g.Scores.Alts = make([][]TopEntry, len(g.prompt)-1)
}

// ChunkRows reports whether prompt position pos of a prompt of promptLen tokens runs
// through the row kernels (its chunk has at most prefillRowsMax tokens) rather than the
// SGEMM: the two give a position's keys and values different bits, so a prefix cache must
// tell them apart.
func ChunkRows(pos, promptLen int) bool {
	c0 := pos / PrefillChunk * PrefillChunk
	return min(c0+PrefillChunk, promptLen)-c0 <= prefillRowsMax
}

// Reuse starts the generation from kv, the keys and values of its first kv.N prompt
// tokens as Prefill would compute them (same weights, adapter, tokens and ChunkRows modes:
// the caller's to ensure), so prefilling runs only the rest. It reports false, changing
// nothing, unless it is called before the first Prefill, with no prompt scores asked for
// (they need every position's logits) and 0 < kv.N < the prompt's length (the last token
// always runs: its logits are sampled from).
func (g *Gen[T]) Reuse(kv *KVCache[T]) bool {
	if g.filled != 0 || g.Scores != nil || kv.N <= 0 || kv.N >= len(g.prompt) || len(kv.K) != len(g.m.Layers) {
		return false
	}
	g.base, g.filled = kv, kv.N
	return true
}

// Prefilled reports whether the whole prompt has run.
func (g *Gen[T]) Prefilled() bool { return g.filled == len(g.prompt) }

// Prefill runs the rest of the prompt's current chunk (at most PrefillChunk tokens; chunks
// are cut at multiples of PrefillChunk) and returns how many tokens it ran.
func (g *Gen[T]) Prefill() int { return PrefillPieces([]Piece[T]{{g, g.NextChunk()}}) }

// NextChunk is how many prompt tokens are left in the current chunk, what Prefill runs (0
// once prefilled).
func (g *Gen[T]) NextChunk() int {
	_, c1 := g.chunk()
	return c1 - g.filled
}

// Prompt is the prompt's length in tokens.
func (g *Gen[T]) Prompt() int { return len(g.prompt) }

// Left is how many prompt tokens are still to run (0 once prefilled).
func (g *Gen[T]) Left() int { return len(g.prompt) - g.filled }

// chunk is the prompt chunk [c0, c1) that holds the next prompt token.
func (g *Gen[T]) chunk() (c0, c1 int) {
	c0 = g.filled / PrefillChunk * PrefillChunk
	return c0, min(c0+PrefillChunk, len(g.prompt))
}

// mode is the products of the current chunk: the row kernels for a chunk of at most
// prefillRowsMax tokens, the SGEMM for a longer one (prodWide: the bits of a product of
// the whole chunk, however few of its tokens a piece runs).
func (g *Gen[T]) mode() prodMode {
	if c0, c1 := g.chunk(); c1-c0 <= prefillRowsMax {
		return prodRows
	}
	return prodWide
}

// Piece is the next N prompt tokens of a generation (at most the rest of its chunk).
type Piece[T Float] struct {
	Gen *Gen[T]
	N   int
}

// PrefillPieces runs each piece (its N clipped to the rest of its generation's chunk; at
// most one piece per generation) of generations of one model: the pieces of chunks that
// take the row kernels in one step, those of chunks that take the SGEMM in another. Both
// products give each row the bits it gets alone, so every generation gets the bits Prefill
// gives it, however its prompt is cut into pieces and whatever runs beside it, while the
// weights are read once for all. It returns the prompt tokens run.
func PrefillPieces[T Float](pieces []Piece[T]) int {
	ran := 0
	var batch []Piece[T]
	for _, mode := range [...]prodMode{prodRows, prodWide} {
		batch = batch[:0]
		for _, p := range pieces {
			if n := min(p.N, p.Gen.NextChunk()); n > 0 && p.Gen.mode() == mode {
				batch = append(batch, Piece[T]{p.Gen, n})
			}
		}
		if len(batch) > 0 {
			ran += prefillStep(batch, mode)
		}
	}
	return ran
}

// prefillStep runs pieces (each of at least one token, within its chunk) in one step of
// mode's products and returns the tokens run.
func prefillStep[T Float](pieces []Piece[T], mode prodMode) int {
	// rows grouped by adapter, one segment each, in the order the adapters first appear
	var ads []*Adapter[T]
	for _, p := range pieces {
		if !slices.Contains(ads, p.Gen.ad) {
			ads = append(ads, p.Gen.ad)
		}
	}
	slices.SortStableFunc(pieces, func(a, b Piece[T]) int { return slices.Index(ads, a.Gen.ad) - slices.Index(ads, b.Gen.ad) })
	var toks, pos []int
	var caches []*KVCache[T]
	var segs []seg[T]
	for _, p := range pieces {
		g := p.Gen
		r0 := len(toks)
		toks = append(toks, g.prompt[g.filled:g.filled+p.N]...)
		for q := g.filled; q < g.filled+p.N; q++ {
			pos = append(pos, q)
			caches = append(caches, g.base)
		}
		if len(segs) == 0 || segs[len(segs)-1].ad != g.ad {
			segs = append(segs, seg[T]{r0, r0, g.ad})
		}
		segs[len(segs)-1].r1 = len(toks)
	}
	m := pieces[0].Gen.m
	buf := getStepBuf[T]()
	defer decodeBufs.Put(buf)
	h := m.step(toks, pos, caches, segs, mode, buf)
	D, off := m.Cfg.Hidden, 0
	for _, p := range pieces {
		p.Gen.finishPiece(h[off*D:(off+p.N)*D], p.N)
		off += p.N
	}
	return len(toks)
}

func getStepBuf[T Float]() *stepBuf[T] {
	if buf, _ := decodeBufs.Get().(*stepBuf[T]); buf != nil {
		return buf
	}
	return &stepBuf[T]{}
}

// finishPiece records the next n prompt tokens as run, h their final hidden states: the
// logits after the last prompt token, and the prompt's scores when asked for. The logits
// of a chunk's tokens are computed headChunk tokens at a time from the chunk's start, each
// group's with the products Logits takes for a product of that group's size (prodWide when
// it has more than smallM tokens), so a piece gets the bits of its whole chunk.
func (g *Gen[T]) finishPiece(h []T, n int) {
	m, prompt := g.m, g.prompt
	c0, c1 := g.chunk()
	p0, p1 := g.filled, g.filled+n
	g.filled = p1
	if p1 == len(prompt) && g.OnPrefilled != nil {
		g.OnPrefilled(g.base)
	}
	D, V := m.Cfg.Hidden, m.Cfg.Vocab
	if g.Scores == nil {
		if p1 == len(prompt) {
			g.last = m.Logits(h[(n-1)*D:n*D], 1, g.ad)
		}
		return
	}
	for r0 := p0; r0 < p1; {
		gs := c0 + (r0-c0)/headChunk*headChunk
		ge := min(gs+headChunk, c1)
		r1 := min(ge, p1)
		var lg []T
		if ge-gs > smallM {
			lg = make([]T, (r1-r0)*V)
			var xa []T
			linWide(h[(r0-p0)*D:(r1-p0)*D], r1-r0, &m.Head, m.packedWeights().pack(-1, 0), []seg[T]{{0, r1 - r0, g.ad}}, -1, 0, lg, &xa)
		} else {
			lg = m.Logits(h[(r0-p0)*D:(r1-p0)*D], r1-r0, g.ad)
		}
		for r := r0; r < r1; r++ {
			g.scoreRow(r, lg[(r-r0)*V:(r-r0+1)*V])
		}
		r0 = r1
	}
}

// scoreRow records the logits after prompt token r: the next token's scores, or the
// logits to sample from after the last one.
func (g *Gen[T]) scoreRow(r int, row []T) {
	prompt := g.prompt
	if r == len(prompt)-1 {
		g.last = append([]T(nil), row...)
	}
	if r+1 >= len(prompt) {
		return
	}
	lse := logSumExp(row)
	if g.promptLP {
		g.Scores.LogProbs[r+1] = float64(row[prompt[r+1]]) - lse
	}
	if g.topK > 0 {
		idx := topIndices(row, g.topK)
		ent := make([]TopEntry, len(idx))
		for e, t := range idx {
			ent[e] = TopEntry{Token: t, LogProb: float64(row[t]) - lse}
		}
		g.Scores.TopK[r+1] = ent
	}
	if g.targets != nil {
		ids := g.targets[r]
		out := make([]float64, len(ids))
		for j, t := range ids {
			out[j] = math.NaN()
			if t >= 0 {
				out[j] = float64(row[t]) - lse
			}
		}
		g.Scores.Targets[r] = out
	}
	if g.altK > 0 {
		g.Scores.Alts[r] = g.drawAlts(row, lse)
	}
}

// drawAlts draws WantAlts' k tokens from one row of logits (lse: its log-sum-exp). A draw
// is sampleToken's over the whole vocabulary: u uniform in [0, sum) and the first token
// whose running sum of exp(logit/T - max) passes u.
func (g *Gen[T]) drawAlts(row []T, lse float64) []TopEntry {
	k := g.altK
	out := make([]TopEntry, k)
	if g.p.Temperature <= 0 {
		best := 0
		for i, v := range row {
			if v > row[best] {
				best = i
			}
		}
		for j := range out {
			out[j] = TopEntry{Token: best, LogProb: float64(row[best]) - lse}
		}
		return out
	}
	inv := 1 / g.p.Temperature
	mx := math.Inf(-1)
	for _, v := range row {
		mx = max(mx, float64(v)*inv)
	}
	e := getF64(len(row))
	defer putF64(e)
	expAffine(row, inv, mx, *e)
	acc := *e
	for i := 1; i < len(acc); i++ {
		acc[i] += acc[i-1]
	}
	sum := acc[len(acc)-1]
	for j := range out {
		u := g.altRng.Float64() * sum
		tok := sort.Search(len(acc), func(i int) bool { return acc[i] > u })
		if tok == len(acc) {
			tok = len(acc) - 1
		}
		out[j] = TopEntry{Token: tok, LogProb: float64(row[tok]) - lse}
	}
	return out
}

// Pending is how many sequences are not started yet.
func (g *Gen[T]) Pending() int { return g.n - g.started }

// Done reports whether every sequence has ended.
func (g *Gen[T]) Done() bool { return g.started == g.n && g.running == 0 }

// Positions is the most cache positions one of its sequences may fill (prompt plus
// max_tokens), the bound of its cache's size.
func (g *Gen[T]) Positions() int { return len(g.prompt) + g.p.MaxTokens }

// Start starts the next sequence (the gen must be prefilled and have one pending): it gets
// a copy of the prompt's cache (the last one started takes the cache itself) and samples its
// first token. The sequence may be done at once.
func (g *Gen[T]) Start() *GenSeq[T] {
	i := g.started
	s := &GenSeq[T]{g: g, i: i, rng: rand.New(rand.NewPCG(g.seed, uint64(i)+0x5851f42d4c957f2d))}
	g.started++
	if g.started == g.n {
		s.cache, g.base = g.base, nil
	} else {
		s.cache = g.base.Clone()
	}
	g.running++
	if g.p.Constraint != nil {
		s.cstate = g.p.Constraint.Start()
	}
	if g.p.PresencePenalty != 0 || g.p.FrequencyPenalty != 0 {
		s.counts = map[int]int{}
	}
	s.advance(g.last)
	if g.started == g.n {
		g.last = nil
	}
	return s
}

// Done reports whether the sequence has ended.
func (s *GenSeq[T]) Done() bool { return s.done }

// Gen returns the generation the sequence belongs to.
func (s *GenSeq[T]) Gen() *Gen[T] { return s.g }

// advance samples the sequence's next token from logits and ends it on a stop token, a stop
// string or max_tokens.
func (s *GenSeq[T]) advance(logits []T) {
	if s.g.p.adjusts() {
		logits = append([]T(nil), logits...) // the prompt's logits serve every sequence
		if !s.adjustLogits(logits) {
			s.end()
			return
		}
	}
	tok, lp, top := sampleToken(logits, s.g.p, s.rng)
	s.record(tok, lp, top)
}

// end ends the sequence without a token, unfinished: its constraint allows none (a
// vocabulary that cannot spell what must come next).
func (s *GenSeq[T]) end() {
	s.done, s.cache = true, nil
	s.g.running--
}

// record appends a drawn token to the sequence's output, tells OnToken, and ends the
// sequence at a stop or at max_tokens.
func (s *GenSeq[T]) record(tok int, lp float64, top []TopEntry) {
	g, p := s.g, &s.g.p
	out := &g.Out[s.i]
	out.Tokens = append(out.Tokens, tok)
	out.LogProbs = append(out.LogProbs, lp)
	if p.TopLogprobs > 0 {
		out.Top = append(out.Top, top)
	}
	if g.OnToken != nil {
		g.OnToken(s.i, tok, lp, top)
	}
	if p.Constraint != nil {
		s.cstate = p.Constraint.Next(s.cstate, tok)
	}
	if s.counts != nil {
		s.counts[tok]++
	}
	switch {
	case g.stops[tok]:
		out.Stopped = true
	case len(p.StopStrings) > 0 && p.Decode != nil && containsAny(p.Decode(out.Tokens), p.StopStrings):
		out.Stopped = true
	case len(out.Tokens) < p.MaxTokens:
		return
	}
	s.done, s.cache = true, nil
	g.running--
}

func containsAny(text string, subs []string) bool {
	for _, st := range subs {
		if st != "" && strings.Contains(text, st) {
			return true
		}
	}
	return false
}

// Decode runs one decoding step for every sequence of seqs that is not done, whatever
// generation, adapter and position each is at: one forward pass over all of them (the
// base model's products shared, each adapter's LoRA terms on its own rows, each sequence
// attending to its own cache), then each samples its next token. Every row is computed
// independently of the others (step's stable products), so a sequence gets the same bits
// in any batch, with any number of threads.
func (m *Model[T]) Decode(seqs []*GenSeq[T]) {
	buf := getStepBuf[T]()
	defer decodeBufs.Put(buf)
	rows, ads := buf.rows[:0], buf.ads[:0]
	for _, s := range seqs {
		if s.done {
			continue
		}
		rows = append(rows, s)
		if !slices.Contains(ads, s.g.ad) {
			ads = append(ads, s.g.ad)
		}
	}
	defer func() { // the buffer holds no sequence or adapter once the step is over
		clear(rows)
		clear(ads)
		buf.rows, buf.ads = rows[:0], ads[:0]
	}()
	if len(rows) == 0 {
		return
	}
	// group the rows by adapter: one segment each
	slices.SortStableFunc(rows, func(a, b *GenSeq[T]) int {
		return slices.Index(ads, a.g.ad) - slices.Index(ads, b.g.ad)
	})
	M := len(rows)
	toks, pos := growInts(&buf.toks, M), growInts(&buf.pos, M)
	if cap(buf.caches) < M {
		buf.caches = make([]*KVCache[T], M, 2*M)
	}
	caches := buf.caches[:M]
	segs := buf.segs[:0]
	for r, s := range rows {
		out := &s.g.Out[s.i]
		toks[r] = out.Tokens[len(out.Tokens)-1]
		pos[r] = len(s.g.prompt) + len(out.Tokens) - 1
		caches[r] = s.cache
		if len(segs) == 0 || segs[len(segs)-1].ad != s.g.ad {
			segs = append(segs, seg[T]{r, r, s.g.ad})
		}
		segs[len(segs)-1].r1 = r + 1
	}
	h := m.step(toks, pos, caches, segs, prodRows, buf)
	clear(caches)
	V := m.Cfg.Vocab
	lg := grow(buf.logits[:0], M*V)
	buf.logits = lg
	linRows(h, M, &m.Head, m.packedWeights().pack(-1, 0), segs, -1, 0, lg, &buf.xa)
	clear(segs)
	buf.segs = segs[:0]
	// the draws over the threads (each row its own logits and random stream), then the
	// bookkeeping in order (OnToken and a generation's counters are not shared-safe)
	if cap(buf.drawn) < M {
		buf.drawn = make([]drawnToken, M, 2*M)
	}
	drawn := buf.drawn[:M]
	parallelFor(M, M*V*expWork, func(r int) {
		d := &drawn[r]
		row := lg[r*V : (r+1)*V]
		if rows[r].g.p.adjusts() && !rows[r].adjustLogits(row) {
			d.tok = -1
			return
		}
		d.tok, d.lp, d.top = sampleToken(row, rows[r].g.p, rows[r].rng)
	})
	for r, s := range rows {
		if drawn[r].tok < 0 {
			s.end()
			continue
		}
		s.record(drawn[r].tok, drawn[r].lp, drawn[r].top)
	}
	clear(drawn)
	buf.drawn = drawn[:0]
}

// drawnToken is one row's draw in a decoding step.
type drawnToken struct {
	tok int
	lp  float64
	top []TopEntry
}

// decodeBufs holds Decode's work arrays (a *stepBuf[T]) between steps, so a decoding
// step allocates nothing once the batch has reached its size.
var decodeBufs sync.Pool

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
// temperature 1. With p.TopLogprobs > 0 it also returns the most likely tokens of that
// distribution (Sampled.Top).
func sampleToken[T Float](logits []T, p SampleParams, r *rand.Rand) (int, float64, []TopEntry) {
	if p.Temperature <= 0 {
		best := 0
		for i, v := range logits {
			if v > logits[best] {
				best = i
			}
		}
		lse := logSumExp(logits)
		var top []TopEntry
		if p.TopLogprobs > 0 {
			for _, t := range topIndices(logits, p.TopLogprobs) {
				top = append(top, TopEntry{Token: t, LogProb: float64(logits[t]) - lse})
			}
		}
		return best, float64(logits[best]) - lse, finite(top)
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
		e := getF64(V)
		defer putF64(e)
		expAffine(logits, inv, mx, *e)
		var sum float64
		for _, x := range *e {
			sum += x
		}
		u := r.Float64() * sum
		var acc float64
		tok := V - 1
		for i, x := range *e {
			acc += x
			if acc > u {
				tok = i
				break
			}
		}
		var top []TopEntry
		if p.TopLogprobs > 0 {
			for _, t := range topIndices(logits, p.TopLogprobs) {
				top = append(top, TopEntry{Token: t, LogProb: float64(logits[t])*inv - mx - math.Log(sum)})
			}
		}
		return tok, float64(logits[tok])*inv - mx - math.Log(sum), finite(top)
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
	var top []TopEntry
	for i := range min(p.TopLogprobs, len(cand)) {
		top = append(top, TopEntry{Token: cand[i], LogProb: math.Log(w[i] / sum)})
	}
	return cand[pick], math.Log(w[pick] / sum), finite(top)
}

// finite drops the entries of top with log-prob −∞ (tokens adjustLogits removed).
func finite(top []TopEntry) []TopEntry {
	return slices.DeleteFunc(top, func(e TopEntry) bool { return math.IsInf(e.LogProb, -1) })
}
