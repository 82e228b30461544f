package nn

import "math"

// KVCache holds the keys and values of one sequence for every layer.
type KVCache[T Float] struct {
	K, V [][]T // per layer, N×KVDim
	N    int   // positions filled
}

// NewCache returns an empty cache for m.
func (m *Model[T]) NewCache() *KVCache[T] {
	return &KVCache[T]{K: make([][]T, len(m.Layers)), V: make([][]T, len(m.Layers))}
}

// Clone copies the cache.
func (c *KVCache[T]) Clone() *KVCache[T] {
	o := &KVCache[T]{K: make([][]T, len(c.K)), V: make([][]T, len(c.V)), N: c.N}
	for l := range c.K {
		o.K[l] = append(make([]T, 0, cap(c.K[l])), c.K[l]...)
		o.V[l] = append(make([]T, 0, cap(c.V[l])), c.V[l]...)
	}
	return o
}

func grow[T Float](s []T, n int) []T {
	if len(s) >= n {
		return s
	}
	if cap(s) >= n {
		return s[:n]
	}
	ns := make([]T, n, max(n, 2*cap(s)))
	copy(ns, s)
	return ns
}

// Step runs M rows through the model without saving activations: row i is token toks[i]
// at position pos[i] of caches[i], whose keys and values it appends. Rows of one cache
// must come in increasing positions. It returns the final normalised hidden states [M, D].
func (m *Model[T]) Step(toks, pos []int, caches []*KVCache[T], ad *Adapter[T]) []T {
	return m.step(toks, pos, caches, []seg[T]{{0, len(toks), ad}}, prodFwd, nil)
}

// prodMode is how step multiplies its rows by the weights.
type prodMode uint8

const (
	// prodFwd is linFwd's products (Step): the packed or blocked SGEMM, or for at most
	// smallM rows the dot kernel, whose bits differ.
	prodFwd prodMode = iota
	// prodRows is linRows' products: each row's result depends on that row alone (not on
	// how many rows run with it, nor on their place in the batch), so batched decoding gives
	// every sequence the bits it would get decoding alone.
	prodRows
	// prodWide is prodFwd's SGEMM for any number of rows (linWide): a row gets the bits it
	// gets from prodFwd in a product of more than smallM rows, however few rows run with it.
	// Long prompt chunks run this way, so that a chunk run in pieces of any size (sampling
	// under load: batch.go) gives the bits of the whole chunk.
	prodWide
)

