package nn

import (
	"fmt"
	"math"
	"slices"
)

// qwen3MoeType is Qwen3-MoE's model_type (transformers' Qwen3MoeForCausalLM), computed as
// transformers 5.24 does: Qwen3 attention (q/k norms), and in the sparse layers a router
// (softmax over the experts in float32, the top-k, renormalised when norm_topk_prob) and
// top-k SwiGLU experts whose outputs are summed weighted by the router, in expert order.
// The other layers (mlp_only_layers, or not a multiple of decoder_sparse_step) have a
// dense SwiGLU MLP of intermediate_size. The router's load-balancing loss is not part of
// the training loss (transformers adds it only with output_router_logits, false by
// default; a config that sets it with a non-zero coefficient is refused).
const qwen3MoeType = "qwen3_moe"

// MaxExperts bounds num_experts (the released Qwen3-MoE checkpoints have 128).
const MaxExperts = 1024

// moeShape is what normalizeMoE derives from a qwen3_moe config.
type moeShape struct {
	on     bool
	sparse []bool // per layer: a sparse MoE block (else a dense MLP)
}

// The expert LoRA targets of a MoE layer, in the order of the experts module's parameters
// (PEFT's target_parameters): the fused gate and up projection, then down.
const (
	expGateUp = iota
	expDown
	numExpTargets
)

// ExpertTargetNames are the PEFT target_parameters names of the expert targets.
var ExpertTargetNames = [numExpTargets]string{"gate_up_proj", "down_proj"}

// normalizeMoE checks a qwen3_moe config and derives moeShape; what the engine does not
// compute exactly is refused with the reason.
func (c *Config) normalizeMoE() error {
	if c.UseSlidingWindow {
		return fmt.Errorf("qwen3_moe: use_sliding_window is not computed by the reference engine; " +
			"set it false (Qwen3-MoE checkpoints do) or start loops serve with --backend torch")
	}
	if c.OutputRouterLogits && c.RouterAuxCoef != 0 {
		return fmt.Errorf("qwen3_moe: output_router_logits with router_aux_loss_coef %g would add the router's load-balancing loss "+
			"to transformers' training loss; Loops trains on the Tinker loss alone (docs/semantics.md): set output_router_logits false", c.RouterAuxCoef)
	}
	if c.NumExperts == 0 {
		c.NumExperts = c.NumLocalExperts
	} else if c.NumLocalExperts != 0 && c.NumLocalExperts != c.NumExperts {
		return fmt.Errorf("qwen3_moe: num_experts %d and num_local_experts %d disagree", c.NumExperts, c.NumLocalExperts)
	}
	if c.NumExperts < 1 || c.NumExperts > MaxExperts {
		return fmt.Errorf("qwen3_moe: num_experts %d must be from 1 to %d", c.NumExperts, MaxExperts)
	}
	if c.TopK < 1 || c.TopK > c.NumExperts {
		return fmt.Errorf("qwen3_moe: num_experts_per_tok %d must be from 1 to num_experts %d", c.TopK, c.NumExperts)
	}
	if c.MoEInter < 1 {
		return fmt.Errorf("qwen3_moe: moe_intermediate_size must be positive, got %d", c.MoEInter)
	}
	if c.SparseStep == 0 {
		c.SparseStep = 1 // Qwen3MoeConfig's default
	}
	if c.SparseStep < 0 {
		return fmt.Errorf("qwen3_moe: decoder_sparse_step must be positive, got %d", c.SparseStep)
	}
	s := moeShape{on: true, sparse: make([]bool, c.Layers)}
	for i := range s.sparse {
		// Qwen3MoeDecoderLayer's rule
		s.sparse[i] = !slices.Contains(c.MLPOnlyLayers, i) && (i+1)%c.SparseStep == 0
	}
	c.moe = s
	return nil
}

// sparseLayer reports whether layer l is a MoE block.
func (c *Config) sparseLayer(l int) bool { return c.moe.on && c.moe.sparse[l] }

// SparseLayer reports whether layer l of a loaded model is a MoE block (Qwen3-MoE).
func (c *Config) SparseLayer(l int) bool { return c.sparseLayer(l) }

