package nn

import "sync"

// Decoding, prefills and LoRA training multiply rows by base weights that never change, so
// the weights of a small model are packed once, at its first decoding or training step,
// into the column strips the AVX2 SGEMM's micro-kernel reads (packB's layout, in blocks of
// gemmKC), and the products run that kernel on them: six rows of A per load of the
// weights, no horizontal sums, no packing per call (training's products take them where
// MatMulT and MatMul would run the packed SGEMM, with its bits: matMulTWith, matMulWith). Each element is a chain of fused
// multiply-adds in k order within a block, the blocks added to C in order, whether its
// row is computed in a six-row panel (sgemmKernel6x16u), alone (sgemv16x4) or padded into
// a panel (sgemmKernel6x16): a row's bits depend on that row alone, as batched decoding
// requires, and are the bits the training SGEMM gives the same row.

// maxPackedModelBytes bounds the weights packed (and, for training's input gradients, a
// second pack when they fit it twice). A pack is a copy of the weights, worth it where a
// batched step is compute-bound (small models, whose weights stay in cache across a
// batch's rows); a larger model decodes from its weights as they are (matMulTRows), whose
// single-row rate is bound by memory either way, and trains packing them per call.
const maxPackedModelBytes = 256 << 20

// packedNT is a weight W[N,K] (a Linear's, out × in) packed for products A·Wᵀ: for the
// block of columns of W starting at pc (kc = min(gemmKC, K-pc) of them), ns strips of 16
// rows of W, strip s holding W[16s+j][pc+k] at data[pc·ns·16 + s·16·kc + 16k + j], zeros
// past N.
//
// The same layout packs W for products A·W (packNN: W[K,N], the input gradients dY·W of a
// Linear, N its in and K its out features); sgemmNTPacked takes either.
type packedNT struct {
	w        *float32 // &W[0] of the weight packed
	w16      *uint16  // &W16[0] of a bf16 weight packed (w nil)
	n, k, ns int
	nn       bool // packed for A·W rather than A·Wᵀ
	data     []float32
}

func packNT(W []float32, n, k int) *packedNT { return packOp(W, n, k, 1, k, false) }

func packNN(W []float32, n, k int) *packedNT { return packOp(W, n, k, n, 1, true) }

// packOp packs op(W)[k,j] = W[k·brs + j·bcs] for k < K, j < N.
func packOp(W []float32, n, k, brs, bcs int, nn bool) *packedNT {
	ns := (n + 15) / 16
	p := &packedNT{w: &W[0], n: n, k: k, ns: ns, nn: nn, data: make([]float32, ns*16*k)}
	for pc := 0; pc < k; pc += gemmKC {
		kc := min(gemmKC, k-pc)
		blk := p.data[pc*ns*16:]
		if bcs == 1 {
			packRows(blk, W, brs, 0, n, pc, kc, 0, kc, 16)
			continue
		}
		for s := range ns {
			packB(blk[s*16*kc:(s+1)*16*kc], W, brs, bcs, 16*s, min(16, n-16*s), pc, kc, 16)
		}
	}
	return p
}

// packs reports whether p is the packed form of W for products with an N×K op(W), A·Wᵀ
// or (nn) A·W: a model copy whose weight was replaced (Merged) must not use its
// original's pack.
func packs[T Float](p *packedNT, W []T, n, k int, nn bool) bool {
	w, ok := any(W).([]float32)
	return ok && p != nil && p.nn == nn && p.n == n && p.k == k && len(w) == n*k && len(w) > 0 && &w[0] == p.w
}

// weightPacks holds a model's packed weights (layers[l][t] for layer l's target t, head
// for the unembedding; the nn ones for the input gradients of training, when the model's
// weights fit maxPackedModelBytes twice), built at its first decoding or training step.
type weightPacks struct {
	once             sync.Once
	layers, layersNN [][NumLayerTargets]*packedNT
	head, headNN     *packedNT
}