// step is Step with one adapter per segment of rows and the products of mode. Its work
// arrays come from buf when it is not nil (the result then lives in buf until its next
// use).
func (m *Model[T]) step(toks, pos []int, caches []*KVCache[T], segs []seg[T], mode prodMode, buf *stepBuf[T]) []T {
	c := &m.Cfg
	M, D := len(toks), c.Hidden
	H, KH, hd := c.Heads, c.KVHeads, c.HeadDim
	QD, KVD, F := m.QDim(), m.KVDim(), c.Inter
	if buf == nil {
		buf = &stepBuf[T]{}
	}
	wp := m.packedWeights()
	lin := func(X []T, li *Linear[T], l int, t Target, Y []T) {
		switch mode {
		case prodRows:
			linRows(X, M, li, wp.pack(l, t), segs, l, t, Y, &buf.xa)
		case prodWide:
			linWide(X, M, li, wp.pack(l, t), segs, l, t, Y, &buf.xa)
		default:
			linFwd(nil, X, M, li, wp.pack(l, t), segs, layerPick[T](l, t), Y)
		}
	}
	x := grow(buf.x[:0], M*D)
	m.embedRows(x, func(i int) int { return toks[i] }, M, segs)
	posOf := func(i int) int { return pos[i] }
	h := grow(buf.h[:0], M*D)
	q, k, v := grow(buf.q[:0], M*QD), grow(buf.k[:0], M*KVD), grow(buf.v[:0], M*KVD)
	att := grow(buf.att[:0], M*QD)
	o := grow(buf.o[:0], M*D)
	g, u := grow(buf.g[:0], M*F), grow(buf.u[:0], M*F)
	buf.x, buf.h, buf.q, buf.k, buf.v, buf.att, buf.o, buf.g, buf.u = x, h, q, k, v, att, o, g, u
	// the attention scores: task (i, head) uses H·Σ_{i'<i} n_i' + head·n_i, n_i = pos[i]+1
	scOff := growInts(&buf.scOff, M+1)
	scOff[0] = 0
	for i := range M {
		scOff[i+1] = scOff[i] + H*(pos[i]+1)
	}
	scAll := growF64(&buf.sc, scOff[M])
	dAll := grow(buf.dots[:0], scOff[M]) // the scores' dot products, laid out like scAll
	buf.dots = dAll
	scale := c.attnScale()
	for l := range m.Layers {
		L := &m.Layers[l]
		rmsnorm(x, L.AttnNorm, h, nil, M, D, c.Eps)
		lin(h, &L.Lin[TQ], l, TQ, q)
		lin(h, &L.Lin[TK], l, TK, k)
		lin(h, &L.Lin[TV], l, TV, v)
		if L.QNorm != nil {
			rmsnorm(q, L.QNorm, q, nil, M*H, hd, c.Eps)
			rmsnorm(k, L.KNorm, k, nil, M*KH, hd, c.Eps)
		}
		cos, sin := m.ropeOf(l)
		rope(q, M, H, hd, posOf, cos, sin, false)
		rope(k, M, KH, hd, posOf, cos, sin, false)
		for i := 0; i < M; i++ {
			cc := caches[i]
			need := (pos[i] + 1) * KVD
			cc.K[l] = grow(cc.K[l], need)
			cc.V[l] = grow(cc.V[l], need)
			copy(cc.K[l][pos[i]*KVD:need], k[i*KVD:(i+1)*KVD])
			copy(cc.V[l][pos[i]*KVD:need], v[i*KVD:(i+1)*KVD])
			if pos[i]+1 > cc.N {
				cc.N = pos[i] + 1
			}
		}
		// tasks (pair of heads, row): the two query heads of a pair share their kv head
		// (hp = 2 when the group size is even), so its keys and values are read once for
		// both; each head's scores and sums are those it gets alone. Consecutive tasks
		// take the rows of one pair in turn, so the keys and values they read (a prompt's
		// rows share them) stay in cache from one task to the next.
		grp := H / KH
		hp := 1
		if grp%2 == 0 {
			hp = 2
		}
		// A prompt chunk's rows (one cache, many rows) read their keys and values from a
		// head-major copy (kh, position, lane): a kv head's rows then lie hd apart, not KVD,
		// and stay in L2 from one task to the next (rows KVD·4 bytes apart, a multiple of
		// 4 KiB, fall into a few of its sets). Same values, same kernels: same bits.
		// With a pair of heads and a kernel for it (wideValues), that copy of the values
		// is widened to float64 as it is made: once per layer rather than once per row
		// that reads it (float64 of a float32 is exact: same sums, same bits).
		ldkv := KVD
		nkv := 0 // positions in the head-major copy (0: none)
		wide := false
		if M >= headMajorRows && oneCache(caches) {
			cc := caches[0]
			nkv = pos[M-1] + 1 // rows of one cache come in increasing positions
			wide = hp == 2 && wideValues(hd)
			buf.kT = grow(buf.kT[:0], nkv*KVD)
			headMajor(buf.kT, cc.K[l][:nkv*KVD], nkv, KH, hd)
			if wide {
				headMajor(growF64(&buf.vW, nkv*KVD), cc.V[l][:nkv*KVD], nkv, KH, hd)
			} else {
				buf.vT = grow(buf.vT[:0], nkv*KVD)
				headMajor(buf.vT, cc.V[l][:nkv*KVD], nkv, KH, hd)
			}
			ldkv = hd
		}
		parallelFor(M*H/hp, M*H*(pos[M-1]+1)*hd*2, func(task int) {
			i, hh := task%M, task/M*hp
			kh := hh / grp
			cc := caches[i]
			n := pos[i] + 1
			j0 := c.firstKey(l, pos[i]) // keys j0…pos[i] (a sliding window's)
			kv := j0*KVD + kh*hd
			kc, vc := cc.K[l], cc.V[l]
			if nkv > 0 {
				kv = kh*nkv*hd + j0*hd
				kc, vc = buf.kT, buf.vT
			}
			var sc [2][]float64
			var qk, qr [2][]T
			for e := range hp {
				h := hh + e
				qr[e] = q[i*QD+h*hd : i*QD+(h+1)*hd]
				sc[e] = scAll[scOff[i]+h*n+j0 : scOff[i]+(h+1)*n]
				qk[e] = dAll[scOff[i]+h*n+j0 : scOff[i]+(h+1)*n]
			}
			if hp == 2 {
				dotRows2(qk[0], qk[1], qr[0], qr[1], kc[kv:], ldkv)
			} else {
				dotRows(qk[0], qr[0], kc[kv:], ldkv)
			}
			var accBuf [2][256]float64
			var acc [2][]float64
			for e := range hp {
				if hd <= len(accBuf[e]) {
					acc[e] = accBuf[e][:hd]
				} else {
					acc[e] = make([]float64, hd)
				}
			}
			if hp == 2 {
				softmax2(sc[0], sc[1], qk[0], qk[1], scale)
			} else {
				sc, qk := sc[0], qk[0]
				mx := maxScaled(sc, qk, scale)
				for j := range sc {
					sc[j] -= mx
				}
				expInPlace(sc)
				var sum float64
				for j := range sc {
					sum += sc[j]
				}
				divBy(sc, sum)
			}
			switch {
			case wide:
				weightedSum2W(acc[0], acc[1], sc[0], sc[1], buf.vW[kv:], ldkv)
			case hp == 2:
				weightedSum2(acc[0], acc[1], sc[0], sc[1], vc[kv:], ldkv)
			default:
				weightedSum(acc[0], sc[0], vc[kv:], ldkv)
			}
			for e := range hp {
				out := att[i*QD+(hh+e)*hd : i*QD+(hh+e+1)*hd]
				for d := range out {
					out[d] = T(acc[e][d])
				}
			}
		})
		lin(att, &L.Lin[TO], l, TO, o)
		if L.PostAttnNorm != nil {
			rmsnorm(o, L.PostAttnNorm, o, nil, M, D, c.Eps)
		}
		for i := range x {
			x[i] += o[i]
		}
		rmsnorm(x, L.MLPNorm, h, nil, M, D, c.Eps)
		if L.MoE != nil {
			m.moeStep(L.MoE, l, h, M, segs, mode, o)
		} else {
			lin(h, &L.Lin[TGate], l, TGate, g)
			lin(h, &L.Lin[TUp], l, TUp, u)
			m.mlpAct(g, u, g)
			lin(g, &L.Lin[TDown], l, TDown, o)
		}
		if L.PostMLPNorm != nil {
			rmsnorm(o, L.PostMLPNorm, o, nil, M, D, c.Eps)
		}
		for i := range x {
			x[i] += o[i]
		}
	}
	rmsnorm(x, m.Norm, h, nil, M, D, c.Eps)
	return h
}

