package nn

import (
	"math"
	"sync"
)

// Seq is one training sequence: the model input, the adapter its rows use (nil for the
// base model) and K targets per position (Targets is row-major N×K).
type Seq[T Float] struct {
	Tokens  []int
	Adapter *Adapter[T]
	Targets []int
	K       int
}

// TokenLoss gives the loss of target k at position pos of sequence s from its learner
// log-probability lp, and the derivative of that loss with respect to lp. It is called
// from several goroutines at once (for different positions).
type TokenLoss func(s, pos, k int, lp float64) (loss, dlp float64)

// Output holds one sequence's results: LogProbs (N×K) and the per-position loss (N).
type Output struct {
	LogProbs []float64
	Loss     []float64
}

type layerAct[T Float] struct {
	xIn, h1, inv1     []T
	qRaw, kRaw        []T // before q/k norm (Qwen3)
	qInv, kInv        []T
	q, k, v, lse, att []T
	xMid, h2, inv2    []T
	g, u, act         []T
	oRaw, oInv        []T // the attention output before its post-norm (Gemma 3)
	dnRaw, dnInv      []T // the MLP output before its post-norm (Gemma 3)
	xs                [NumLayerTargets][][]T
	moe               *moeAct[T] // a MoE layer's (instead of g, u, act and the MLP's xs)
}

type batchLayout[T Float] struct {
	seqs  []Seq[T]
	off   []int // row offset of each sequence
	pos   []int // position of each row inside its sequence
	segs  []seg[T]
	total int
}

// layout lays the sequences out as rows, reusing b's arrays.
func layout[T Float](seqs []Seq[T], b *batchLayout[T]) *batchLayout[T] {
	total := 0
	for _, s := range seqs {
		total += len(s.Tokens)
	}
	*b = batchLayout[T]{seqs: seqs, off: resize(b.off, len(seqs)), pos: resize(b.pos, total), segs: b.segs[:0]}
	for i, s := range seqs {
		b.off[i] = b.total
		n := len(s.Tokens)
		for p := range n {
			b.pos[b.total+p] = p
		}
		if len(b.segs) > 0 && b.segs[len(b.segs)-1].ad == s.Adapter {
			b.segs[len(b.segs)-1].r1 += n
		} else {
			b.segs = append(b.segs, seg[T]{r0: b.total, r1: b.total + n, ad: s.Adapter})
		}
		b.total += n
	}
	return b
}

// resize returns x with length n, reallocated only when its capacity is short (the
// contents are not kept).
func resize[E any](x []E, n int) []E {
	if cap(x) < n {
		return make([]E, n)
	}
	return x[:n]
}

func layerPick[T Float](l int, t Target) pickFn[T] {
	return func(a *Adapter[T]) *Pair[T] { return a.Layers[l][t] }
}

func headPick[T Float](a *Adapter[T]) *Pair[T] { return a.Head }

// fbArena hands ForwardBackward its work arrays in the order it asks for them and keeps
// them for the next call (through fbArenas): a training step of a shape seen before
// allocates none of them, nor its layout, per-layer records or per-segment lists. Every
// array is cleared when handed out, as make's are. A nil *fbArena allocates each (the
// decoding paths' linFwd).
type fbArena[T Float] struct {
	bufs      [][]T
	next      int
	lists     [][][]T // per-segment lists (linFwd's LoRA inputs)
	nextList  int
	acts      []layerAct[T]
	fwdAct    layerAct[T] // a forward-only pass's current layer
	layout    batchLayout[T]
	rowSeq    []int    // the sequence of each row (head)
	headSegs  []seg[T] // the segments of a chunk of the head's rows
	headTasks headTask[T]
}

func (a *fbArena[T]) get(n int) []T {
	if a == nil {
		return make([]T, n)
	}
	if a.next == len(a.bufs) {
		a.bufs = append(a.bufs, nil)
	}
	b := a.bufs[a.next]
	if cap(b) < n {
		b = make([]T, n)
		a.bufs[a.next] = b
	} else {
		b = b[:n]
		clear(b)
	}
	a.next++
	return b
}

