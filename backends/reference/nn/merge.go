package nn

import "slices"

// Merged returns a model whose adapted linear weights are W + a.Scale·B·A, the sum for
// each weight computed in float64 and rounded once to T; the weights a does not adapt are
// shared with m, not copied. When a adapts the unembedding of a model with tied embeddings,
// the shared matrix is merged (embedding and head stay tied) when a.TiedEmbed; otherwise (an
// adapter trained with the head-only rule) the merged model's head is a weight of its own
// (Cfg.Tied false) and the embedding stays m's. m is not changed.
func Merged[T Float](m *Model[T], a *Adapter[T]) *Model[T] {
	out := *m
	out.packs = new(weightPacks) // its weights differ from m's
	out.Layers = make([]Layer[T], len(m.Layers))
	copy(out.Layers, m.Layers)
	for i := range out.Layers {
		if i >= len(a.Layers) {
			break
		}
		for t, p := range a.Layers[i] {
			if p != nil {
				li := &out.Layers[i].Lin[t]
				li.W, li.W16 = mergedWeight(m.Layers[i].Lin[t].Weights(), p, a.Scale), nil
			}
		}
		if mo := m.Layers[i].MoE; mo != nil && a.Experts != nil {
			out.Layers[i].MoE = mergedMoE(mo, a.Experts[i], a.Scale)
		}
	}
	if a.Head != nil {
		out.Head.W = mergedWeight(m.Head.W, a.Head, a.Scale)
		if a.embedsTied() && m.Cfg.Tied {
			out.Embed = out.Head.W
		} else {
			out.Cfg.Tied = false
		}
	}
	return &out
}

// MergedBytes is the size in bytes of the float32 tensors a merged model has (Tensors):
// m's, plus the unembedding when merging a (head-only) unties it.
func MergedBytes[T Float](m *Model[T], a *Adapter[T]) int64 {
	n := len(m.Embed) + len(m.Norm)
	if !m.Cfg.Tied {
		n += len(m.Head.W)
	}
	for _, L := range m.Layers {
		n += len(L.AttnNorm) + len(L.MLPNorm) + len(L.QNorm) + len(L.KNorm) + len(L.PostAttnNorm) + len(L.PostMLPNorm)
		for _, li := range L.Lin {
			n += li.size() + len(li.B)
		}
		if L.MoE != nil {
			n += L.MoE.paramCount()
		}
	}
	bytes := 4 * int64(n)
	if a.Head != nil && m.Cfg.Tied && !a.embedsTied() {
		bytes += 4 * int64(len(m.Head.W))
	}
	return bytes
}

// mergedWeight returns a new [Out, In] weight w + scale·B·A.
func mergedWeight[T Float](w []T, p *Pair[T], scale T) []T {
	out := make([]T, len(w))
	r, in := p.Rank, p.In
	A, B := p.A.W, p.B.W
	s := float64(scale)
	row := make([]float64, in)
	for o := range p.Out {
		clear(row)
		for k := range r {
			b := float64(B[o*r+k])
			if b == 0 {
				continue
			}
			ak := A[k*in : (k+1)*in]
			for i, v := range ak {
				row[i] += b * float64(v)
			}
		}
		wo := w[o*in : (o+1)*in]
		for i, v := range row {
			out[o*in+i] = T(float64(wo[i]) + s*v)
		}
	}
	return out
}

// mergedMoE returns mo with each adapted expert's weight W + scale·B_e·A_e (x holds the
// adapter's expert LoRA of the layer); the router and the weights not adapted are shared.
func mergedMoE[T Float](mo *MoE[T], x [numExpTargets]*ExpertLoRA[T], scale T) *MoE[T] {
	out := &MoE[T]{Router: mo.Router, GateUp: slices.Clone(mo.GateUp), Down: slices.Clone(mo.Down)}
	for j, lins := range [numExpTargets][]Linear[T]{out.GateUp, out.Down} {
		if x[j] == nil {
			continue
		}
		for e, p := range x[j].Pairs {
			lins[e].W = mergedWeight(lins[e].W, p, scale)
		}
	}
	return out
}