// MoE is a sparse mixture-of-experts MLP block (Qwen3MoeSparseMoeBlock).
type MoE[T Float] struct {
	Router []T         // [E, D]: the router's logits are h·Routerᵀ
	GateUp []Linear[T] // per expert [2·I, D]: the gate rows, then the up rows
	Down   []Linear[T] // per expert [D, I]
}

// ExpertLoRA is an adapter's LoRA on one expert target of a MoE layer, rank r per expert,
// in PEFT's target_parameters layout: A [E·r, in] (expert e's rows e·r…(e+1)·r) and B
// stored [out, r·E] (expert e's column k at k·E+e). B is held expert-major ([E][out][r],
// Param.experts) so that each expert's pair is a plain Pair; Pairs are views into A and B.
type ExpertLoRA[T Float] struct {
	A, B  *Param[T]
	Pairs []*Pair[T]
}

// newExpertLoRA makes the views of a (A, B) pair of E experts at rank r.
func newExpertLoRA[T Float](A, B *Param[T], E, r, in, out int) *ExpertLoRA[T] {
	x := &ExpertLoRA[T]{A: A, B: B, Pairs: make([]*Pair[T], E)}
	for e := range E {
		a0, b0 := e*r*in, e*out*r
		x.Pairs[e] = &Pair[T]{In: in, Out: out, Rank: r,
			A: &Param[T]{Name: A.Name, Shape: [2]int{r, in}, W: A.W[a0 : a0+r*in], G: A.G[a0 : a0+r*in]},
			B: &Param[T]{Name: B.Name, Shape: [2]int{out, r}, W: B.W[b0 : b0+out*r], G: B.G[b0 : b0+out*r]},
		}
	}
	return x
}

// expertKey is the PEFT module key of expert target j of layer i when the adapter targets
// the parameters named in params (PEFT nests one wrapper per targeted parameter of the
// experts module, in the module's parameter order: the i-th of n is the module key with
// n-1-i ".base_layer").
func expertKey(i, j int, params []string) string {
	k := fmt.Sprintf("base_model.model.model.layers.%d.mlp.experts", i)
	n, at := 0, 0
	for jj, name := range ExpertTargetNames {
		if slices.Contains(params, name) {
			if jj == j {
				at = n
			}
			n++
		}
	}
	for range n - 1 - at {
		k += ".base_layer"
	}
	return k
}

// held converts x, a tensor in stored order, to the order p holds it in (in place through
// a copy); a no-op for a tensor that is not an expert lora_B.
func (p *Param[T]) held(x []T) {
	if p.experts == 0 {
		return
	}
	src := slices.Clone(x)
	E, out, r := p.experts, p.Shape[0], p.Shape[1]/p.experts
	for o := range out {
		for k := range r {
			for e := range E {
				x[(e*out+o)*r+k] = src[o*r*E+k*E+e]
			}
		}
	}
}

// stored returns x, held by p, in the order adapter files store it (x itself when p is
// not an expert lora_B).
func (p *Param[T]) stored(x []T) []T {
	if p.experts == 0 {
		return x
	}
	out := make([]T, len(x))
	E, o, r := p.experts, p.Shape[0], p.Shape[1]/p.experts
	for oi := range o {
		for k := range r {
			for e := range E {
				out[oi*r*E+k*E+e] = x[(e*o+oi)*r+k]
			}
		}
	}
	return out
}

// expertPick returns the pair of expert e of expert target j of layer l.
func expertPick[T Float](l, j, e int) pickFn[T] {
	return func(a *Adapter[T]) *Pair[T] {
		if a.Experts == nil || a.Experts[l][j] == nil {
			return nil
		}
		return a.Experts[l][j].Pairs[e]
	}
}

// routing is a MoE block's routing of M tokens: the K experts of token t are
// sel[t·K…], ascending (the order their outputs are summed in, as transformers'
// index_add_ over the experts), with weights w; probs are the router's softmax [M, E]
// (kept for the backward pass). Expert e's rows are off[e]…off[e+1] of the gathered
// layout, token rowTok[r] at row r; row[t·K+k] is the row of token t's k-th expert.
type routing[T Float] struct {
	E, K     int
	sel      []int
	w, probs []T
	off      []int
	row      []int
	rowTok   []int
}

