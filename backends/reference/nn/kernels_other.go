//go:build !amd64

package nn

func init() { selectKernelFromEnv() }

// Without the amd64 row kernels, sgemmNTRows uses the dot kernel (kernels_rows_amd64.go).
var (
	hasRowDot  = false
	rowTile    = 0
	hasWsum512 = false // no AVX-512 attention kernel
	hasDot512  = false
)

func rowTiles() []int { return nil }

func rowDotTile(k8 int, a *float32, lda int, b *float32, ldb int, ng int, out *float32) {
	panic("nn: no row kernels")
}

func rowDot2(k8 int, a0, a1, b *float32, ldb int, out *[8]float32) { panic("nn: no row kernels") }

func rowDot1(k8 int, a0, b *float32, ldb int, out *[8]float32) { panic("nn: no row kernels") }

func rowDot8(k8 int, a, b *float32, ldb int, ng int, c *float32, acc bool) {
	panic("nn: no row kernels")
}

// divBy sets x[i] /= d for every i.
func divBy(x []float64, d float64) {
	for i := range x {
		x[i] /= d
	}
}

// wideValues says whether weightedSum2W has a kernel for head size hd (none here).
func wideValues(hd int) bool { return false }

// weightedSum2W is weightedSum2 on values already widened to float64, with its bits.
func weightedSum2W(acc0, acc1, p0, p1, v []float64, ldv int) {
	weightedSumFrom(acc0, p0, v, ldv, 0)
	weightedSumFrom(acc1, p1, v, ldv, 0)
}

// weightedSum sets acc[d] += Σ_{j<len(p)} p[j]·float64(v[j·ldv+d]) for d < len(acc), j in
// order.
func weightedSum[T Float](acc []float64, p []float64, v []T, ldv int) {
	weightedSumFrom(acc, p, v, ldv, 0)
}

// swigluF32 is swiglu's loop over one chunk for float32 (in Go here).
func swigluF32(g, u, out []float32) { swigluGo(g, u, out) }

// expInPlace sets x[i] = math.Exp(x[i]).
func expInPlace(x []float64) { expGo(x) }

// swigluBwdF32 is swigluBwd's loop over one chunk for float32 (in Go here).
func swigluBwdF32(g, u, dout, dg, du []float32) { swigluBwdGo(g, u, dout, dg, du) }

// attnGrad adds, for rows j < len(p) of k, dk and dv (ldk apart), in order:
// dqa[d] += ds[j]·float64(k[j][d]), dk[j][d] += T(ds[j]·float64(q[d])) and
// dv[j][d] += T(p[j]·float64(dout[d])) for d < len(dqa).
func attnGrad[T Float](dqa, ds, p []float64, q, dout, k []T, ldk int, dk, dv []T) {
	attnGradFrom(dqa, ds, p, q, dout, k, ldk, dk, dv, 0)
}

// expAffine sets out[i] = math.Exp(float64(x[i])*scale - shift).
func expAffine[T Float](x []T, scale, shift float64, out []float64) {
	expAffineGo(x, scale, shift, out)
}

// dotRows sets out[j] = dot(a, b[j·ldb:j·ldb+len(a)]) for j < len(out).
func dotRows[T Float](out, a, b []T, ldb int) { dotRowsGo(out, a, b, ldb) }

// dotRows2 is dotRows(o0, a0, b, ldb) and dotRows(o1, a1, b, ldb).
func dotRows2[T Float](o0, o1, a0, a1, b []T, ldb int) {
	dotRowsGo(o0, a0, b, ldb)
	dotRowsGo(o1, a1, b, ldb)
}

// weightedSum2 is weightedSum(acc0, p0, v, ldv) and weightedSum(acc1, p1, v, ldv).
func weightedSum2[T Float](acc0, acc1, p0, p1 []float64, v []T, ldv int) {
	weightedSumFrom(acc0, p0, v, ldv, 0)
	weightedSumFrom(acc1, p1, v, ldv, 0)
}

func rowDotTileInto(k8 int, a *float32, lda int, b *float32, ldb int, ng int, c *float32, ldc int, acc bool) bool {
	return false
}

// Without AVX2, the products multiply the weights as they are (packed.go).
var packedKernel *sgemmKernel

func packedRow(kc int, a *float32, b *float32, bs int, c *float32, accum bool) {
	panic("nn: no packed decode kernels")
}

// Without assembly kernels the float32 products take the generic path, never these.

func kernelTile(kn *sgemmKernel, kc int, a, b, c *float32, ldc int, accum bool) {
	panic("nn: no micro-kernels")
}

func kernelTileA(kn *sgemmKernel, kc int, a *float32, lda int, b, c *float32, ldc int, accum bool) {
	panic("nn: no micro-kernels")
}

func kernelDot(kn *sgemmKernel, k8 int, a0, a1, b *float32, ldb int, out *[64]float32) {
	panic("nn: no micro-kernels")
}

// hasWiden is false: widenBF16 widens in Go.
const hasWiden = false

func widenBF16AVX2(dst *float32, src *uint16, n int) { panic("nn: no widen kernel") }

func rowDot8BF16(k8 int, a *float32, b *uint16, ldb int, ng int, c *float32, acc bool) {
	panic("nn: no row kernels")
}