// list returns a cleared list of n arrays.
func (a *fbArena[T]) list(n int) [][]T {
	if a == nil {
		return make([][]T, n)
	}
	if a.nextList == len(a.lists) {
		a.lists = append(a.lists, nil)
	}
	l := resize(a.lists[a.nextList], n)
	clear(l)
	a.lists[a.nextList] = l
	a.nextList++
	return l
}

// reset starts a step; release drops what the arena holds of the caller's (the
// sequences, adapters and arrays it was handed) before it goes back to the pool.
func (a *fbArena[T]) reset() { a.next, a.nextList = 0, 0 }

func (a *fbArena[T]) release() {
	for _, l := range a.lists {
		clear(l)
	}
	clear(a.acts)
	a.fwdAct = layerAct[T]{}
	clear(a.layout.segs[:cap(a.layout.segs)])
	clear(a.headSegs[:cap(a.headSegs)])
	a.layout.seqs = nil
	fbArenas.Put(a)
}

// fbArenas holds *fbArena[T] between training steps.
var fbArenas sync.Pool

// ForwardBackward runs the sequences through the model, computes each target's log-prob
// and loss, and, when backward is set, accumulates the gradient of the summed loss into
// each sequence's adapter. Sequences of different adapters share every matrix product.
// Callers must make sure no other goroutine touches these adapters meanwhile.
func (m *Model[T]) ForwardBackward(seqs []Seq[T], loss TokenLoss, backward bool) []Output {
	c := &m.Cfg
	// A pass takes its work arrays from an arena kept for the next call: a training step
	// keeps every layer's (the backward pass's per-layer ones reused layer after layer), a
	// forward-only pass reuses one layer's arrays for the next layer, and a checkpointed
	// training step (from CheckpointRows rows) keeps each layer's input alone.
	ar := pooled[fbArena[T]](&fbArenas)
	ar.reset()
	defer ar.release()
	b := layout(seqs, &ar.layout)
	var acts []layerAct[T]
	if backward {
		ar.acts = resize(ar.acts, len(m.Layers))
		acts = ar.acts
	}
	get := ar.get
	M, D := b.total, c.Hidden
	QD, KVD, F := m.QDim(), m.KVDim(), c.Inter
	eps := c.Eps
	wp := m.packedWeights() // small models' frozen weights, packed once
	x := get(M * D)
	tokOf := func(i int) int { s := &seqs[ar.rowSeq[i]]; return s.Tokens[b.pos[i]] }
	ar.rowSeq = resize(ar.rowSeq, M)
	embedGrad := false // an adapter's unembedding LoRA also adapts the embedding lookup
	for i, s := range seqs {
		for p := range s.Tokens {
			ar.rowSeq[b.off[i]+p] = i
		}
		embedGrad = embedGrad || (backward && s.Adapter.embedsTied())
	}
	m.embedRows(x, tokOf, M, b.segs)
	posOf := func(i int) int { return b.pos[i] }
	var resid [2][]T // a forward-only pass's residual stream: layer l reads one, writes the other
	if !backward {
		resid = [2][]T{x, get(M * D)}
	}
	// A long training pass checkpoints: it keeps only each layer's input (the residual
	// stream) and recomputes the layer's activations in the backward pass, one layer at a
	// time, with the same code on the same inputs (so the same bits).
	ckpt := backward && m.checkpoints(M)
	var xIn [][]T // with ckpt: each layer's input, then the last layer's output
	if ckpt {
		xIn = ar.list(len(m.Layers) + 1)
		xIn[0] = x
		for l := 1; l <= len(m.Layers); l++ {
			xIn[l] = get(M * D)
		}
	}
	lp := layerPass[T]{m: m, ar: ar, b: b, wp: wp}
	layerNext, layerLists := ar.next, ar.nextList
	for l := range m.Layers {
		a := &ar.fwdAct
		if backward && !ckpt {
			a = &acts[l]
		} else {
			ar.next, ar.nextList = layerNext, layerLists // the previous layer's arrays are done with
		}
		var out []T
		switch {
		case ckpt:
			out = xIn[l+1]
		case backward:
			out = get(M * D)
		default:
			out = resid[(l+1)%2]
		}
		lp.fwd(l, x, a, out)
		x = out
	}
	if ckpt {
		ar.next, ar.nextList = layerNext, layerLists // the head and the backward pass reuse the layers' arrays
	}
	hf, invF := get(M*D), get(M)
	rmsnorm(x, m.Norm, hf, invF, M, D, eps)
	var dhf []T
	if backward {
		dhf = get(M * D)
	}
	outs := m.head(ar, b, hf, loss, dhf)
	if !backward {
		return outs
	}
	dx := get(M * D)
	rmsnormBwd(dhf, x, m.Norm, invF, dx, M, D)
	bwdBase, bwdLists := ar.next, ar.nextList
	for l := len(m.Layers) - 1; l >= 0; l-- {
		ar.next = bwdBase // the previous layer's arrays are done with
		L := &m.Layers[l]
		a := &acts[l]
		if ckpt {
			ar.nextList = bwdLists
			lp.fwd(l, xIn[l], a, get(M*D)) // this layer's activations again (its output unused)
		}
		// MLP: x = xMid + down(act)
		ddn := dx
		if L.PostMLPNorm != nil {
			ddn = get(M * D)
			rmsnormBwd(dx, a.dnRaw, L.PostMLPNorm, a.dnInv, ddn, M, D)
		}
		dh2 := get(M * D)
		if L.MoE != nil {
			m.moeBwd(ar, L.MoE, l, a.moe, M, ddn, dh2)
		} else {
			dact := get(M * F)
			linBwd(ar, ddn, a.act, M, &L.Lin[TDown], wp.packNN(l, TDown), b.segs, layerPick[T](l, TDown), a.xs[TDown], dact, false)
			dg, du := get(M*F), get(M*F)
			m.mlpActBwd(a.g, a.u, dact, dg, du)
			linBwd(ar, dg, a.h2, M, &L.Lin[TGate], wp.packNN(l, TGate), b.segs, layerPick[T](l, TGate), a.xs[TGate], dh2, false)
			linBwd(ar, du, a.h2, M, &L.Lin[TUp], wp.packNN(l, TUp), b.segs, layerPick[T](l, TUp), a.xs[TUp], dh2, true)
		}
		rmsnormBwd(dh2, a.xMid, L.MLPNorm, a.inv2, dx, M, D) // dx is now d(xMid)
		// attention: xMid = xIn + o(att)
		do := dx
		if L.PostAttnNorm != nil {
			do = get(M * D)
			rmsnormBwd(dx, a.oRaw, L.PostAttnNorm, a.oInv, do, M, D)
		}
		datt := get(M * QD)
		linBwd(ar, do, a.att, M, &L.Lin[TO], wp.packNN(l, TO), b.segs, layerPick[T](l, TO), a.xs[TO], datt, false)
		dq, dk, dv := get(M*QD), get(M*KVD), get(M*KVD)
		m.attnBwd(b, a, l, datt, dq, dk, dv)
		cos, sin := m.ropeOf(l)
		rope(dq, M, c.Heads, c.HeadDim, posOf, cos, sin, true)
		rope(dk, M, c.KVHeads, c.HeadDim, posOf, cos, sin, true)
		if L.QNorm != nil {
			dqr, dkr := get(M*QD), get(M*KVD)
			rmsnormBwd(dq, a.qRaw, L.QNorm, a.qInv, dqr, M*c.Heads, c.HeadDim)
			rmsnormBwd(dk, a.kRaw, L.KNorm, a.kInv, dkr, M*c.KVHeads, c.HeadDim)
			dq, dk = dqr, dkr
		}
		dh1 := get(M * D)
		needDX := l > 0 || embedGrad
		linBwd(ar, dq, a.h1, M, &L.Lin[TQ], wp.packNN(l, TQ), b.segs, layerPick[T](l, TQ), a.xs[TQ], dh1, false)
		linBwd(ar, dk, a.h1, M, &L.Lin[TK], wp.packNN(l, TK), b.segs, layerPick[T](l, TK), a.xs[TK], dh1, true)
		linBwd(ar, dv, a.h1, M, &L.Lin[TV], wp.packNN(l, TV), b.segs, layerPick[T](l, TV), a.xs[TV], dh1, true)
		if needDX {
			rmsnormBwd(dh1, a.xIn, L.AttnNorm, a.inv1, dx, M, D)
		}
		acts[l] = layerAct[T]{}
	}
	if embedGrad {
		m.scaleEmbeddings(dx, M) // the lookup's rows were scaled after the LoRA delta
		embedBwd(dx, tokOf, b.segs, D)
	}
	return outs
}

