package nn

import (
	"math"
	"sync"
)

// seg is a contiguous run of rows that share one adapter (nil: base model only).
type seg[T Float] struct {
	r0, r1 int
	ad     *Adapter[T]
}

type pickFn[T Float] func(a *Adapter[T]) *Pair[T]

// linFwd computes Y[M,Out] = X·Wᵀ + b, plus scale·(X·Aᵀ)·Bᵀ on the rows of each segment
// whose adapter has a pair for this layer. It returns scale·X·Aᵀ per segment (nil where no
// pair applies) for the backward pass, in arrays from ar. pk, when not nil, is W packed
// (packNT).
func linFwd[T Float](ar *fbArena[T], X []T, M int, li *Linear[T], pk *packedNT, segs []seg[T], pick pickFn[T], Y []T) [][]T {
	linMatMulT(pk, Y, X, li, M)
	if li.B != nil {
		for i := 0; i < M; i++ {
			y := Y[i*li.Out : (i+1)*li.Out]
			for j, b := range li.B {
				y[j] += b
			}
		}
	}
	var xs [][]T
	for si, sg := range segs {
		if sg.ad == nil {
			continue
		}
		p := pick(sg.ad)
		if p == nil {
			continue
		}
		if xs == nil {
			xs = ar.list(len(segs))
		}
		rows := sg.r1 - sg.r0
		xa := ar.get(rows * p.Rank)
		MatMulT(xa, X[sg.r0*li.In:sg.r1*li.In], p.A.W, rows, p.Rank, li.In, false)
		s := sg.ad.Scale
		for i := range xa {
			xa[i] *= s
		}
		MatMulT(Y[sg.r0*li.Out:sg.r1*li.Out], xa, p.B.W, rows, li.Out, p.Rank, true)
		xs[si] = xa
	}
	return xs
}

// linBwd computes dX (+)= dY·W (+ LoRA terms) and accumulates LoRA gradients.
// dX may be nil when the input gradient is not needed. pk, when not nil, is W packed for
// input gradients (packNN). Its work arrays come from ar.
func linBwd[T Float](ar *fbArena[T], dY, X []T, M int, li *Linear[T], pk *packedNT, segs []seg[T], pick pickFn[T], xs [][]T, dX []T, acc bool) {
	if dX != nil {
		linMatMul(pk, dX, dY, li, M, acc)
	}
	if xs == nil {
		return
	}
	for si, sg := range segs {
		if xs[si] == nil {
			continue
		}
		p := pick(sg.ad)
		rows := sg.r1 - sg.r0
		dy := dY[sg.r0*li.Out : sg.r1*li.Out]
		x := X[sg.r0*li.In : sg.r1*li.In]
		// dB += dYᵀ · (scale·X·Aᵀ)
		MatMulTN(p.B.G, dy, xs[si], li.Out, p.Rank, rows)
		// g = scale · dY·B  [rows, r]
		g := ar.get(rows * p.Rank)
		MatMul(g, dy, p.B.W, rows, p.Rank, li.Out, false)
		s := sg.ad.Scale
		for i := range g {
			g[i] *= s
		}
		// dA += gᵀ·X
		MatMulTN(p.A.G, g, x, p.Rank, li.In, rows)
		if dX != nil {
			MatMul(dX[sg.r0*li.In:sg.r1*li.In], g, p.A.W, rows, li.In, p.Rank, true)
		}
	}
}

// rmsnorm: out = w ⊙ x · inv, inv = 1/√(mean(x²)+eps), per row of width D.
func rmsnorm[T Float](x, w, out, inv []T, M, D int, eps float64) {
	if !parallelRows(M, D) {
		rmsnormRows(x, w, out, inv, D, eps, 0, M)
		return
	}
	nb, split := splitRows(M)
	runPooled(&rmsnormTasks, nb, rowsWork(M, D),
		rmsnormTask[T]{x: x, w: w, out: out, inv: inv, D: D, eps: eps, rowSplit: split})
}

// rmsnormTask is one rmsnorm call over blocks of rows.
type rmsnormTask[T Float] struct {
	x, w, out, inv []T
	D              int
	eps            float64
	rowSplit
}

var rmsnormTasks sync.Pool

func (t *rmsnormTask[T]) do(b int) {
	if i0, i1 := t.block(b); i0 < i1 {
		rmsnormRows(t.x, t.w, t.out, t.inv, t.D, t.eps, i0, i1)
	}
}

// rowSplit cuts M rows into blocks of per rows: it is the part of a row-wise task that says
// which rows block b covers.
type rowSplit struct{ M, per int }

// block returns the rows [i0, i1) of block b (empty past the last row).
func (r *rowSplit) block(b int) (i0, i1 int) {
	i0 = min(b*r.per, r.M)
	return i0, min(i0+r.per, r.M)
}

// splitRows cuts M rows into the nb contiguous blocks a row-wise op runs as tasks over the
// threads (rows of an element-wise op depend on nothing else, so how they are cut changes
// no result).
func splitRows(M int) (nb int, split rowSplit) {
	nb = rowBlocksOf(M)
	return nb, rowSplit{M: M, per: (M + nb - 1) / max(nb, 1)}
}