// route computes the router's choice for the M rows of h: softmax over the experts of
// h·Routerᵀ (in float64, rounded to T: transformers computes it in float32 whatever the
// model's dtype, which a float64 model here does not copy, so that its loss stays smooth
// in the weights), the K largest (the lower index first among equals), divided by their
// sum when normTopK.
func route[T Float](mo *MoE[T], h []T, M, D, K int, normTopK bool, r *routing[T], logits []T, mul func(C, A, B []T, M, N, K int, acc bool)) {
	E := len(mo.GateUp)
	r.E, r.K = E, K
	mul(logits, h, mo.Router, M, E, D, false)
	r.sel, r.w = resize(r.sel, M*K), resize(r.w, M*K)
	r.probs = resize(r.probs, M*E)
	var order [MaxExperts]int
	for t := range M {
		lg, p := logits[t*E:(t+1)*E], r.probs[t*E:(t+1)*E]
		mx := math.Inf(-1)
		for _, v := range lg {
			mx = max(mx, float64(v))
		}
		var sum float64
		for j, v := range lg {
			e := math.Exp(float64(v) - mx)
			p[j] = T(e)
			sum += e
		}
		for j := range p {
			p[j] = T(float64(p[j]) / sum)
		}
		ord := order[:E]
		for j := range ord {
			ord[j] = j
		}
		slices.SortStableFunc(ord, func(a, b int) int {
			switch {
			case p[a] > p[b]:
				return -1
			case p[a] < p[b]:
				return 1
			}
			return 0
		})
		top := r.sel[t*K : (t+1)*K]
		copy(top, ord[:K])
		slices.Sort(top)
		var s float64
		for _, e := range top {
			s += float64(p[e])
		}
		for k, e := range top {
			w := float64(p[e])
			if normTopK {
				w /= s
			}
			r.w[t*K+k] = T(w)
		}
	}
	// the gathered layout: expert by expert, tokens ascending
	r.off = resize(r.off, E+1)
	clear(r.off)
	for _, e := range r.sel {
		r.off[e+1]++
	}
	for e := range E {
		r.off[e+1] += r.off[e]
	}
	r.row, r.rowTok = resize(r.row, M*K), resize(r.rowTok, M*K)
	next := slices.Clone(r.off[:E])
	for t := range M {
		for k, e := range r.sel[t*K : (t+1)*K] {
			r.row[t*K+k] = next[e]
			r.rowTok[next[e]] = t
			next[e]++
		}
	}
}

// expertSegs returns the adapter segments of expert e's rows (numbered from its first
// row), from the token segments segs: tokens are ascending within an expert, so each
// segment's tokens are a contiguous run of its rows.
func (r *routing[T]) expertSegs(e int, segs []seg[T]) []seg[T] {
	var out []seg[T]
	r0, r1 := r.off[e], r.off[e+1]
	i := r0
	for _, sg := range segs {
		j := i
		for j < r1 && r.rowTok[j] < sg.r1 {
			j++
		}
		if j > i {
			out = append(out, seg[T]{r0: i - r0, r1: j - r0, ad: sg.ad})
		}
		i = j
	}
	return out
}

// moeAct is what a training pass keeps of a MoE block for its backward pass.
type moeAct[T Float] struct {
	r            routing[T]
	xg           []T // the gathered inputs [M·K, D]
	g, u, act    []T // [M·K, I]
	y            []T // the experts' outputs before weighting [M·K, D]
	segs         [][]seg[T]
	xsGU, xsDown [][][]T
}