// DefaultCheckpointRows is the number of rows (tokens, all sequences of a pass together)
// from which a training pass checkpoints its layers (Model.CheckpointRows): below it the
// pass keeps every layer's activations; from it on it keeps each layer's input alone and
// recomputes the layer in the backward pass (about a third more arithmetic, and the
// activations of one layer instead of all). 4096 rows of a 28-layer 1024-wide model keep
// about 4.5 GiB of float32 activations without checkpointing, 0.6 GiB with.
const DefaultCheckpointRows = 4096

// checkpoints says whether a training pass over M rows recomputes its layers.
func (m *Model[T]) checkpoints(M int) bool {
	switch n := m.CheckpointRows; {
	case n < 0:
		return false
	case n == 0:
		return M >= DefaultCheckpointRows
	default:
		return M >= n
	}
}

// layerPass runs one decoder layer forward for ForwardBackward (and again, from the
// layer's saved input, in a checkpointed backward pass).
type layerPass[T Float] struct {
	m  *Model[T]
	ar *fbArena[T]
	b  *batchLayout[T]
	wp *weightPacks
}

// fwd runs layer l on x (M×Hidden rows), records its activations in a (arrays from the
// arena) and writes the layer's output into out.
func (p layerPass[T]) fwd(l int, x []T, a *layerAct[T], out []T) {
	m, ar, b, wp := p.m, p.ar, p.b, p.wp
	c := &m.Cfg
	get := ar.get
	M, D := b.total, c.Hidden
	QD, KVD, F := m.QDim(), m.KVDim(), c.Inter
	eps := c.Eps
	L := &m.Layers[l]
	posOf := func(i int) int { return b.pos[i] }
	*a = layerAct[T]{xIn: x}
	a.h1, a.inv1 = get(M*D), get(M)
	rmsnorm(x, L.AttnNorm, a.h1, a.inv1, M, D, eps)
	a.q, a.k, a.v = get(M*QD), get(M*KVD), get(M*KVD)
	a.xs[TQ] = linFwd(ar, a.h1, M, &L.Lin[TQ], wp.pack(l, TQ), b.segs, layerPick[T](l, TQ), a.q)
	a.xs[TK] = linFwd(ar, a.h1, M, &L.Lin[TK], wp.pack(l, TK), b.segs, layerPick[T](l, TK), a.k)
	a.xs[TV] = linFwd(ar, a.h1, M, &L.Lin[TV], wp.pack(l, TV), b.segs, layerPick[T](l, TV), a.v)
	if L.QNorm != nil {
		a.qRaw, a.kRaw = a.q, a.k
		a.q, a.k = get(M*QD), get(M*KVD)
		a.qInv, a.kInv = get(M*c.Heads), get(M*c.KVHeads)
		rmsnorm(a.qRaw, L.QNorm, a.q, a.qInv, M*c.Heads, c.HeadDim, eps)
		rmsnorm(a.kRaw, L.KNorm, a.k, a.kInv, M*c.KVHeads, c.HeadDim, eps)
	}
	cos, sin := m.ropeOf(l)
	rope(a.q, M, c.Heads, c.HeadDim, posOf, cos, sin, false)
	rope(a.k, M, c.KVHeads, c.HeadDim, posOf, cos, sin, false)
	a.att, a.lse = get(M*QD), get(M*c.Heads)
	m.attnFwd(b, a, l)
	o := get(M * D)
	a.xs[TO] = linFwd(ar, a.att, M, &L.Lin[TO], wp.pack(l, TO), b.segs, layerPick[T](l, TO), o)
	if L.PostAttnNorm != nil {
		a.oRaw, a.oInv, o = o, get(M), get(M*D)
		rmsnorm(a.oRaw, L.PostAttnNorm, o, a.oInv, M, D, eps)
	}
	a.xMid = get(M * D)
	for i := range o {
		a.xMid[i] = x[i] + o[i]
	}
	a.h2, a.inv2 = get(M*D), get(M)
	rmsnorm(a.xMid, L.MLPNorm, a.h2, a.inv2, M, D, eps)
	dn := get(M * D)
	if L.MoE != nil {
		a.moe = new(moeAct[T])
		m.moeFwd(ar, L.MoE, l, a.h2, M, b.segs, a.moe, dn)
	} else {
		a.g, a.u, a.act = get(M*F), get(M*F), get(M*F)
		a.xs[TGate] = linFwd(ar, a.h2, M, &L.Lin[TGate], wp.pack(l, TGate), b.segs, layerPick[T](l, TGate), a.g)
		a.xs[TUp] = linFwd(ar, a.h2, M, &L.Lin[TUp], wp.pack(l, TUp), b.segs, layerPick[T](l, TUp), a.u)
		m.mlpAct(a.g, a.u, a.act)
		a.xs[TDown] = linFwd(ar, a.act, M, &L.Lin[TDown], wp.pack(l, TDown), b.segs, layerPick[T](l, TDown), dn)
	}
	if L.PostMLPNorm != nil {
		a.dnRaw, a.dnInv, dn = dn, get(M), get(M*D)
		rmsnorm(a.dnRaw, L.PostMLPNorm, dn, a.dnInv, M, D, eps)
	}
	for i := range dn {
		out[i] = a.xMid[i] + dn[i]
	}
}

