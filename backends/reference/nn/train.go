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
	xs                [NumLayerTargets][][]T
}

type batchLayout[T Float] struct {
	seqs  []Seq[T]
	off   []int // row offset of each sequence
	pos   []int // position of each row inside its sequence
	segs  []seg[T]
	total int
}

func layout[T Float](seqs []Seq[T]) *batchLayout[T] {
	b := &batchLayout[T]{seqs: seqs, off: make([]int, len(seqs))}
	for i, s := range seqs {
		b.off[i] = b.total
		for p := range s.Tokens {
			b.pos = append(b.pos, p)
		}
		n := len(s.Tokens)
		if len(b.segs) > 0 && b.segs[len(b.segs)-1].ad == s.Adapter {
			b.segs[len(b.segs)-1].r1 += n
		} else {
			b.segs = append(b.segs, seg[T]{r0: b.total, r1: b.total + n, ad: s.Adapter})
		}
		b.total += n
	}
	return b
}

func layerPick[T Float](l int, t Target) pickFn[T] {
	return func(a *Adapter[T]) *Pair[T] { return a.Layers[l][t] }
}

func headPick[T Float](a *Adapter[T]) *Pair[T] { return a.Head }

// fbArena hands ForwardBackward its work arrays in the order it asks for them and keeps
// them for the next call (through fbArenas): a training step of a shape seen before
// allocates none of them. Every array is cleared when handed out, as make's are.
type fbArena[T Float] struct {
	bufs [][]T
	next int
}