// moeFwd runs MoE block mo of layer l on the M rows of h into out (the training pass),
// keeping in a what moeBwd needs; work arrays come from ar.
func (m *Model[T]) moeFwd(ar *fbArena[T], mo *MoE[T], l int, h []T, M int, segs []seg[T], a *moeAct[T], out []T) {
	c := &m.Cfg
	D, I, K := c.Hidden, c.MoEInter, c.TopK
	E := len(mo.GateUp)
	route(mo, h, M, D, K, c.NormTopK, &a.r, ar.get(M*E), MatMulT[T])
	r := &a.r
	N := M * K
	a.xg = ar.get(N * D)
	for row, t := range r.rowTok {
		copy(a.xg[row*D:(row+1)*D], h[t*D:(t+1)*D])
	}
	gu := ar.get(N * 2 * I)
	a.g, a.u, a.act, a.y = ar.get(N*I), ar.get(N*I), ar.get(N*I), ar.get(N*D)
	a.segs, a.xsGU, a.xsDown = make([][]seg[T], E), make([][][]T, E), make([][][]T, E)
	for e := range E {
		r0, r1 := r.off[e], r.off[e+1]
		if r0 == r1 {
			continue
		}
		a.segs[e] = r.expertSegs(e, segs)
		a.xsGU[e] = linFwd(ar, a.xg[r0*D:r1*D], r1-r0, &mo.GateUp[e], nil, a.segs[e], expertPick[T](l, expGateUp, e), gu[r0*2*I:r1*2*I])
	}
	for row := range N {
		copy(a.g[row*I:(row+1)*I], gu[row*2*I:row*2*I+I])
		copy(a.u[row*I:(row+1)*I], gu[row*2*I+I:(row+1)*2*I])
	}
	m.mlpAct(a.g, a.u, a.act)
	for e := range E {
		r0, r1 := r.off[e], r.off[e+1]
		if r0 == r1 {
			continue
		}
		a.xsDown[e] = linFwd(ar, a.act[r0*I:r1*I], r1-r0, &mo.Down[e], nil, a.segs[e], expertPick[T](l, expDown, e), a.y[r0*D:r1*D])
	}
	combine(r, a.y, M, D, out)
}

// combine sets out[t] to Σ_k w[t,k]·y[row of (t,k)] over token t's experts in ascending
// order (transformers' index_add_ of each expert's weighted rows onto zeros).
func combine[T Float](r *routing[T], y []T, M, D int, out []T) {
	K := r.K
	for t := range M {
		o := out[t*D : (t+1)*D]
		clear(o)
		for k := range K {
			w := r.w[t*K+k]
			yr := y[r.row[t*K+k]*D:][:D]
			for j := range o {
				o[j] += yr[j] * w
			}
		}
	}
}

// moeBwd back-propagates dout (the gradient of moeFwd's out) into dh (set, not
// accumulated) and the adapters' expert LoRA gradients.
func (m *Model[T]) moeBwd(ar *fbArena[T], mo *MoE[T], l int, a *moeAct[T], M int, dout, dh []T) {
	c := &m.Cfg
	D, I, K := c.Hidden, c.MoEInter, c.TopK
	r := &a.r
	E := r.E
	N := M * K
	dy := ar.get(N * D)
	dw := getF64(N)
	defer putF64(dw)
	for t := range M {
		d := dout[t*D : (t+1)*D]
		for k := range K {
			row := r.row[t*K+k]
			yr, dyr := a.y[row*D:(row+1)*D], dy[row*D:(row+1)*D]
			w := r.w[t*K+k]
			var s float64
			for j, v := range d {
				s += float64(v) * float64(yr[j])
				dyr[j] = v * w
			}
			(*dw)[t*K+k] = s
		}
	}
	dact := ar.get(N * I)
	for e := range E {
		r0, r1 := r.off[e], r.off[e+1]
		if r0 == r1 {
			continue
		}
		linBwd(ar, dy[r0*D:r1*D], a.act[r0*I:r1*I], r1-r0, &mo.Down[e], nil, a.segs[e], expertPick[T](l, expDown, e), a.xsDown[e], dact[r0*I:r1*I], false)
	}
	dg, du := ar.get(N*I), ar.get(N*I)
	m.mlpActBwd(a.g, a.u, dact, dg, du)
	dgu := ar.get(N * 2 * I)
	for row := range N {
		copy(dgu[row*2*I:row*2*I+I], dg[row*I:(row+1)*I])
		copy(dgu[row*2*I+I:(row+1)*2*I], du[row*I:(row+1)*I])
	}
	dxg := ar.get(N * D)
	for e := range E {
		r0, r1 := r.off[e], r.off[e+1]
		if r0 == r1 {
			continue
		}
		linBwd(ar, dgu[r0*2*I:r1*2*I], a.xg[r0*D:r1*D], r1-r0, &mo.GateUp[e], nil, a.segs[e], expertPick[T](l, expGateUp, e), a.xsGU[e], dxg[r0*D:r1*D], false)
	}
	for t := range M {
		o := dh[t*D : (t+1)*D]
		clear(o)
		for k := range K {
			xr := dxg[r.row[t*K+k]*D:][:D]
			for j := range o {
				o[j] += xr[j]
			}
		}
	}
	// the router: w = p (or p/Σp over the top k); p = softmax(logits)
	dlog := ar.get(M * E)
	dp := getF64(E)
	defer putF64(dp)
	for t := range M {
		p := r.probs[t*E : (t+1)*E]
		clear(*dp)
		top, dwt := r.sel[t*K:(t+1)*K], (*dw)[t*K:(t+1)*K]
		if c.NormTopK {
			var s, dot float64
			for _, e := range top {
				s += float64(p[e])
			}
			for k := range top {
				dot += dwt[k] * float64(r.w[t*K+k])
			}
			for k, e := range top {
				(*dp)[e] = (dwt[k] - dot) / s
			}
		} else {
			for k, e := range top {
				(*dp)[e] = dwt[k]
			}
		}
		var pd float64
		for e, v := range *dp {
			pd += float64(p[e]) * v
		}
		for e, v := range *dp {
			dlog[t*E+e] = T(float64(p[e]) * (v - pd))
		}
	}
	MatMul(dh, dlog, mo.Router, M, D, E, true)
}