// rowBlocksOf is the number of blocks splitRows cuts M rows into.
func rowBlocksOf(M int) int { return min(M, 4*Threads()) }

// rowsWork is a row-wise op's cost estimate for parallelRun; parallelRows says whether
// parallelRun would use more than one thread for it.
func rowsWork(M, D int) int { return 4 * M * D }

func parallelRows(M, D int) bool { return runsParallel(rowBlocksOf(M), rowsWork(M, D)) }

func rmsnormRows[T Float](x, w, out, inv []T, D int, eps float64, i0, i1 int) {
	for i := i0; i < i1; i++ {
		xr := x[i*D : (i+1)*D]
		var ss float64
		for _, v := range xr {
			ss += float64(v) * float64(v)
		}
		r := T(1 / math.Sqrt(ss/float64(D)+eps))
		if inv != nil {
			inv[i] = r
		}
		o := out[i*D : (i+1)*D][:len(xr)]
		w := w[:len(xr)]
		for j, v := range xr {
			o[j] = w[j] * (v * r)
		}
	}
}

// rmsnormBwd adds the input gradient of rmsnorm to dx:
// dx += r·(w⊙dy) − r³·x·Σ(w⊙dy·x)/D.
func rmsnormBwd[T Float](dy, x, w, inv, dx []T, M, D int) {
	if !parallelRows(M, D) {
		rmsnormBwdRows(dy, x, w, inv, dx, D, 0, M)
		return
	}
	nb, split := splitRows(M)
	runPooled(&rmsnormBwdTasks, nb, rowsWork(M, D),
		rmsnormBwdTask[T]{dy: dy, x: x, w: w, inv: inv, dx: dx, D: D, rowSplit: split})
}

// rmsnormBwdTask is one rmsnormBwd call over blocks of rows.
type rmsnormBwdTask[T Float] struct {
	dy, x, w, inv, dx []T
	D                 int
	rowSplit
}

var rmsnormBwdTasks sync.Pool

func (t *rmsnormBwdTask[T]) do(b int) {
	if i0, i1 := t.block(b); i0 < i1 {
		rmsnormBwdRows(t.dy, t.x, t.w, t.inv, t.dx, t.D, i0, i1)
	}
}

func rmsnormBwdRows[T Float](dy, x, w, inv, dx []T, D, i0, i1 int) {
	for i := i0; i < i1; i++ {
		xr := x[i*D : (i+1)*D]
		d := dy[i*D : (i+1)*D][:len(xr)]
		o := dx[i*D : (i+1)*D][:len(xr)]
		w := w[:len(xr)]
		r := float64(inv[i])
		var dot float64
		for j, v := range xr {
			dot += float64(w[j]*d[j]) * float64(v)
		}
		c := T(r * r * r * dot / float64(D))
		rr := T(r)
		for j, v := range xr {
			o[j] += rr*w[j]*d[j] - c*v
		}
	}
}

// rope rotates each head of x [M, H*hd] in place by its position (pairs (j, j+hd/2)).
// With inverse set, it applies the transpose (used for gradients).
func rope[T Float](x []T, M, H, hd int, pos func(i int) int, cos, sin []T, inverse bool) {
	half := hd / 2
	for i := 0; i < M; i++ {
		p := pos(i)
		c := cos[p*half : (p+1)*half]
		s := sin[p*half : (p+1)*half]
		for h := 0; h < H; h++ {
			v := x[(i*H+h)*hd : (i*H+h+1)*hd]
			a, b := v[:half], v[half:hd][:half]
			c := c[:half]
			s := s[:half]
			if inverse {
				for j := range a {
					x1, x2 := a[j], b[j]
					a[j] = x1*c[j] + x2*s[j]
					b[j] = x2*c[j] - x1*s[j]
				}
			} else {
				for j := range a {
					x1, x2 := a[j], b[j]
					a[j] = x1*c[j] - x2*s[j]
					b[j] = x2*c[j] + x1*s[j]
				}
			}
		}
	}
}

func silu(x float64) float64 { return x / (1 + math.Exp(-x)) }

// swiglu computes out = silu(g)·u.
// Element i depends on element i of the inputs alone, so the work is cut in chunks over the
// threads (an exp per element is worth it from a few thousand elements).
func swiglu[T Float](g, u, out []T) {
	n := len(g)
	runPooled(&swigluTasks, (n+elementwiseChunk-1)/elementwiseChunk, n*expWork,
		swigluTask[T]{g: g, u: u[:n], out: out[:n]})
}

// swigluTask is one swiglu call over chunks of elements.
type swigluTask[T Float] struct{ g, u, out []T }

var swigluTasks sync.Pool

func (t *swigluTask[T]) do(c int) {
	i0, i1 := c*elementwiseChunk, min((c+1)*elementwiseChunk, len(t.g))
	if gf, ok := any(t.g).([]float32); ok {
		swigluF32(gf[i0:i1], any(t.u).([]float32)[i0:i1], any(t.out).([]float32)[i0:i1])
		return
	}
	swigluGo(t.g[i0:i1], t.u[i0:i1], t.out[i0:i1])
}