// softmax2 sets sc0 and sc1 to the softmax of scale·qk0 and scale·qk1 (len(sc1) =
// len(sc0)), each with the bits of the one-head loop in step: the maximum, the
// differences, their exponentials, their sum in order, the quotients. The two sums run in
// one loop (two chains of adds in flight, each in its own order).
func softmax2[T Float](sc0, sc1 []float64, qk0, qk1 []T, scale float64) {
	mx0, mx1 := maxScaled(sc0, qk0, scale), maxScaled(sc1, qk1, scale)
	sc1 = sc1[:len(sc0)]
	for j := range sc0 {
		sc0[j] -= mx0
		sc1[j] -= mx1
	}
	expInPlace(sc0)
	expInPlace(sc1)
	var s0, s1 float64
	for j, v := range sc0 {
		s0 += v
		s1 += sc1[j]
	}
	divBy(sc0, s0)
	divBy(sc1, s1)
}

// headMajorRows is the least number of rows of one cache for which step's attention reads
// a head-major copy of the keys and values (copying them costs about what one row's
// attention reads).
const headMajorRows = 16

// oneCache says whether every row's cache is the first row's.
func oneCache[T Float](caches []*KVCache[T]) bool {
	for _, c := range caches {
		if c != caches[0] {
			return false
		}
	}
	return true
}

