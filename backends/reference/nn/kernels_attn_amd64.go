//go:build amd64

package nn

import "golang.org/x/sys/cpu"

// wsumF64 adds the weighted value rows of attention in float64 (kernels_attn_amd64.s):
// acc[16·b+d] += Σ_{j<n} p[j]·float64(v[j·ldv+16·b+d]) for b < nb, d < 16, j in order,
// with the bits of the scalar loop.
//
//go:noescape
func wsumF64(n int, p *float64, v *float32, ldv int, nb int, acc *float64)

// wsum2F64 is wsumF64(n, p0, v, ldv, nb, acc0) and wsumF64(n, p1, v, ldv, nb, acc1) in
// one pass over the rows of v, with their bits.
//
//go:noescape
func wsum2F64(n int, p0, p1 *float64, v *float32, ldv int, nb int, acc0, acc1 *float64)

// wsum2F64x64 is wsum2F64 over nb blocks of 64 lanes, with AVX-512F.
//
//go:noescape
func wsum2F64x64(n int, p0, p1 *float64, v *float32, ldv int, nb int, acc0, acc1 *float64)

// wsum2F64x64W is wsum2F64x64 on values already widened to float64 (rows ldv apart),
// with its bits.
//
//go:noescape
func wsum2F64x64W(n int, p0, p1 *float64, v *float64, ldv int, nb int, acc0, acc1 *float64)

// divF64x8 sets x[i] /= d for i < 8·n8 with AVX-512F, with the scalar loop's bits.
//
//go:noescape
func divF64x8(n8 int, x *float64, d float64)

// divBy sets x[i] /= d for every i, with the bits of the scalar loop.
func divBy(x []float64, d float64) {
	i := 0
	if n8 := len(x) / 8; hasWsum512 && n8 > 0 {
		divF64x8(n8, &x[0], d)
		i = 8 * n8
	}
	for ; i < len(x); i++ {
		x[i] /= d
	}
}

var (
	hasWsum    = cpu.X86.HasAVX
	hasWsum512 = cpu.X86.HasAVX512F
)

// weightedSum2 is weightedSum(acc0, p0, v, ldv) and weightedSum(acc1, p1, v, ldv) with
// their bits (len(p1) = len(p0), len(acc1) = len(acc0)): two heads that share their value
// rows, read once for both.
func weightedSum2[T Float](acc0, acc1, p0, p1 []float64, v []T, ldv int) {
	hd, d0 := len(acc0), 0
	if vf, ok := any(v).([]float32); ok && hasWsum && len(p0) > 0 {
		n := len(p0)
		_, _, _ = vf[(n-1)*ldv+hd-1], p1[n-1], acc1[hd-1]
		if nb := hd / 64; hasWsum512 && nb > 0 {
			wsum2F64x64(n, &p0[0], &p1[0], &vf[0], ldv, nb, &acc0[0], &acc1[0])
			d0 = 64 * nb
		}
		if nb := (hd - d0) / 16; nb > 0 {
			wsum2F64(n, &p0[0], &p1[0], &vf[d0], ldv, nb, &acc0[d0], &acc1[d0])
			d0 += 16 * nb
		}
	}
	weightedSumFrom(acc0, p0, v, ldv, d0)
	weightedSumFrom(acc1, p1, v, ldv, d0)
}

// wideValues says whether weightedSum2W has a kernel for head size hd: prompt chunks then
// widen their values to float64 once per layer (headMajorWide) rather than once per row
// read.
func wideValues(hd int) bool { return hasWsum512 && hd%64 == 0 }

// weightedSum2W is weightedSum2 on values already widened to float64 (v[j·ldv+d] =
// float64 of the value), with its bits: each lane is the same multiply then add, j in
// order.
func weightedSum2W(acc0, acc1, p0, p1, v []float64, ldv int) {
	hd, d0 := len(acc0), 0
	if n, nb := len(p0), hd/64; hasWsum512 && n > 0 && nb > 0 {
		_, _, _ = v[(n-1)*ldv+64*nb-1], p1[n-1], acc1[64*nb-1]
		wsum2F64x64W(n, &p0[0], &p1[0], &v[0], ldv, nb, &acc0[0], &acc1[0])
		d0 = 64 * nb
	}
	weightedSumFrom(acc0, p0, v, ldv, d0)
	weightedSumFrom(acc1, p1, v, ldv, d0)
}

// weightedSum sets acc[d] += Σ_{j<len(p)} p[j]·float64(v[j·ldv+d]) for d < len(acc), j in
// order (a multiply then an add per term, as written here), so every element has the same
// bits on every path.
func weightedSum[T Float](acc []float64, p []float64, v []T, ldv int) {
	hd := len(acc)
	nb := 0
	if vf, ok := any(v).([]float32); ok && hasWsum && len(p) > 0 {
		nb = hd / 16
		if nb > 0 {
			_ = vf[(len(p)-1)*ldv+nb*16-1]
			wsumF64(len(p), &p[0], &vf[0], ldv, nb, &acc[0])
		}
	}
	weightedSumFrom(acc, p, v, ldv, nb*16)
}

// attnGradF32 is attnBwd's inner loop over n rows of keys and lanes d < 4·hd4
// (kernels_attn_amd64.s), with the bits of the Go loop.
//
// attnGradF32x32 is attnGradF32 for head sizes that are a multiple of 32, with the bits of
// attnGradF32: dqa stays in registers across the rows, dk and dv take eight lanes a store.
//
//go:noescape
func attnGradF32x32(n, hd32 int, ds, p *float64, q, dout, k *float32, ldk int, dqa *float64, dk, dv *float32)

//go:noescape
func attnGradF32(n, hd4 int, ds, p *float64, q, dout, k *float32, ldk int, dqa *float64, dk, dv *float32)

// attnGrad adds, for rows j < len(p) of k, dk and dv (ldk apart), in order:
// dqa[d] += ds[j]·float64(k[j][d]), dk[j][d] += T(ds[j]·float64(q[d])) and
// dv[j][d] += T(p[j]·float64(dout[d])) for d < len(dqa).
func attnGrad[T Float](dqa, ds, p []float64, q, dout, k []T, ldk int, dk, dv []T) {
	hd, d0 := len(dqa), 0
	if qf, ok := any(q).([]float32); ok && hasWsum && len(p) > 0 && hd >= 4 {
		n, hd4 := len(p), hd/4
		last := (n-1)*ldk + 4*hd4 - 1
		kf, dkf, dvf, df := any(k).([]float32), any(dk).([]float32), any(dv).([]float32), any(dout).([]float32)
		_, _, _, _, _, _ = kf[last], dkf[last], dvf[last], qf[4*hd4-1], df[4*hd4-1], ds[n-1]
		if hd%32 == 0 {
			attnGradF32x32(n, hd/32, &ds[0], &p[0], &qf[0], &df[0], &kf[0], ldk, &dqa[0], &dkf[0], &dvf[0])
		} else {
			attnGradF32(n, hd4, &ds[0], &p[0], &qf[0], &df[0], &kf[0], ldk, &dqa[0], &dkf[0], &dvf[0])
		}
		d0 = 4 * hd4
	}
	attnGradFrom(dqa, ds, p, q, dout, k, ldk, dk, dv, d0)
}