// headChunk rows of logits are computed at a time (across sequences): large enough that
// packing the vocabulary-sized lm_head weight (once for the logits, once for their
// gradient) is amortised over many rows, small enough to bound memory.
const headChunk = 256

// head computes logits chunk by chunk, the log-prob of every target and its loss, and,
// when dhf is not nil, back-propagates the loss into dhf and the lm_head LoRA gradients.
// Its work arrays and tables come from ar.
func (m *Model[T]) head(ar *fbArena[T], b *batchLayout[T], hf []T, loss TokenLoss, dhf []T) []Output {
	wp := m.packedWeights()
	D, V := m.Cfg.Hidden, m.Cfg.Vocab
	outs := make([]Output, len(b.seqs))
	t := &ar.headTasks
	ar.rowSeq = resize(ar.rowSeq, b.total)
	*t = headTask[T]{b: b, outs: outs, loss: loss, rowSeq: ar.rowSeq, V: V, backward: dhf != nil}
	for si, s := range b.seqs {
		n := len(s.Tokens)
		outs[si] = Output{LogProbs: make([]float64, n*s.K), Loss: make([]float64, n)}
		for p := range n {
			t.rowSeq[b.off[si]+p] = si
		}
	}
	logits := ar.get(min(headChunk, b.total) * V)
	for r0 := 0; r0 < b.total; r0 += headChunk {
		r1 := min(r0+headChunk, b.total)
		rows := r1 - r0
		ar.headSegs = clipSegs(ar.headSegs[:0], b.segs, r0, r1)
		segs := ar.headSegs
		X := hf[r0*D : r1*D]
		t.r0, t.lgs = r0, logits[:rows*V]
		xs := linFwd(ar, X, rows, &m.Head, wp.pack(-1, 0), segs, headPick[T], t.lgs)
		// rows over the threads: each writes its own logits, log-probs and loss
		parallelRun(rows, rows*V*expWork, t)
		if dhf != nil {
			linBwd(ar, t.lgs, X, rows, &m.Head, wp.packNN(-1, 0), segs, headPick[T], xs, dhf[r0*D:r1*D], false)
		}
	}
	*t = headTask[T]{}
	return outs
}