// swigluGo is swiglu's loop in Go.
func swigluGo[T Float](g, u, out []T) {
	u, out = u[:len(g)], out[:len(g)]
	for i, x := range g {
		out[i] = T(silu(float64(x))) * u[i]
	}
}

// elementwiseChunk is how many elements one task of an element-wise op takes, and expWork
// the rough cost of one element with an exp in parallelFor's units.
const (
	elementwiseChunk = 2048
	expWork          = 16
)

// swigluBwd computes dg and du from d(out), in chunks over the threads like swiglu.
func swigluBwd[T Float](g, u, dout, dg, du []T) {
	n := len(g)
	runPooled(&swigluBwdTasks, (n+elementwiseChunk-1)/elementwiseChunk, n*expWork,
		swigluBwdTask[T]{g: g, u: u[:n], dout: dout[:n], dg: dg[:n], du: du[:n]})
}

// swigluBwdTask is one swigluBwd call over chunks of elements.
type swigluBwdTask[T Float] struct{ g, u, dout, dg, du []T }

var swigluBwdTasks sync.Pool

func (t *swigluBwdTask[T]) do(c int) {
	i0, i1 := c*elementwiseChunk, min((c+1)*elementwiseChunk, len(t.g))
	if gf, ok := any(t.g).([]float32); ok {
		swigluBwdF32(gf[i0:i1], any(t.u).([]float32)[i0:i1], any(t.dout).([]float32)[i0:i1],
			any(t.dg).([]float32)[i0:i1], any(t.du).([]float32)[i0:i1])
		return
	}
	swigluBwdGo(t.g[i0:i1], t.u[i0:i1], t.dout[i0:i1], t.dg[i0:i1], t.du[i0:i1])
}

// swigluBwdGo is swigluBwd's loop in Go.
func swigluBwdGo[T Float](g, u, dout, dg, du []T) {
	n := len(g)
	u, dout, dg, du = u[:n], dout[:n], dg[:n], du[:n]
	for i := range n {
		xf := float64(g[i])
		sg := 1 / (1 + math.Exp(-xf))
		d := float64(dout[i])
		du[i] = T(d * xf * sg)
		dg[i] = T(d * float64(u[i]) * sg * (1 + xf*(1-sg)))
	}
}

// logSumExp returns log Σ exp(x) computed in float64.
func logSumExp[T Float](x []T) float64 {
	mx := math.Inf(-1)
	for _, v := range x {
		if float64(v) > mx {
			mx = float64(v)
		}
	}
	e := getF64(len(x))
	defer putF64(e)
	expAffine(x, 1, mx, *e)
	var s float64
	for _, v := range *e {
		s += v
	}
	return mx + math.Log(s)
}

// expAffineGo sets out[i] = math.Exp(float64(x[i])*scale - shift), in Go.
func expAffineGo[T Float](x []T, scale, shift float64, out []float64) {
	out = out[:len(x)]
	for i, v := range x {
		out[i] = math.Exp(float64(v)*scale - shift)
	}
}

// f64Pool holds vocabulary-sized float64 work arrays (the exponentials of a row of
// logits) between uses.
var f64Pool bufPool[float64]

func getF64(n int) *[]float64 { return f64Pool.get(n) }

func putF64(p *[]float64) { f64Pool.put(p) }

// weightedSumFrom is weightedSum for the elements d ≥ d0 of acc, in Go.
func weightedSumFrom[T Float](acc []float64, p []float64, v []T, ldv, d0 int) {
	if d0 >= len(acc) {
		return
	}
	for j, pj := range p {
		row := v[j*ldv+d0 : j*ldv+len(acc)]
		a := acc[d0:]
		for d, x := range row {
			a[d] += pj * float64(x)
		}
	}
}

// expGo sets x[i] = math.Exp(x[i]), in Go.
func expGo(x []float64) {
	for i, v := range x {
		x[i] = math.Exp(v)
	}
}

// attnGradFrom is attnGrad for the lanes d ≥ d0, in Go.
func attnGradFrom[T Float](dqa, ds, p []float64, q, dout, k []T, ldk int, dk, dv []T, d0 int) {
	hd := len(dqa)
	if d0 >= hd {
		return
	}
	for j := range p {
		kr := k[j*ldk : j*ldk+hd]
		dkr, dvr := dk[j*ldk:j*ldk+hd], dv[j*ldk:j*ldk+hd]
		for d := d0; d < hd; d++ {
			dqa[d] += ds[j] * float64(kr[d])
			dkr[d] += T(ds[j] * float64(q[d]))
			dvr[d] += T(p[j] * float64(dout[d]))
		}
	}
}

// dotRowsGo sets out[j] = dot(a, b[j·ldb:j·ldb+len(a)]) for j < len(out), one dot at a
// time.
func dotRowsGo[T Float](out, a, b []T, ldb int) {
	for j := range out {
		out[j] = dot(a, b[j*ldb:j*ldb+len(a)])
	}
}