// headMajor writes the n rows of src (kh heads of hd lanes a row) to dst head by head,
// converted to dst's type: dst[(h·n + j)·hd + d] = src[j·kh·hd + h·hd + d].
func headMajor[T, U Float](dst []U, src []T, n, kh, hd int) {
	if d, ok := any(dst).([]T); ok {
		for j := range n {
			row := src[j*kh*hd : (j+1)*kh*hd]
			for h := range kh {
				copy(d[(h*n+j)*hd:(h*n+j+1)*hd], row[h*hd:(h+1)*hd])
			}
		}
		return
	}
	for j := range n {
		row := src[j*kh*hd : (j+1)*kh*hd]
		for h := range kh {
			d := dst[(h*n+j)*hd : (h*n+j+1)*hd]
			for e, v := range row[h*hd : (h+1)*hd][:len(d)] {
				d[e] = U(v)
			}
		}
	}
}

// maxScaled sets sc[j] = float64(qk[j])·scale and returns what max over them (from -Inf)
// returns for the softmax: NaN if one is NaN; a zero maximum may come back as -0 where max
// gives +0, which changes no sc[j] - mx that follows but the sign of a zero, and no
// exponential of it. Unlike the builtin, the comparison is one branch a score.
func maxScaled[T Float](sc []float64, qk []T, scale float64) float64 {
	mx, nan := math.Inf(-1), false
	qk = qk[:len(sc)]
	for j, v := range qk {
		s := float64(v) * scale
		sc[j] = s
		if s > mx {
			mx = s
		} else if s != s {
			nan = true
		}
	}
	if nan {
		return math.NaN()
	}
	return mx
}

// Logits computes the vocabulary logits [M, V] of M final hidden states.
func (m *Model[T]) Logits(h []T, M int, ad *Adapter[T]) []T {
	out := make([]T, M*m.Cfg.Vocab)
	linFwd(nil, h, M, &m.Head, m.packedWeights().pack(-1, 0), []seg[T]{{0, M, ad}}, headPick[T], out)
	return out
}

// linRows is linFwd (without the saved LoRA inputs) through matMulTRows, or through
// sgemmNTPacked when pk packs li's weight: each output row depends only on its input row
// and its segment's adapter. The adapter's pair is layer l's target t (the head's when
// l < 0); xa is scratch for the LoRA rows.
func linRows[T Float](X []T, M int, li *Linear[T], pk *packedNT, segs []seg[T], l int, t Target, Y []T, xa *[]T) {
	switch {
	case packs16(pk, li, false):
		sgemmNTPacked(any(Y).([]float32), any(X).([]float32), pk, M, false)
	case li.W16 != nil && M > 0 && activeKernel.fn != nil && activeKernel.dot != nil:
		sgemmNTRows(activeKernel, any(Y).([]float32), any(X).([]float32), nil, li.W16, M, li.Out, li.In, false)
	case li.W16 != nil:
		withWeights(li, func(w []T) { matMulTRows(Y, X, w, M, li.Out, li.In, false) })
	case packs(pk, li.W, li.Out, li.In, false):
		sgemmNTPacked(any(Y).([]float32), any(X).([]float32), pk, M, false)
	default:
		matMulTRows(Y, X, li.W, M, li.Out, li.In, false)
	}
	linLoRA(X, M, li, segs, l, t, Y, xa, matMulTRows[T])
}

