package nn

import "math"

// bf16 weights. A frozen linear weight whose every value is a bfloat16 (the upper half of
// a float32: a checkpoint published in BF16) can be held as those halves (Linear.W16)
// instead of float32, half the memory. Widening a half back to float32 (bits << 16) is
// exact, and every kernel widens before it multiplies, so the arithmetic is the float32
// engine's on the same values, bit for bit:
//   - decoding's row products (sgemmNTRows) widen each task's rows of the weight into a
//     buffer that stays in L1 and run the float32 row kernels on it, so the weight is read
//     from memory at two bytes a value;
//   - every other product (the SGEMMs of prefill and training, the packed forms) widens
//     the whole weight into pooled scratch, one weight at a time, and runs the float32
//     product on it.

// widePool holds the scratch that bf16 weights are widened into.
var widePool bufPool[float32]

// widenBF16 sets dst[i] to the float32 whose bits are src[i]<<16 (len(dst) == len(src)).
func widenBF16(dst []float32, src []uint16) {
	n := len(src)
	_ = dst[n-1]
	n8 := 0
	if hasWiden && n >= 8 {
		n8 = n &^ 7
		widenBF16AVX2(&dst[0], &src[0], n8)
	}
	for i := n8; i < n; i++ {
		dst[i] = math.Float32frombits(uint32(src[i]) << 16)
	}
}

// isBF16 reports whether every value of w is a bfloat16 (its low 16 bits zero).
func isBF16(w []float32) bool {
	for _, v := range w {
		if math.Float32bits(v)&0xffff != 0 {
			return false
		}
	}
	return true
}

// Held16 reports whether li's weight is held as bfloat16 (W16, W nil).
func (li *Linear[T]) Held16() bool { return li.W16 != nil }

// size is the number of values li's weight holds, in either form.
func (li *Linear[T]) size() int { return len(li.W) + len(li.W16) }

// Weights returns li's weight as T: W itself, or a new array widened from W16.
func (li *Linear[T]) Weights() []T {
	if li.W16 == nil {
		return li.W
	}
	w := make([]float32, len(li.W16))
	widenBF16(w, li.W16)
	return any(w).([]T)
}

// withWeights runs fn on li's weight as T: W itself, or W16 widened into pooled scratch
// that is handed back when fn returns.
func withWeights[T Float](li *Linear[T], fn func(w []T)) {
	if li.W16 == nil {
		fn(li.W)
		return
	}
	b := widePool.get(len(li.W16))
	defer widePool.put(b)
	widenBF16(*b, li.W16)
	fn(any(*b).([]T))
}

// HoldBF16 holds as bfloat16 every decoder linear weight of a float32 model (attention and
// dense MLP projections; not the embedding, the head nor MoE experts) whose values are all
// bfloat16, and returns how many it converted. The model's results do not change by a
// bit. Call it before the model serves (it replaces the weights in place).
func HoldBF16[T Float](m *Model[T]) int {
	if _, ok := any(m.Embed).([]float32); !ok {
		return 0
	}
	n := 0
	for l := range m.Layers {
		for t := range m.Layers[l].Lin {
			if holdLinear(&m.Layers[l].Lin[t]) {
				n++
			}
		}
	}
	if n > 0 && m.packs != nil {
		m.packs = new(weightPacks) // packed forms are rebuilt from the held weights
	}
	return n
}

// packs16 reports whether p is the packed form (nn: for A·W) of li's bf16 weight.
func packs16[T Float](p *packedNT, li *Linear[T], nn bool) bool {
	return li.W16 != nil && p != nil && p.nn == nn && p.w16 == &li.W16[0] &&
		p.n*p.k == len(li.W16) && (nn && p.n == li.In || !nn && p.n == li.Out)
}

// linMatMulT is matMulTWith(pk, Y, X, W) for li's weight W[Out, In], held as bf16 or not.
func linMatMulT[T Float](pk *packedNT, Y, X []T, li *Linear[T], M int) {
	if M > smallM && activeKernel.fn != nil && packs16(pk, li, false) {
		sgemmNTPacked(any(Y).([]float32), any(X).([]float32), pk, M, false)
		return
	}
	withWeights(li, func(w []T) { matMulTWith(pk, Y, X, w, M, li.Out, li.In, false) })
}

// linMatMul is matMulWith(pk, dX, dY, W) for li's weight, held as bf16 or not.
func linMatMul[T Float](pk *packedNT, dX, dY []T, li *Linear[T], M int, acc bool) {
	if activeKernel.fn != nil && packs16(pk, li, true) {
		sgemmNTPacked(any(dX).([]float32), any(dY).([]float32), pk, M, acc)
		return
	}
	withWeights(li, func(w []T) { matMulWith(pk, dX, dY, w, M, li.In, li.Out, acc) })
}

// linMatMulTWide is matMulTWide(pk, Y, X, W) for li's weight, held as bf16 or not.
func linMatMulTWide[T Float](pk *packedNT, Y, X []T, li *Linear[T], M int) {
	if _, ok := any(Y).([]float32); ok && M > 0 && activeKernel.fn != nil && packs16(pk, li, false) {
		sgemmNTPacked(any(Y).([]float32), any(X).([]float32), pk, M, false)
		return
	}
	withWeights(li, func(w []T) { matMulTWide(pk, Y, X, w, M, li.Out, li.In, false) })
}

// holdLinear holds li's weight as bfloat16 when T is float32 and every value is a
// bfloat16, and reports whether it did.
func holdLinear[T Float](li *Linear[T]) bool {
	w, _ := any(li.W).([]float32)
	if len(w) == 0 || !isBF16(w) {
		return false
	}
	h := make([]uint16, len(w))
	for i, v := range w {
		h[i] = uint16(math.Float32bits(v) >> 16)
	}
	li.W16, li.W = h, nil
	return true
}

// LoadBF16 is whether Load holds the decoder linear weights that a checkpoint stores in
// BF16 as bfloat16 (HoldBF16) in a float32 model: half their memory, the same results to
// the bit. It is on by default.
var LoadBF16 = true