// moeStep is moeFwd for the decoding paths (no saved activations). Every product (the
// router's, the experts', their LoRA) gives a row the bits it would get alone, whatever the
// other rows routed to the same expert: matMulTRows for prodRows, the SGEMM at any number
// of rows (matMulTWide) for prodFwd and prodWide. So batched decoding and a prompt prefilled
// in pieces give each row the bits of the row alone, as on the dense layers.
func (m *Model[T]) moeStep(mo *MoE[T], l int, h []T, M int, segs []seg[T], mode prodMode, out []T) {
	c := &m.Cfg
	D, I, K := c.Hidden, c.MoEInter, c.TopK
	E := len(mo.GateUp)
	mul := matMulTWideUnpacked[T]
	if mode == prodRows {
		mul = matMulTRows[T]
	}
	var r routing[T]
	route(mo, h, M, D, K, c.NormTopK, &r, make([]T, M*E), mul)
	N := M * K
	xg := make([]T, N*D)
	for row, t := range r.rowTok {
		copy(xg[row*D:(row+1)*D], h[t*D:(t+1)*D])
	}
	gu, g, u, y := make([]T, N*2*I), make([]T, N*I), make([]T, N*I), make([]T, N*D)
	var xa []T
	lin := func(X []T, n int, li *Linear[T], sg []seg[T], pick pickFn[T], Y []T) {
		mul(Y, X, li.W, n, li.Out, li.In, false)
		expertLoRA(X, n, li, sg, pick, Y, &xa, mul)
	}
	esegs := make([][]seg[T], E)
	for e := range E {
		r0, r1 := r.off[e], r.off[e+1]
		if r0 == r1 {
			continue
		}
		esegs[e] = r.expertSegs(e, segs)
		lin(xg[r0*D:r1*D], r1-r0, &mo.GateUp[e], esegs[e], expertPick[T](l, expGateUp, e), gu[r0*2*I:r1*2*I])
	}
	for row := range N {
		copy(g[row*I:(row+1)*I], gu[row*2*I:row*2*I+I])
		copy(u[row*I:(row+1)*I], gu[row*2*I+I:(row+1)*2*I])
	}
	m.mlpAct(g, u, g)
	for e := range E {
		r0, r1 := r.off[e], r.off[e+1]
		if r0 == r1 {
			continue
		}
		lin(g[r0*I:r1*I], r1-r0, &mo.Down[e], esegs[e], expertPick[T](l, expDown, e), y[r0*D:r1*D])
	}
	combine(&r, y, M, D, out)
}