// linWide is linFwd (without the saved LoRA inputs) with every product through
// matMulTWide: each output row gets the bits linFwd gives it in a product of more than
// smallM rows, however many rows run (prodWide).
func linWide[T Float](X []T, M int, li *Linear[T], pk *packedNT, segs []seg[T], l int, t Target, Y []T, xa *[]T) {
	linMatMulTWide(pk, Y, X, li, M)
	linLoRA(X, M, li, segs, l, t, Y, xa, matMulTWideUnpacked[T])
}

// linLoRA adds li's bias and each segment's LoRA terms (layer l's target t, the head's when
// l < 0) to the M rows of Y = X·Wᵀ, the products through mul; xa is scratch for the LoRA
// rows.
func linLoRA[T Float](X []T, M int, li *Linear[T], segs []seg[T], l int, t Target, Y []T, xa *[]T, mul func(C, A, B []T, M, N, K int, acc bool)) {
	if li.B != nil {
		for i := 0; i < M; i++ {
			y := Y[i*li.Out : (i+1)*li.Out]
			for j, b := range li.B {
				y[j] += b
			}
		}
	}
	for _, sg := range segs {
		if sg.ad == nil || sg.r1 == sg.r0 {
			continue
		}
		p := sg.ad.Head
		if l >= 0 {
			p = sg.ad.Layers[l][t]
		}
		if p == nil {
			continue
		}
		rows := sg.r1 - sg.r0
		*xa = grow((*xa)[:0], rows*p.Rank)
		x := *xa
		mul(x, X[sg.r0*li.In:sg.r1*li.In], p.A.W, rows, p.Rank, li.In, false)
		s := sg.ad.Scale
		for i := range x {
			x[i] *= s
		}
		mul(Y[sg.r0*li.Out:sg.r1*li.Out], x, p.B.W, rows, li.Out, p.Rank, true)
	}
}

// stepBuf holds the work arrays of step and Decode between calls (see decodeBufs).
type stepBuf[T Float] struct {
	x, h, q, k, v, att, o, g, u, xa, logits []T
	dots                                    []T
	kT, vT                                  []T       // head-major keys and values (step)
	vW                                      []float64 // head-major values widened (step)
	sc                                      []float64
	scOff                                   []int
	toks, pos                               []int
	rows                                    []*GenSeq[T]
	ads                                     []*Adapter[T]
	caches                                  []*KVCache[T]
	segs                                    []seg[T]
	drawn                                   []drawnToken
}

func growInts(s *[]int, n int) []int {
	if cap(*s) < n {
		*s = make([]int, n, 2*n)
	}
	*s = (*s)[:n]
	return *s
}

func growF64(s *[]float64, n int) []float64 {
	if cap(*s) < n {
		*s = make([]float64, n, 2*n)
	}
	*s = (*s)[:n]
	return *s
}

// matMulTRows computes C[M,N] (+)= A[M,K]·B[N,K]ᵀ like MatMulT, but row by row: every
// element of row i is summed in an order that depends on N and K only, never on M or i
// (float32 with a vector kernel: the unpacked dot kernel of sgemmNTSmall for any M;
// otherwise the generic blocked kernel, whose rows are independent). It is the decode
// path's product: with the row kernels and B read once per step, faster than packing
// up to a few dozen rows (BenchmarkDecodeProducts).
func matMulTRows[T Float](C, A, B []T, M, N, K int, acc bool) {
	if M == 0 || N == 0 {
		return
	}
	_ = A[M*K-1]
	_ = B[N*K-1]
	_ = C[M*N-1]
	if c, ok := any(C).([]float32); ok && activeKernel.fn != nil && activeKernel.dot != nil {
		sgemmNTRows(activeKernel, c, any(A).([]float32), any(B).([]float32), nil, M, N, K, acc)
		return
	}
	mb := (M + blkM - 1) / blkM
	nb := (N + blkN - 1) / blkN
	parallelFor(mb*nb, M*N*K, func(idx int) {
		bi, bj := idx/nb, idx%nb
		i0, i1 := bi*blkM, min((bi+1)*blkM, M)
		j0, j1 := bj*blkN, min((bj+1)*blkN, N)
		matMulTBlock(C, A, B, N, K, i0, i1, j0, j1, acc)
	})
}

