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
	c := &m.Cfg
	M, D := len(toks), c.Hidden
	H, KH, hd := c.Heads, c.KVHeads, c.HeadDim
	QD, KVD, F := m.QDim(), m.KVDim(), c.Inter
	segs := []seg[T]{{0, M, ad}}
	x := make([]T, M*D)
	for i, t := range toks {
		copy(x[i*D:(i+1)*D], m.Embed[t*D:(t+1)*D])
	}
	posOf := func(i int) int { return pos[i] }
	h := make([]T, M*D)
	q, k, v := make([]T, M*QD), make([]T, M*KVD), make([]T, M*KVD)
	att := make([]T, M*QD)
	o := make([]T, M*D)
	g, u := make([]T, M*F), make([]T, M*F)
	scale := 1 / math.Sqrt(float64(hd))
	for l := range m.Layers {
		L := &m.Layers[l]
		rmsnorm(x, L.AttnNorm, h, nil, M, D, c.Eps)
		linFwd(h, M, &L.Lin[TQ], segs, layerPick[T](l, TQ), q)
		linFwd(h, M, &L.Lin[TK], segs, layerPick[T](l, TK), k)
		linFwd(h, M, &L.Lin[TV], segs, layerPick[T](l, TV), v)
		if L.QNorm != nil {
			rmsnorm(q, L.QNorm, q, nil, M*H, hd, c.Eps)
			rmsnorm(k, L.KNorm, k, nil, M*KH, hd, c.Eps)
		}
		rope(q, M, H, hd, posOf, m.cos, m.sin, false)
		rope(k, M, KH, hd, posOf, m.cos, m.sin, false)
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
		grp := H / KH
		parallelFor(M*H, M*H*(pos[M-1]+1)*hd*2, func(task int) {
			i, hh := task/H, task%H
			kh := hh / grp
			cc := caches[i]
			n := pos[i] + 1
			qr := q[i*QD+hh*hd : i*QD+(hh+1)*hd]
			sc := make([]float64, n)
			mx := math.Inf(-1)
			for j := 0; j < n; j++ {
				s := float64(dot(qr, cc.K[l][j*KVD+kh*hd:j*KVD+(kh+1)*hd])) * scale
				sc[j] = s
				mx = max(mx, s)
			}
			var sum float64
			for j := range sc {
				sc[j] = math.Exp(sc[j] - mx)
				sum += sc[j]
			}
			acc := make([]float64, hd)
			for j := 0; j < n; j++ {
				p := sc[j] / sum
				vr := cc.V[l][j*KVD+kh*hd : j*KVD+(kh+1)*hd]
				for d, xv := range vr {
					acc[d] += p * float64(xv)
				}
			}
			out := att[i*QD+hh*hd : i*QD+(hh+1)*hd]
			for d := range out {
				out[d] = T(acc[d])
			}
		})
		linFwd(att, M, &L.Lin[TO], segs, layerPick[T](l, TO), o)
		for i := range x {
			x[i] += o[i]
		}
		rmsnorm(x, L.MLPNorm, h, nil, M, D, c.Eps)
		linFwd(h, M, &L.Lin[TGate], segs, layerPick[T](l, TGate), g)
		linFwd(h, M, &L.Lin[TUp], segs, layerPick[T](l, TUp), u)
		swiglu(g, u, g)
		linFwd(g, M, &L.Lin[TDown], segs, layerPick[T](l, TDown), o)
		for i := range x {
			x[i] += o[i]
		}
	}
	rmsnorm(x, m.Norm, h, nil, M, D, c.Eps)
	return h
}

// Logits computes the vocabulary logits [M, V] of M final hidden states.
func (m *Model[T]) Logits(h []T, M int, ad *Adapter[T]) []T {
	out := make([]T, M*m.Cfg.Vocab)
	linFwd(h, M, &m.Head, []seg[T]{{0, M, ad}}, headPick[T], out)
	return out
}
