//go:build amd64

package nn

import "golang.org/x/sys/cpu"

// wsumF64 adds the weighted value rows of attention in float64 (kernels_attn_amd64.s):
// acc[16·b+d] += Σ_{j<n} p[j]·float64(v[j·ldv+16·b+d]) for b < nb, d < 16, j in order,
// with the bits of the scalar loop.
//
//go:noescape
func wsumF64(n int, p *float64, v *float32, ldv int, nb int, acc *float64)

var hasWsum = cpu.X86.HasAVX

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