// headTask is the head's per-row work on one chunk of logits (rows r0…): do(i) takes row
// r0+i's log-probs and loss and, for a backward pass, turns its logits into their
// gradient.
type headTask[T Float] struct {
	b        *batchLayout[T]
	outs     []Output
	loss     TokenLoss
	rowSeq   []int // the sequence of each row
	V        int
	backward bool
	r0       int
	lgs      []T
}

func (t *headTask[T]) do(i int) {
	V := t.V
	si, pos := t.rowSeq[t.r0+i], t.b.pos[t.r0+i]
	s := &t.b.seqs[si]
	out := &t.outs[si]
	lg := t.lgs[i*V : (i+1)*V]
	lse := logSumExp(lg)
	var gsum float64
	var few [16]float64 // the targets' gradients, on the stack for up to 16 targets
	gs := few[:0]
	if s.K > len(few) {
		gs = make([]float64, 0, s.K)
	}
	for k := 0; k < s.K; k++ {
		tg := s.Targets[pos*s.K+k]
		lp := float64(lg[tg]) - lse
		l, g := t.loss(si, pos, k, lp)
		out.LogProbs[pos*s.K+k] = lp
		out.Loss[pos] += l
		gs = append(gs, g)
		gsum += g
	}
	if !t.backward {
		return
	}
	// d lp_k / d logit_v = [v = t_k] − softmax_v
	e := getF64(V)
	expAffine(lg, 1, lse, *e)
	for v, x := range *e {
		lg[v] = T(-gsum * x)
	}
	putF64(e)
	for k, g := range gs {
		lg[s.Targets[pos*s.K+k]] += T(g)
	}
}