// packedWeights returns the model's packed weights, packing them on first use; nil when
// the CPU has no packed kernel, T is not float32, or the model's linear weights exceed
// maxPackedModelBytes.
func (m *Model[T]) packedWeights() *weightPacks {
	p := m.packs
	if p == nil || packedKernel == nil {
		return nil
	}
	p.once.Do(func() { packModel(p, m) })
	if p.layers == nil {
		return nil
	}
	return p
}

// pack returns the packed form of layer l's target t, or of the head when l < 0.
func (p *weightPacks) pack(l int, t Target) *packedNT {
	if p == nil {
		return nil
	}
	if l < 0 {
		return p.head
	}
	return p.layers[l][t]
}

// packNN returns the packed form for input gradients of layer l's target t, or of the
// head when l < 0; nil when there is none.
func (p *weightPacks) packNN(l int, t Target) *packedNT {
	if p == nil || p.layersNN == nil {
		return nil
	}
	if l < 0 {
		return p.headNN
	}
	return p.layersNN[l][t]
}

func packModel[T Float](p *weightPacks, m *Model[T]) {
	if _, ok := any(m.Embed).([]float32); !ok {
		return
	}
	bytes := 4 * int64(len(m.Head.W))
	for _, L := range m.Layers {
		for _, li := range L.Lin {
			bytes += 4 * int64(li.size())
		}
	}
	if bytes > maxPackedModelBytes {
		return
	}
	pack := func(li *Linear[T], nn bool) *packedNT {
		w := any(li.Weights()).([]float32)
		if len(w) == 0 || len(w) != li.Out*li.In {
			return nil
		}
		var p *packedNT
		if nn {
			p = packNN(w, li.In, li.Out)
		} else {
			p = packNT(w, li.Out, li.In)
		}
		if li.W16 != nil { // packed from the widened halves: the pack of W16
			p.w, p.w16 = nil, &li.W16[0]
		}
		return p
	}
	all := func(nn bool) [][NumLayerTargets]*packedNT {
		layers := make([][NumLayerTargets]*packedNT, len(m.Layers))
		for l := range m.Layers {
			for t := range m.Layers[l].Lin {
				layers[l][t] = pack(&m.Layers[l].Lin[t], nn)
			}
		}
		return layers
	}
	p.head, p.layers = pack(&m.Head, false), all(false)
	if 2*bytes <= maxPackedModelBytes {
		p.headNN, p.layersNN = pack(&m.Head, true), all(true)
	}
}

// matMulTWith is MatMulT through pk, the packed form of B, when MatMulT would run the
// packed SGEMM (so the bits are the same) and pk packs B; MatMulT otherwise.
func matMulTWith[T Float](pk *packedNT, C, A, B []T, M, N, K int, acc bool) {
	if M > smallM && activeKernel.fn != nil && packs(pk, B, N, K, false) {
		sgemmNTPacked(any(C).([]float32), any(A).([]float32), pk, M, acc)
		return
	}
	MatMulT(C, A, B, M, N, K, acc)
}

// matMulTWide is matMulTWith for any M: through the packed or the blocked SGEMM even for
// M <= smallM, where matMulTWith takes the dot kernel. Both SGEMMs give a row the bits it
// gets in a product of any other number of rows, so a product of a few rows here gives each
// row the bits matMulTWith gives it in a product of more than smallM rows.
func matMulTWide[T Float](pk *packedNT, C, A, B []T, M, N, K int, acc bool) {
	c, ok := any(C).([]float32)
	switch {
	case M == 0 || N == 0:
	case !ok || activeKernel.fn == nil:
		MatMulT(C, A, B, M, N, K, acc) // the generic kernel: rows independent at any M
	case packs(pk, B, N, K, false):
		sgemmNTPacked(c, any(A).([]float32), pk, M, acc)
	default:
		sgemm(activeKernel, M, N, K, any(A).([]float32), K, 1, any(B).([]float32), 1, K, c, N, acc)
	}
}

