package nn

import (
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
)

func newRNG(seed uint64) *rand.Rand {
	return rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
}

// LoraAlpha is the fixed LoRA alpha; the update is scaled by LoraAlpha/rank.
const LoraAlpha = 32

// LoraConfig selects an adapter's rank, seed and targets.
type LoraConfig struct {
	Rank    int
	Seed    uint64
	Attn    bool // q_proj, k_proj, v_proj, o_proj
	MLP     bool // gate_proj, up_proj, down_proj
	Unembed bool // lm_head
}

// Param is one trainable tensor with its gradient and Adam moments.
type Param[T Float] struct {
	Name  string // PEFT key, e.g. base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight
	Shape [2]int
	W, G  []T
	M, V  []T
	// experts > 0 marks a MoE expert lora_B of that many experts, held expert-major
	// ([E][out][r]) and stored as PEFT's [out, r·E] (moe.go: held, stored).
	experts int
}

// Pair is the LoRA factor pair of one linear layer: ΔW = scale · B·A with A [R, In] and
// B [Out, R].
type Pair[T Float] struct {
	A, B          *Param[T]
	In, Out, Rank int
}

// Adapter is a LoRA adapter over a model with its gradients and optimizer state.
type Adapter[T Float] struct {
	Cfg    LoraConfig
	Scale  T
	Layers [][NumLayerTargets]*Pair[T]
	Head   *Pair[T]
	// Experts holds, per layer, the LoRA of a MoE layer's experts (gate_up_proj, down_proj:
	// ExpertTargetNames); nil for a model without MoE layers, nil entries where a layer or
	// target is not adapted.
	Experts [][numExpTargets]*ExpertLoRA[T]
	// TiedEmbed says that Head adapts the matrix the model's embedding and head share (a
	// model with tied embeddings): ΔW = Scale·B·A is added to W wherever W is used, the
	// logits (h·(W+ΔW)ᵀ) and the input embedding lookup (W[t]+ΔW[t]), and A and B get
	// gradients from both uses. This is what PEFT's ensure_weight_tying and
	// tinker-cookbook's merge compute. False (head only: the embedding lookup is not
	// adapted) for untied models, and for adapters trained before this rule existed (their
	// adapter_config.json lacks ensure_weight_tying), which keep the semantics they were
	// trained with.
	TiedEmbed bool
	// HeadOnlyTied marks an adapter of a tied model whose head LoRA follows the head-only
	// rule (loaded from a checkpoint without ensure_weight_tying); saved as
	// UnembedMeta = "head-only" so that a download in Tinker's layout does not present it
	// as Tinker's shared-matrix unembedding.
	HeadOnlyTied bool
	Params       []*Param[T]
	Step         int // optimizer steps taken
}

// NewAdapter creates an adapter for m: A is drawn from U(-1/√in, 1/√in) (PEFT's
// kaiming_uniform_(a=√5) bound) with a generator seeded by (seed, parameter name), B is zero.
func NewAdapter[T Float](m *Model[T], cfg LoraConfig) (*Adapter[T], error) {
	if cfg.Rank < 1 {
		return nil, fmt.Errorf("LoRA rank must be at least 1, got %d", cfg.Rank)
	}
	if !cfg.Attn && !cfg.MLP && !cfg.Unembed {
		return nil, fmt.Errorf("the adapter trains nothing: set at least one of train_attn, train_mlp, train_unembed")
	}
	a := &Adapter[T]{Cfg: cfg, Scale: T(float64(LoraAlpha) / float64(cfg.Rank))}
	a.Layers = make([][NumLayerTargets]*Pair[T], len(m.Layers))
	newPair := func(prefix string, in, out, r int) *Pair[T] {
		p := zeroPair[T](prefix, in, out, r)
		h := fnv.New64a()
		h.Write([]byte(p.A.Name))
		rng := newRNG(cfg.Seed ^ h.Sum64())
		bound := 1 / math.Sqrt(float64(in))
		for i := range p.A.W {
			p.A.W[i] = T((rng.Float64()*2 - 1) * bound)
		}
		a.Params = append(a.Params, p.A, p.B)
		return p
	}
	moe := m.Cfg.moe.on
	if moe {
		a.Experts = make([][numExpTargets]*ExpertLoRA[T], len(m.Layers))
	}
	for i, L := range m.Layers {
		for t := Target(0); t < NumLayerTargets; t++ {
			// a MoE model's MLP LoRA is its experts': its dense MLP layers are not adapted
			// (as the torch worker's qwen3_moe family)
			if (t <= TO && cfg.Attn) || (t > TO && cfg.MLP && !moe) {
				li := L.Lin[t]
				a.Layers[i][t] = newPair(layerKey(i, t), li.In, li.Out, cfg.Rank)
			}
		}
		if L.MoE != nil && cfg.MLP {
			E := len(L.MoE.GateUp)
			for j, li := range [numExpTargets]*Linear[T]{&L.MoE.GateUp[0], &L.MoE.Down[0]} {
				// rank r per expert: A [E·r, in] drawn as one tensor (the torch worker's init)
				p := newPair(expertKey(i, j, ExpertTargetNames[:]), li.In, li.Out, E*cfg.Rank)
				p.B.experts = E
				a.Experts[i][j] = newExpertLoRA(p.A, p.B, E, cfg.Rank, li.In, li.Out)
			}
		}
	}
	if cfg.Unembed {
		a.Head = newPair(headKey, m.Head.In, m.Head.Out, cfg.Rank)
		a.TiedEmbed = m.Cfg.Tied
	}
	return a, nil
}