// clipSegs appends to out the parts of segs inside rows [r0, r1), numbered from r0.
func clipSegs[T Float](out, segs []seg[T], r0, r1 int) []seg[T] {
	for _, sg := range segs {
		if a, z := max(sg.r0, r0), min(sg.r1, r1); a < z {
			out = append(out, seg[T]{r0: a - r0, r1: z - r0, ad: sg.ad})
		}
	}
	return out
}

// attnFwd computes causal softmax attention for every (sequence, head), saving the
// log-sum-exp of each score row.
func (m *Model[T]) attnFwd(b *batchLayout[T], a *layerAct[T], l int) {
	runPooled(&attnFwdTasks, len(b.seqs)*m.Cfg.Heads/attnPair(&m.Cfg), 1<<30, attnFwdTask[T]{m: m, b: b, a: a, l: l})
}

// attnTask is one attnFwd or attnBwd call (the gradients set for attnBwd).
type attnTask[T Float] struct {
	m                *Model[T]
	b                *batchLayout[T]
	a                *layerAct[T]
	l                int // the layer (its sliding window)
	datt, dq, dk, dv []T
}

// attnPair is how many query heads an attention task takes at once: two when the heads of
// a kv head come in pairs (they share its keys and values, read once for both), else one.
func attnPair(c *Config) int {
	if (c.Heads/c.KVHeads)%2 == 0 {
		return 2
	}
	return 1
}

// attnFwdTask runs attnFwd for task = (sequence, group of attnPair heads).
type attnFwdTask[T Float] attnTask[T]

var attnFwdTasks, attnBwdTasks sync.Pool

// attnScratch holds a task's work rows (f1, f2 and t one per key, f3 one per head
// dimension); tasks take them from attnScratches.
type attnScratch[T Float] struct {
	f1, f2, f3, f4 []float64
	t, t2          []T
}

var attnScratches sync.Pool

// scratch returns work rows for n keys and head size hd, from the pool.
func scratch[T Float](n, hd int) *attnScratch[T] {
	s := pooled[attnScratch[T]](&attnScratches)
	grow := func(x []float64, n int) []float64 {
		if cap(x) < n {
			return make([]float64, n)
		}
		return x[:n]
	}
	s.f1, s.f2, s.f3, s.f4 = grow(s.f1, n), grow(s.f2, n), grow(s.f3, hd), grow(s.f4, hd)
	if cap(s.t) < n {
		s.t = make([]T, n)
	}
	if cap(s.t2) < n {
		s.t2 = make([]T, n)
	}
	s.t, s.t2 = s.t[:n], s.t2[:n]
	return s
}