func (a *fbArena[T]) get(n int) []T {
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

// fbArenas holds *fbArena[T] between training steps.
var fbArenas sync.Pool

// ForwardBackward runs the sequences through the model, computes each target's log-prob
// and loss, and, when backward is set, accumulates the gradient of the summed loss into
// each sequence's adapter. Sequences of different adapters share every matrix product.
// Callers must make sure no other goroutine touches these adapters meanwhile.
func (m *Model[T]) ForwardBackward(seqs []Seq[T], loss TokenLoss, backward bool) []Output {
	c := &m.Cfg
	b := layout(seqs)
	M, D := b.total, c.Hidden
	QD, KVD, F := m.QDim(), m.KVDim(), c.Inter
	eps := c.Eps
	// A training step takes its work arrays from an arena kept for the next step, the
	// backward pass's per-layer ones reused layer after layer; a forward-only pass lets
	// each layer's go (acts[l] = nil), so it allocates them.
	get := func(n int) []T { return make([]T, n) }
	var ar *fbArena[T]
	if backward {
		ar, _ = fbArenas.Get().(*fbArena[T])
		if ar == nil {
			ar = &fbArena[T]{}
		}
		ar.next = 0
		defer fbArenas.Put(ar)
		get = ar.get
	}
	wp := m.packedWeights() // small models' frozen weights, packed once
	x := get(M * D)
	for i, s := range seqs {
		for p, t := range s.Tokens {
			copy(x[(b.off[i]+p)*D:(b.off[i]+p+1)*D], m.Embed[t*D:(t+1)*D])
		}
	}
	posOf := func(i int) int { return b.pos[i] }
	acts := make([]*layerAct[T], len(m.Layers))
	for l := range m.Layers {
		L := &m.Layers[l]
		a := &layerAct[T]{xIn: x}
		acts[l] = a
		a.h1, a.inv1 = get(M*D), get(M)
		rmsnorm(x, L.AttnNorm, a.h1, a.inv1, M, D, eps)
		a.q, a.k, a.v = get(M*QD), get(M*KVD), get(M*KVD)
		a.xs[TQ] = linFwd(a.h1, M, &L.Lin[TQ], wp.pack(l, TQ), b.segs, layerPick[T](l, TQ), a.q)
		a.xs[TK] = linFwd(a.h1, M, &L.Lin[TK], wp.pack(l, TK), b.segs, layerPick[T](l, TK), a.k)
		a.xs[TV] = linFwd(a.h1, M, &L.Lin[TV], wp.pack(l, TV), b.segs, layerPick[T](l, TV), a.v)
		if L.QNorm != nil {
			a.qRaw, a.kRaw = a.q, a.k
			a.q, a.k = get(M*QD), get(M*KVD)
			a.qInv, a.kInv = get(M*c.Heads), get(M*c.KVHeads)
			rmsnorm(a.qRaw, L.QNorm, a.q, a.qInv, M*c.Heads, c.HeadDim, eps)
			rmsnorm(a.kRaw, L.KNorm, a.k, a.kInv, M*c.KVHeads, c.HeadDim, eps)
		}
		rope(a.q, M, c.Heads, c.HeadDim, posOf, m.cos, m.sin, false)
		rope(a.k, M, c.KVHeads, c.HeadDim, posOf, m.cos, m.sin, false)
		a.att, a.lse = get(M*QD), get(M*c.Heads)
		m.attnFwd(b, a)
		o := get(M * D)
		a.xs[TO] = linFwd(a.att, M, &L.Lin[TO], wp.pack(l, TO), b.segs, layerPick[T](l, TO), o)
		a.xMid = get(M * D)
		for i := range o {
			a.xMid[i] = x[i] + o[i]
		}
		a.h2, a.inv2 = get(M*D), get(M)
		rmsnorm(a.xMid, L.MLPNorm, a.h2, a.inv2, M, D, eps)
		a.g, a.u, a.act = get(M*F), get(M*F), get(M*F)
		a.xs[TGate] = linFwd(a.h2, M, &L.Lin[TGate], wp.pack(l, TGate), b.segs, layerPick[T](l, TGate), a.g)
		a.xs[TUp] = linFwd(a.h2, M, &L.Lin[TUp], wp.pack(l, TUp), b.segs, layerPick[T](l, TUp), a.u)
		swiglu(a.g, a.u, a.act)
		dn := get(M * D)
		a.xs[TDown] = linFwd(a.act, M, &L.Lin[TDown], wp.pack(l, TDown), b.segs, layerPick[T](l, TDown), dn)
		x = get(M * D)
		for i := range dn {
			x[i] = a.xMid[i] + dn[i]
		}
		if !backward {
			acts[l] = nil // keep nothing
		}
	}
	hf, invF := get(M*D), get(M)
	rmsnorm(x, m.Norm, hf, invF, M, D, eps)
	var dhf []T
	if backward {
		dhf = get(M * D)
	}
	outs := m.head(b, hf, loss, dhf)
	if !backward {
		return outs
	}
	dx := get(M * D)
	rmsnormBwd(dhf, x, m.Norm, invF, dx, M, D)
	bwdBase := ar.next
	for l := len(m.Layers) - 1; l >= 0; l-- {
		ar.next = bwdBase // the previous layer's arrays are done with
		L := &m.Layers[l]
		a := acts[l]
		// MLP: x = xMid + down(act)
		dact := get(M * F)
		linBwd(dx, a.act, M, &L.Lin[TDown], wp.packNN(l, TDown), b.segs, layerPick[T](l, TDown), a.xs[TDown], dact, false)
		dg, du := get(M*F), get(M*F)
		swigluBwd(a.g, a.u, dact, dg, du)
		dh2 := get(M * D)
		linBwd(dg, a.h2, M, &L.Lin[TGate], wp.packNN(l, TGate), b.segs, layerPick[T](l, TGate), a.xs[TGate], dh2, false)
		linBwd(du, a.h2, M, &L.Lin[TUp], wp.packNN(l, TUp), b.segs, layerPick[T](l, TUp), a.xs[TUp], dh2, true)
		rmsnormBwd(dh2, a.xMid, L.MLPNorm, a.inv2, dx, M, D) // dx is now d(xMid)
		// attention: xMid = xIn + o(att)
		datt := get(M * QD)
		linBwd(dx, a.att, M, &L.Lin[TO], wp.packNN(l, TO), b.segs, layerPick[T](l, TO), a.xs[TO], datt, false)
		dq, dk, dv := get(M*QD), get(M*KVD), get(M*KVD)
		m.attnBwd(b, a, datt, dq, dk, dv)
		rope(dq, M, c.Heads, c.HeadDim, posOf, m.cos, m.sin, true)
		rope(dk, M, c.KVHeads, c.HeadDim, posOf, m.cos, m.sin, true)
		if L.QNorm != nil {
			dqr, dkr := get(M*QD), get(M*KVD)
			rmsnormBwd(dq, a.qRaw, L.QNorm, a.qInv, dqr, M*c.Heads, c.HeadDim)
			rmsnormBwd(dk, a.kRaw, L.KNorm, a.kInv, dkr, M*c.KVHeads, c.HeadDim)
			dq, dk = dqr, dkr
		}
		dh1 := get(M * D)
		needDX := l > 0
		linBwd(dq, a.h1, M, &L.Lin[TQ], wp.packNN(l, TQ), b.segs, layerPick[T](l, TQ), a.xs[TQ], dh1, false)
		linBwd(dk, a.h1, M, &L.Lin[TK], wp.packNN(l, TK), b.segs, layerPick[T](l, TK), a.xs[TK], dh1, true)
		linBwd(dv, a.h1, M, &L.Lin[TV], wp.packNN(l, TV), b.segs, layerPick[T](l, TV), a.xs[TV], dh1, true)
		if needDX {
			rmsnormBwd(dh1, a.xIn, L.AttnNorm, a.inv1, dx, M, D)
		}
		acts[l] = nil
	}
	return outs
}

// headChunk rows of logits are computed at a time (across sequences): large enough that
// packing the vocabulary-sized lm_head weight (once for the logits, once for their
// gradient) is amortised over many rows, small enough to bound memory.
const headChunk = 256

// head computes logits chunk by chunk, the log-prob of every target and its loss, and,
// when dhf is not nil, back-propagates the loss into dhf and the lm_head LoRA gradients.
func (m *Model[T]) head(b *batchLayout[T], hf []T, loss TokenLoss, dhf []T) []Output {
	wp := m.packedWeights()
	D, V := m.Cfg.Hidden, m.Cfg.Vocab
	outs := make([]Output, len(b.seqs))
	seqOf := make([]int, b.total) // the sequence of each row
	for si, s := range b.seqs {
		n := len(s.Tokens)
		outs[si] = Output{LogProbs: make([]float64, n*s.K), Loss: make([]float64, n)}
		for p := range n {
			seqOf[b.off[si]+p] = si
		}
	}
	logits := make([]T, min(headChunk, b.total)*V)
	for r0 := 0; r0 < b.total; r0 += headChunk {
		r1 := min(r0+headChunk, b.total)
		rows := r1 - r0
		segs := clipSegs(b.segs, r0, r1)
		X := hf[r0*D : r1*D]
		lgs := logits[:rows*V]
		xs := linFwd(X, rows, &m.Head, wp.pack(-1, 0), segs, headPick[T], lgs)
		// rows over the threads: each writes its own logits, log-probs and loss
		parallelFor(rows, rows*V*expWork, func(i int) {
			si, pos := seqOf[r0+i], b.pos[r0+i]
			s := &b.seqs[si]
			lg := lgs[i*V : (i+1)*V]
			lse := logSumExp(lg)
			var gsum float64
			gs := make([]float64, s.K)
			for k := 0; k < s.K; k++ {
				t := s.Targets[pos*s.K+k]
				lp := float64(lg[t]) - lse
				l, g := loss(si, pos, k, lp)
				outs[si].LogProbs[pos*s.K+k] = lp
				outs[si].Loss[pos] += l
				gs[k] = g
				gsum += g
			}
			if dhf == nil {
				return
			}
			// d lp_k / d logit_v = [v = t_k] − softmax_v
			e := getF64(V)
			expAffine(lg, 1, lse, *e)
			for v, x := range *e {
				lg[v] = T(-gsum * x)
			}
			putF64(e)
			for k := 0; k < s.K; k++ {
				lg[s.Targets[pos*s.K+k]] += T(gs[k])
			}
		})
		if dhf != nil {
			linBwd(lgs, X, rows, &m.Head, wp.packNN(-1, 0), segs, headPick[T], xs, dhf[r0*D:r1*D], false)
		}
	}
	return outs
}

// clipSegs returns the parts of segs inside rows [r0, r1), numbered from r0.
func clipSegs[T Float](segs []seg[T], r0, r1 int) []seg[T] {
	var out []seg[T]
	for _, sg := range segs {
		if a, z := max(sg.r0, r0), min(sg.r1, r1); a < z {
			out = append(out, seg[T]{r0: a - r0, r1: z - r0, ad: sg.ad})
		}
	}
	return out
}

// attnFwd computes causal softmax attention for every (sequence, head), saving the
// log-sum-exp of each score row.
func (m *Model[T]) attnFwd(b *batchLayout[T], a *layerAct[T]) {
	c := &m.Cfg
	H, KH, hd := c.Heads, c.KVHeads, c.HeadDim
	grp := H / KH
	QD, KVD := H*hd, KH*hd
	scale := 1 / math.Sqrt(float64(hd))
	nTasks := len(b.seqs) * H
	parallelFor(nTasks, 1<<30, func(task int) {
		si, h := task/H, task%H
		kh := h / grp
		off, n := b.off[si], len(b.seqs[si].Tokens)
		sc := make([]float64, n)
		qk := make([]T, n)
		acc := make([]float64, hd)
		for i := 0; i < n; i++ {
			q := a.q[(off+i)*QD+h*hd : (off+i)*QD+(h+1)*hd]
			dotRows(qk[:i+1], q, a.k[off*KVD+kh*hd:], KVD)
			mx := math.Inf(-1)
			for j := 0; j <= i; j++ {
				s := float64(qk[j]) * scale
				sc[j] = s
				if s > mx {
					mx = s
				}
			}
			for j := 0; j <= i; j++ {
				sc[j] -= mx
			}
			expInPlace(sc[:i+1])
			var sum float64
			for j := 0; j <= i; j++ {
				sum += sc[j]
			}
			clear(acc)
			for j := 0; j <= i; j++ {
				sc[j] /= sum
			}
			weightedSum(acc, sc[:i+1], a.v[off*KVD+kh*hd:], KVD)
			o := a.att[(off+i)*QD+h*hd : (off+i)*QD+(h+1)*hd]
			for d := range o {
				o[d] = T(acc[d])
			}
			a.lse[(off+i)*H+h] = T(mx + math.Log(sum))
		}
	})
}

// attnBwd back-propagates datt into dq, dk and dv, recomputing the probabilities from the
// saved log-sum-exp. Tasks are (sequence, kv head) so no two goroutines write one row.
func (m *Model[T]) attnBwd(b *batchLayout[T], a *layerAct[T], datt, dq, dk, dv []T) {
	c := &m.Cfg
	H, KH, hd := c.Heads, c.KVHeads, c.HeadDim
	grp := H / KH
	QD, KVD := H*hd, KH*hd
	scale := 1 / math.Sqrt(float64(hd))
	parallelFor(len(b.seqs)*KH, 1<<30, func(task int) {
		si, kh := task/KH, task%KH
		off, n := b.off[si], len(b.seqs[si].Tokens)
		dqa := make([]float64, hd)
		pAll, dsAll, dAll := make([]float64, n), make([]float64, n), make([]T, n)
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
				p, ds, dots := pAll[:i+1], dsAll[:i+1], dAll[:i+1]
				dotRows(dots, q, a.k[kv0:], KVD)
				for j := range p {
					p[j] = float64(dots[j])*scale - lse
				}
				expInPlace(p)
				dotRows(dots, do, a.v[kv0:], KVD)
				for j, pj := range p {
					ds[j] = pj * (float64(dots[j]) - di) * scale
				}
				clear(dqa)
				attnGrad(dqa, ds, p, q, do, a.k[kv0:], KVD, dk[kv0:], dv[kv0:])
				dqr := dq[row+h*hd : row+(h+1)*hd]
				for d := range dqr {
					dqr[d] = T(dqa[d])
				}
			}
		}
	})
}