// embedsTied reports whether a adds its unembedding LoRA to the input embeddings too
// (TiedEmbed); a may be nil (the base model).
func (a *Adapter[T]) embedsTied() bool { return a != nil && a.TiedEmbed && a.Head != nil }

// addEmbedDelta adds row tok of a's unembedding update, Scale·(B·A)[tok], to the embedding
// row x (D values, holding W[tok]): the sum is computed in float64 and rounded once to T,
// as Merged computes W+ΔW, so an adapted lookup equals the merged model's.
func (a *Adapter[T]) addEmbedDelta(x []T, tok int, acc []float64) {
	p := a.Head
	r, in := p.Rank, p.In
	clear(acc)
	for k := range r {
		b := float64(p.B.W[tok*r+k])
		if b == 0 {
			continue
		}
		for i, v := range p.A.W[k*in : (k+1)*in] {
			acc[i] += b * float64(v)
		}
	}
	s := float64(a.Scale)
	for i, v := range acc {
		x[i] = T(float64(x[i]) + s*v)
	}
}

// embedRows sets x (len(toks) rows of D) to the embeddings of toks, adapted for the rows
// of segments whose adapter embedsTied, then scaled as the family scales them (Gemma 3's
// √hidden, applied to the adapted row as to a merged W+ΔW).
func (m *Model[T]) embedRows(x []T, toks func(i int) int, n int, segs []seg[T]) {
	D := m.Cfg.Hidden
	for i := range n {
		t := toks(i)
		copy(x[i*D:(i+1)*D], m.Embed[t*D:(t+1)*D])
	}
	for _, sg := range segs {
		if !sg.ad.embedsTied() {
			continue
		}
		acc := getF64(D)
		for i := sg.r0; i < sg.r1; i++ {
			sg.ad.addEmbedDelta(x[i*D:(i+1)*D], toks(i), *acc)
		}
		putF64(acc)
	}
	m.scaleEmbeddings(x, n)
}

// embedBwd accumulates into the unembedding LoRA gradients of the adapters that embedsTied
// the gradient dx (rows of D) of the adapted embedding lookup of toks:
// dA[k] += s·B[t,k]·dx[i] and dB[t,k] += s·A[k]·dx[i] for each row i of token t, summed in
// float64 over a segment's rows and added once to the gradients.
func embedBwd[T Float](dx []T, toks func(i int) int, segs []seg[T], D int) {
	for _, sg := range segs {
		ad := sg.ad
		if !ad.embedsTied() {
			continue
		}
		p := ad.Head
		r := p.Rank
		ga, gb := getF64(len(p.A.G)), getF64(len(p.B.G)) // pooled: not cleared
		clear(*ga)
		clear(*gb)
		s := float64(ad.Scale)
		for i := sg.r0; i < sg.r1; i++ {
			t := toks(i)
			d := dx[i*D : (i+1)*D]
			for k := range r {
				ak := p.A.W[k*D : (k+1)*D]
				bk := s * float64(p.B.W[t*r+k])
				gak := (*ga)[k*D : (k+1)*D]
				var dot float64
				for j, v := range d {
					gak[j] += bk * float64(v)
					dot += float64(ak[j]) * float64(v)
				}
				(*gb)[t*r+k] += s * dot
			}
		}
		for i, v := range *ga {
			p.A.G[i] += T(v)
		}
		for i, v := range *gb {
			if v != 0 {
				p.B.G[i] += T(v)
			}
		}
		putF64(ga)
		putF64(gb)
	}
}

// headKey is the PEFT module key of the unembedding (lm_head).
const headKey = "base_model.model.lm_head"

// layerKey is the PEFT module key of target t of layer i.
func layerKey(i int, t Target) string {
	return fmt.Sprintf("base_model.model.model.layers.%d.%s%s", i, targetPrefix(t), TargetNames[t])
}

// zeroPair allocates a pair with A [r, in] and B [out, r], all zero, for module key prefix.
func zeroPair[T Float](prefix string, in, out, r int) *Pair[T] {
	p := &Pair[T]{In: in, Out: out, Rank: r,
		A: &Param[T]{Name: prefix + ".lora_A.weight", Shape: [2]int{r, in}},
		B: &Param[T]{Name: prefix + ".lora_B.weight", Shape: [2]int{out, r}},
	}
	for _, q := range []*Param[T]{p.A, p.B} {
		n := q.Shape[0] * q.Shape[1]
		q.W, q.G, q.M, q.V = make([]T, n), make([]T, n), make([]T, n), make([]T, n)
	}
	return p
}

