package nn

import (
	"fmt"
	"testing"
)

// BenchmarkAttnRows times the attention kernels of one pair of heads over n keys of a
// cache with rows ldk floats apart (Qwen3-0.6B: KVD 1024 in the cache, 128 = the head size in
// step's head-major copy), in GFLOP/s.
func BenchmarkAttnRows(b *testing.B) {
	const hd = 128
	for _, c := range [][2]int{{64, 1024}, {700, 1024}, {700, 128}} {
		n, ldk := c[0], c[1]
		k := make([]float32, n*ldk)
		for i := range k {
			k[i] = float32(i%13) * 0.01
		}
		a0, a1 := k[:hd], k[hd:2*hd]
		o0, o1 := make([]float32, n), make([]float32, n)
		p0, p1 := make([]float64, n), make([]float64, n)
		for i := range p0 {
			p0[i], p1[i] = 1/float64(i+1), 1/float64(i+2)
		}
		acc0, acc1 := make([]float64, hd), make([]float64, hd)
		b.Run(fmt.Sprintf("dotRows2/n=%d/ld=%d", n, ldk), func(b *testing.B) {
			for range b.N {
				dotRows2(o0, o1, a0, a1, k, ldk)
			}
			b.ReportMetric(4*float64(n*hd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		b.Run(fmt.Sprintf("weightedSum2/n=%d/ld=%d", n, ldk), func(b *testing.B) {
			for range b.N {
				weightedSum2(acc0, acc1, p0, p1, k, ldk)
			}
			b.ReportMetric(4*float64(n*hd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
		kw := make([]float64, len(k))
		headMajor(kw, k, 1, 1, len(k))
		b.Run(fmt.Sprintf("weightedSum2W/n=%d/ld=%d", n, ldk), func(b *testing.B) {
			for range b.N {
				weightedSum2W(acc0, acc1, p0, p1, kw, ldk)
			}
			b.ReportMetric(4*float64(n*hd)*float64(b.N)/b.Elapsed().Seconds()/1e9, "GFLOP/s")
		})
	}
}