// matMulTWideUnpacked is matMulTWide of a weight that is not packed (LoRA factors).
func matMulTWideUnpacked[T Float](C, A, B []T, M, N, K int, acc bool) {
	matMulTWide(nil, C, A, B, M, N, K, acc)
}

// matMulWith is MatMul through pk (packNN's form of B) when it packs B.
func matMulWith[T Float](pk *packedNT, C, A, B []T, M, N, K int, acc bool) {
	if activeKernel.fn != nil && packs(pk, B, N, K, true) {
		sgemmNTPacked(any(C).([]float32), any(A).([]float32), pk, M, acc)
		return
	}
	MatMul(C, A, B, M, N, K, acc)
}

// sgemmNTPacked computes C[M,N] (+)= A[M,K]·Wᵀ for the W packed in p, over the threads
// by groups of four column strips. Rows go six at a time through the panel kernel; the
// last M mod 6 go one at a time through sgemv16x4 when there are one or two of them (and
// the group is four whole strips), else padded into one panel.
func sgemmNTPacked(C, A []float32, p *packedNT, M int, acc bool) {
	if M == 0 {
		return
	}
	N, K, ns := p.n, p.k, p.ns
	_ = A[M*K-1]
	_ = C[M*N-1]
	runPooled(&packedCalls, (ns+3)/4, M*N*K, packedCall{C: C, A: A, p: p, M: M, acc: acc})
}

// packedCall is one sgemmNTPacked call, its task: do(g) computes the group of four column
// strips g. Calls take it from a pool, so a product allocates nothing.
type packedCall struct {
	C, A []float32
	p    *packedNT
	M    int
	acc  bool
}

var packedCalls sync.Pool

func (t *packedCall) do(g int) {
	C, A, p, M, acc := t.C, t.A, t.p, t.M, t.acc
	N, K, ns := p.n, p.k, p.ns
	full := M / 6 * 6
	s0, s1 := 4*g, min(4*g+4, ns)
	var tmp [6 * 16]float32
	for pc := 0; pc < K; pc += gemmKC {
		kc := min(gemmKC, K-pc)
		accum := acc || pc > 0
		blk := p.data[pc*ns*16:]
		for s := s0; s < s1; s++ {
			bp, j0 := &blk[s*16*kc], 16*s
			nj := min(16, N-j0)
			for i0 := 0; i0 < full; i0 += 6 {
				if nj == 16 {
					kernelTileA(packedKernel, kc, &A[i0*K+pc], K, bp, &C[i0*N+j0], N, accum)
					continue
				}
				kernelTileA(packedKernel, kc, &A[i0*K+pc], K, bp, &tmp[0], 16, false)
				addTile(C[i0*N+j0:], N, tmp[:], 6, nj, accum)
			}
		}
		r := M - full
		switch {
		case r == 0:
		case r <= 2 && s1-s0 == 4 && 16*s1 <= N:
			for i := full; i < M; i++ {
				packedRow(kc, &A[i*K+pc], &blk[s0*16*kc], 16*kc, &C[i*N+16*s0], accum)
			}
		default:
			var pa [6 * gemmKC]float32
			packA(pa[:], A, K, 1, full, r, pc, kc, 6)
			for s := s0; s < s1; s++ {
				j0 := 16 * s
				kernelTile(packedKernel, kc, &pa[0], &blk[s*16*kc], &tmp[0], 16, false)
				addTile(C[full*N+j0:], N, tmp[:], r, min(16, N-j0), accum)
			}
		}
	}
}

// addTile writes (or adds, when accum is set) rows × cols of a tile t with rows 16 apart
// to c (rows ldc apart).
func addTile(c []float32, ldc int, t []float32, rows, cols int, accum bool) {
	for i := range rows {
		ci, ti := c[i*ldc:i*ldc+cols], t[i*16:i*16+cols]
		if !accum {
			copy(ci, ti)
			continue
		}
		for j, v := range ti {
			ci[j] += v
		}
	}
}