// rowDot1, rowDot2 and rowDotTile (when hasRowDot, rowTile > 0: kernels_rows_amd64.go)
// compute the reduced dot products of one, two or rowTile rows of A with four rows of B,
// bit for bit as sdot2x4 and the reduction in sgemmNTSmall; rowDotTile loads each element
// of B once for its rowTile rows.

// rowsL1Bytes is how much of B one sgemmNTRows task holds at a time.
const rowsL1Bytes = 32 << 10

// sgemmNTRows is sgemmNTSmall split over (row block, column block) tasks: each element is
// computed exactly as sgemmNTSmall computes it (8 lane sums of the dot kernel in a fixed
// order, then the k tail), whichever task and row group (4, 2 or 1 rows of A per load of
// B) it falls in, so a row's bits do not depend on M, on its place in the batch, nor on the
// number of threads.
func sgemmNTRows(kn *sgemmKernel, C, A, B []float32, B16 []uint16, M, N, K int, acc bool) {
	// A task's rows of B (colsPerTask × K) stay in L1 while all its rows of A pass over
	// them, so B is read from memory once per step when the columns alone make tasks
	// enough for the threads (the rows are cut in two otherwise); how the work is cut
	// changes no result. Row blocks are multiples of the row kernel's width so that it
	// covers all but the last rows of M.
	colsPerTask := min(max(rowsL1Bytes/(4*K)/4, 1)*4, 64)
	k8 := K / 8
	nt := (N + colsPerTask - 1) / colsPerTask
	rowsPerTask := M
	if nt < 2*Threads() {
		unit := max(rowTile, 1)
		rowsPerTask = (max(8, (M+1)/2) + unit - 1) / unit * unit
	}
	mt := (M + rowsPerTask - 1) / rowsPerTask
	parallelFor(mt*nt, M*N*K, func(t int) {
		ti, tj := t/nt, t%nt
		i0, i1 := ti*rowsPerTask, min(ti*rowsPerTask+rowsPerTask, M)
		j0, j1 := tj*colsPerTask, min(tj*colsPerTask+colsPerTask, N)
		B, jb := B, 0 // row j of B is B[(j-jb)*K:]
		if B16 != nil && hasRowDot && k8 > 0 && 8*k8 == K && j1-j0 >= 8 && (rowTile == 0 || i1-i0 < rowTile) {
			// every row takes rowDot8 for the groups of eight columns (as below): read
			// them as bf16, widened in the kernel; the last j1-j0 mod 8 columns as below
			ng := (j1 - j0) / 8
			for i := i0; i < i1; i++ {
				_ = C[i*N+j0+8*ng-1]
				rowDot8BF16(k8, &A[i*K], &B16[j0*K], K, ng, &C[i*N+j0], acc)
			}
			if j0 += 8 * ng; j0 == j1 {
				return
			}
		}
		if B16 != nil { // the task's rows of B widened from bf16 (exact), in L1
			wb := widePool.get((j1 - j0) * K)
			defer widePool.put(wb)
			widenBF16(*wb, B16[j0*K:j1*K])
			B, jb = *wb, j0
		}
		for i := i0; i < i1; {
			if rt := rowTile; rt > 0 && k8 > 0 && i1-i >= rt {
				rowsTile(C, A, B, jb, i, rt, j0, j1, N, K, acc)
				i += rt
				continue
			}
			nr := min(2, i1-i)
			a0 := A[i*K : i*K+K]
			a1 := a0
			if nr > 1 {
				a1 = A[(i+1)*K : (i+1)*K+K]
			}
			for j := j0; j < j1; {
				if hasRowDot && k8 > 0 && 8*k8 == K && j1-j >= 8 { // eight columns a call, into C
					ng := (j1 - j) / 8
					for r := range nr {
						_ = C[(i+r)*N+j+8*ng-1]
						rowDot8(k8, &A[(i+r)*K], &B[(j-jb)*K], K, ng, &C[(i+r)*N+j], acc)
					}
					j += 8 * ng
					continue
				}
				w, ldb := 4, K
				if j1-j < 4 {
					w, ldb = 1, 0 // one row of B at a time (repeated in all four slots)
				}
				var out [8]float32
				switch {
				case k8 == 0:
				case !hasRowDot:
					var lanes [64]float32
					kernelDot(kn, k8, &a0[0], &a1[0], &B[(j-jb)*K], ldb, &lanes)
					for o := range 8 {
						l := lanes[8*o : 8*o+8]
						out[o] = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
					}
				case nr == 2:
					rowDot2(k8, &a0[0], &a1[0], &B[(j-jb)*K], ldb, &out)
				default:
					rowDot1(k8, &a0[0], &B[(j-jb)*K], ldb, &out)
				}
				for r := range nr {
					a := A[(i+r)*K : (i+r)*K+K]
					c := C[(i+r)*N+j : (i+r)*N+j+w]
					for jj := range c {
						s := out[r*4+jj]
						b := B[(j+jj-jb)*K : (j+jj-jb)*K+K]
						for k := 8 * k8; k < K; k++ {
							s += a[k] * b[k]
						}
						if acc {
							c[jj] += s
						} else {
							c[jj] = s
						}
					}
				}
				j += w
			}
			i += nr
		}
	})
}