func (t *attnFwdTask[T]) do(task int) {
	b, a := t.b, t.a
	c := &t.m.Cfg
	H, KH, hd := c.Heads, c.KVHeads, c.HeadDim
	grp := H / KH
	QD, KVD := H*hd, KH*hd
	scale := c.attnScale()
	hp := attnPair(c)
	si, h0 := task/(H/hp), task%(H/hp)*hp
	kh := h0 / grp
	off, n := b.off[si], len(b.seqs[si].Tokens)
	ws := scratch[T](n, hd)
	defer attnScratches.Put(ws)
	for i := 0; i < n; i++ {
		j0 := c.firstKey(t.l, i) // keys j0…i (a sliding window's)
		kv := (off+j0)*KVD + kh*hd
		sc := [2][]float64{ws.f1[:i+1-j0], ws.f2[:i+1-j0]}
		qk := [2][]T{ws.t[:i+1-j0], ws.t2[:i+1-j0]}
		acc := [2][]float64{ws.f3, ws.f4}
		var q [2][]T
		for e := range hp {
			h := h0 + e
			q[e] = a.q[(off+i)*QD+h*hd : (off+i)*QD+(h+1)*hd]
		}
		if hp == 2 {
			dotRows2(qk[0], qk[1], q[0], q[1], a.k[kv:], KVD)
		} else {
			dotRows(qk[0], q[0], a.k[kv:], KVD)
		}
		var lse [2]T
		for e := range hp {
			sc, qk := sc[e], qk[e]
			mx := math.Inf(-1)
			for j := range sc {
				s := float64(qk[j]) * scale
				sc[j] = s
				if s > mx {
					mx = s
				}
			}
			for j := range sc {
				sc[j] -= mx
			}
			expInPlace(sc)
			var sum float64
			for j := range sc {
				sum += sc[j]
			}
			clear(acc[e])
			for j := range sc {
				sc[j] /= sum
			}
			lse[e] = T(mx + math.Log(sum))
		}
		if hp == 2 {
			weightedSum2(acc[0], acc[1], sc[0], sc[1], a.v[kv:], KVD)
		} else {
			weightedSum(acc[0], sc[0], a.v[kv:], KVD)
		}
		for e := range hp {
			h := h0 + e
			o := a.att[(off+i)*QD+h*hd : (off+i)*QD+(h+1)*hd]
			for d := range o {
				o[d] = T(acc[e][d])
			}
			a.lse[(off+i)*H+h] = lse[e]
		}
	}
}

// attnBwd back-propagates datt into dq, dk and dv, recomputing the probabilities from the
// saved log-sum-exp. Tasks are (sequence, kv head) so no two goroutines write one row.
func (m *Model[T]) attnBwd(b *batchLayout[T], a *layerAct[T], l int, datt, dq, dk, dv []T) {
	runPooled(&attnBwdTasks, len(b.seqs)*m.Cfg.KVHeads, 1<<30,
		attnBwdTask[T]{m: m, b: b, a: a, l: l, datt: datt, dq: dq, dk: dk, dv: dv})
}

// attnBwdTask runs attnBwd for task = (sequence, kv head).
type attnBwdTask[T Float] attnTask[T]

func (t *attnBwdTask[T]) do(task int) {
	b, a, datt, dq, dk, dv := t.b, t.a, t.datt, t.dq, t.dk, t.dv
	c := &t.m.Cfg
	H, KH, hd := c.Heads, c.KVHeads, c.HeadDim
	grp := H / KH
	QD, KVD := H*hd, KH*hd
	scale := c.attnScale()
	si, kh := task/KH, task%KH
	off, n := b.off[si], len(b.seqs[si].Tokens)
	ws := scratch[T](n, hd)
	defer attnScratches.Put(ws)
	dqa, pAll, dsAll, dAll := ws.f3, ws.f1, ws.f2, ws.t
	kv0 := off*KVD + kh*hd // this sequence's first key row of this head
	for h := kh * grp; h < (kh+1)*grp; h++ {
		for i := 0; i < n; i++ {
			row := (off + i) * QD
			q := a.q[row+h*hd : row+(h+1)*hd]
			do := datt[row+h*hd : row+(h+1)*hd]
			o := a.att[row+h*hd : row+(h+1)*hd]
			lse := float64(a.lse[(off+i)*H+h])
			var di float64
			for d := range do {
				di += float64(do[d]) * float64(o[d])
			}
			j0 := c.firstKey(t.l, i) // keys j0…i (a sliding window's)
			kv := kv0 + j0*KVD
			p, ds, dots := pAll[:i+1-j0], dsAll[:i+1-j0], dAll[:i+1-j0]
			dotRows(dots, q, a.k[kv:], KVD)
			for j := range p {
				p[j] = float64(dots[j])*scale - lse
			}
			expInPlace(p)
			dotRows(dots, do, a.v[kv:], KVD)
			for j, pj := range p {
				ds[j] = pj * (float64(dots[j]) - di) * scale
			}
			clear(dqa)
			attnGrad(dqa, ds, p, q, do, a.k[kv:], KVD, dk[kv:], dv[kv:])
			dqr := dq[row+h*hd : row+(h+1)*hd]
			for d := range dqr {
				dqr[d] = T(dqa[d])
			}
		}
	}
}