// expertLoRA adds each segment's LoRA term of pick to the rows of Y = X·Wᵀ, the products
// through mul (linLoRA for an expert's pair).
func expertLoRA[T Float](X []T, M int, li *Linear[T], segs []seg[T], pick pickFn[T], Y []T, xa *[]T, mul func(C, A, B []T, M, N, K int, acc bool)) {
	for _, sg := range segs {
		if sg.ad == nil || sg.r1 == sg.r0 {
			continue
		}
		p := pick(sg.ad)
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

// loadMoE reads layer prefix p's MoE block (dims from c): the router mlp.gate.weight and
// the experts, either per expert as checkpoints store them (mlp.experts.<e>.gate_proj,
// up_proj, down_proj) or fused as transformers 5 holds them (mlp.experts.gate_up_proj
// [E, 2·I, D], mlp.experts.down_proj [E, D, I]).
func loadMoE[T Float](c *Config, p string, get func(name string, shape ...int) ([]T, error), has func(string) bool) (*MoE[T], error) {
	E, D, I := c.NumExperts, c.Hidden, c.MoEInter
	mo := &MoE[T]{GateUp: make([]Linear[T], E), Down: make([]Linear[T], E)}
	var err error
	if mo.Router, err = get(p+"mlp.gate.weight", E, D); err != nil {
		return nil, err
	}
	if has(p + "mlp.experts.gate_up_proj") {
		gu, err := get(p+"mlp.experts.gate_up_proj", E, 2*I, D)
		if err != nil {
			return nil, err
		}
		dn, err := get(p+"mlp.experts.down_proj", E, D, I)
		if err != nil {
			return nil, err
		}
		for e := range E {
			mo.GateUp[e] = Linear[T]{W: gu[e*2*I*D : (e+1)*2*I*D], Out: 2 * I, In: D}
			mo.Down[e] = Linear[T]{W: dn[e*D*I : (e+1)*D*I], Out: D, In: I}
		}
		return mo, nil
	}
	for e := range E {
		q := fmt.Sprintf("%smlp.experts.%d.", p, e)
		g, err := get(q+"gate_proj.weight", I, D)
		if err != nil {
			return nil, err
		}
		u, err := get(q+"up_proj.weight", I, D)
		if err != nil {
			return nil, err
		}
		dn, err := get(q+"down_proj.weight", D, I)
		if err != nil {
			return nil, err
		}
		mo.GateUp[e] = Linear[T]{W: append(g, u...), Out: 2 * I, In: D}
		mo.Down[e] = Linear[T]{W: dn, Out: D, In: I}
	}
	return mo, nil
}

// tensors appends the block's tensors as transformers' save_pretrained writes them (per
// expert; transformers 5 fuses them at load, vLLM reads them as they are).
func (mo *MoE[T]) tensors(p string, add func(name string, d []T, shape ...int64)) {
	E := len(mo.GateUp)
	D := mo.GateUp[0].In
	I := mo.Down[0].In
	add(p+"mlp.gate.weight", mo.Router, int64(E), int64(D))
	for e := range E {
		q := fmt.Sprintf("%smlp.experts.%d.", p, e)
		w := mo.GateUp[e].W
		add(q+"gate_proj.weight", w[:I*D], int64(I), int64(D))
		add(q+"up_proj.weight", w[I*D:], int64(I), int64(D))
		add(q+"down_proj.weight", mo.Down[e].W, int64(D), int64(I))
	}
}

// paramCount is the number of the block's parameters.
func (mo *MoE[T]) paramCount() int {
	n := len(mo.Router)
	for e := range mo.GateUp {
		n += len(mo.GateUp[e].W) + len(mo.Down[e].W)
	}
	return n
}

// convertMoE returns mo in another float type.
func convertMoE[U, T Float](mo *MoE[T], cv func([]T) []U) *MoE[U] {
	if mo == nil {
		return nil
	}
	out := &MoE[U]{Router: cv(mo.Router), GateUp: make([]Linear[U], len(mo.GateUp)), Down: make([]Linear[U], len(mo.Down))}
	for e := range mo.GateUp {
		out.GateUp[e] = Linear[U]{W: cv(mo.GateUp[e].W), Out: mo.GateUp[e].Out, In: mo.GateUp[e].In}
		out.Down[e] = Linear[U]{W: cv(mo.Down[e].W), Out: mo.Down[e].Out, In: mo.Down[e].In}
	}
	return out
}

// randomMoE is a MoE block of normal(0, std) weights.
func randomMoE[T Float](c *Config, randn func(n int, std float64) []T, std float64) *MoE[T] {
	E, D, I := c.NumExperts, c.Hidden, c.MoEInter
	mo := &MoE[T]{Router: randn(E*D, std), GateUp: make([]Linear[T], E), Down: make([]Linear[T], E)}
	for e := range E {
		mo.GateUp[e] = Linear[T]{W: randn(2*I*D, std), Out: 2 * I, In: D}
		mo.Down[e] = Linear[T]{W: randn(D*I, std), Out: D, In: I}
	}
	return mo
}