// rowsTile is sgemmNTRows' product of rows i..i+nr-1 of A (nr = rowTile) with rows
// j0..j1 of B (j1-j0 ≤ 64) through rowDotTile: the groups of four rows of B in one call,
// each of the last (j1-j0) mod 4 rows in a call of its own (the row repeated in the four
// slots).
func rowsTile(C, A, B []float32, jb, i, nr, j0, j1, N, K int, acc bool) {
	k8 := K / 8
	ng := (j1 - j0) / 4
	_ = C[(i+nr-1)*N+j1-1]
	if 8*k8 == K && ng > 0 && rowDotTileInto(k8, &A[i*K], K, &B[(j0-jb)*K], K, ng, &C[i*N+j0], N, acc) {
		// the groups of four columns are in C: the last columns alone are left
		if j0+4*ng < j1 {
			rowsTile(C, A, B, jb, i, nr, j0+4*ng, j1, N, K, acc)
		}
		return
	}
	var buf [16 * 16]float32
	if ng > 0 {
		rowDotTile(k8, &A[i*K], K, &B[(j0-jb)*K], K, ng, &buf[0])
	}
	var tail [3][16]float32
	for t := range (j1 - j0) % 4 {
		rowDotTile(k8, &A[i*K], K, &B[(j0+4*ng+t-jb)*K], 0, 1, &tail[t][0])
	}
	gs := 4 * nr // results per group
	for r := range nr {
		c := C[(i+r)*N+j0 : (i+r)*N+j1]
		if 8*k8 == K { // no k tail: the kernel's sums are the results
			for g := range ng {
				o, d := buf[g*gs+r*4:g*gs+r*4+4], c[4*g:4*g+4]
				if acc {
					d[0], d[1], d[2], d[3] = d[0]+o[0], d[1]+o[1], d[2]+o[2], d[3]+o[3]
				} else {
					copy(d, o)
				}
			}
			for t := range len(c) - 4*ng {
				if acc {
					c[4*ng+t] += tail[t][r*4]
				} else {
					c[4*ng+t] = tail[t][r*4]
				}
			}
			continue
		}
		a := A[(i+r)*K : (i+r)*K+K]
		for jj := range c {
			var s float32
			if g := jj / 4; g < ng {
				s = buf[g*gs+r*4+jj%4]
			} else {
				s = tail[jj-4*ng][r*4]
			}
			b := B[(j0+jj-jb)*K : (j0+jj-jb)*K+K]
			for k := 8 * k8; k < K; k++ {
				s += a[k] * b[k]
			}
			if acc {
				c[jj] += s
			} else {
				c[jj] = s
			}
		}
	}
}