// TargetModules lists the PEFT target_modules of the adapter.
func (a *Adapter[T]) TargetModules() []string {
	var out []string
	if a.Cfg.Attn {
		out = append(out, TargetNames[:4]...)
	}
	if a.Cfg.MLP && a.Experts == nil {
		out = append(out, TargetNames[4:]...)
	}
	if a.Cfg.Unembed {
		out = append(out, "lm_head")
	}
	return out
}

// TargetParameters lists the PEFT target_parameters of the adapter (a MoE model's expert
// parameters; none otherwise).
func (a *Adapter[T]) TargetParameters() []string {
	var out []string
	for j, name := range ExpertTargetNames {
		for _, x := range a.Experts {
			if x[j] != nil {
				out = append(out, name)
				break
			}
		}
	}
	return out
}

// ZeroGrad clears the accumulated gradients.
func (a *Adapter[T]) ZeroGrad() {
	for _, p := range a.Params {
		clear(p.G)
	}
}

// Clone returns a deep copy of the adapter (weights, gradients, optimizer state).
func (a *Adapter[T]) Clone() *Adapter[T] {
	out := &Adapter[T]{Cfg: a.Cfg, Scale: a.Scale, Step: a.Step, TiedEmbed: a.TiedEmbed, HeadOnlyTied: a.HeadOnlyTied}
	mp := map[*Param[T]]*Param[T]{}
	for _, p := range a.Params {
		q := &Param[T]{Name: p.Name, Shape: p.Shape, W: append([]T(nil), p.W...), G: append([]T(nil), p.G...),
			M: append([]T(nil), p.M...), V: append([]T(nil), p.V...), experts: p.experts}
		mp[p] = q
		out.Params = append(out.Params, q)
	}
	cp := func(p *Pair[T]) *Pair[T] {
		if p == nil {
			return nil
		}
		return &Pair[T]{A: mp[p.A], B: mp[p.B], In: p.In, Out: p.Out, Rank: p.Rank}
	}
	out.Layers = make([][NumLayerTargets]*Pair[T], len(a.Layers))
	for i := range a.Layers {
		for t := range a.Layers[i] {
			out.Layers[i][t] = cp(a.Layers[i][t])
		}
	}
	out.Head = cp(a.Head)
	if a.Experts != nil {
		out.Experts = make([][numExpTargets]*ExpertLoRA[T], len(a.Experts))
		for i := range a.Experts {
			for j, x := range a.Experts[i] {
				if x != nil {
					p := x.Pairs[0]
					out.Experts[i][j] = newExpertLoRA(mp[x.A], mp[x.B], len(x.Pairs), p.Rank, p.In, p.Out)
				}
			}
		}
	}
	return out
}

// AdamParams are AdamW hyper-parameters as Tinker defines them.
type AdamParams struct {
	LR, Beta1, Beta2, Eps, WeightDecay, GradClipNorm float64
}

// OptimStats reports what an optimizer step did.
type OptimStats struct {
	GradNorm   float64 // global gradient norm before clipping
	UpdateNorm float64 // ‖W_after − W_before‖ over every parameter, as stored (in T)
	Clipped    bool
}

// AdamStep applies one AdamW step to every parameter, then zeroes the gradients:
//
//	g ← g·min(1, clip/(‖g‖+1e-6)) when GradClipNorm > 0 (global norm over the adapter)
//	m ← β1·m + (1−β1)·g;  v ← β2·v + (1−β2)·g²
//	p ← p − lr·wd·p                        (decoupled weight decay, as torch.optim.AdamW)
//	p ← p − lr·(m/(1−β1ᵗ)) / (√(v/(1−β2ᵗ)) + eps)
//
// Moments are kept in float64 arithmetic per element and stored in T.
func (a *Adapter[T]) AdamStep(p AdamParams) OptimStats {
	var ss float64
	for _, q := range a.Params {
		for _, g := range q.G {
			ss += float64(g) * float64(g)
		}
	}
	norm := math.Sqrt(ss)
	coef := 1.0
	st := OptimStats{GradNorm: norm}
	if p.GradClipNorm > 0 && norm > p.GradClipNorm {
		coef = p.GradClipNorm / (norm + 1e-6)
		st.Clipped = true
	}
	a.Step++
	t := float64(a.Step)
	bc1 := 1 - math.Pow(p.Beta1, t)
	bc2 := 1 - math.Pow(p.Beta2, t)
	var upd float64 // Σ (W_after − W_before)²
	for _, q := range a.Params {
		var pu float64 // this parameter's Σ d², in a register
		for i := range q.W {
			g := float64(q.G[i]) * coef
			m := p.Beta1*float64(q.M[i]) + (1-p.Beta1)*g
			v := p.Beta2*float64(q.V[i]) + (1-p.Beta2)*g*g
			q.M[i], q.V[i] = T(m), T(v)
			before := float64(q.W[i])
			w := before
			w -= p.LR * p.WeightDecay * w
			w -= p.LR * (m / bc1) / (math.Sqrt(v/bc2) + p.Eps)
			nw := T(w)
			q.W[i] = nw
			d := float64(nw) - before
			pu += d * d
		}
		upd += pu
		clear(q.G)
	}
	st.UpdateNorm = math.Sqrt(upd)
	return st
}
