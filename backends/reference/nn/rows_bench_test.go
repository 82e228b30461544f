package nn

import (
	"fmt"
	"math/rand/v2"
	"testing"
)

// BenchmarkDecodeProducts times the matrix products of one decoding step of a
// loops/tiny-shaped layer stack (4 layers and the head) for M rows: the row-stable
// products of batched decoding (rows) against the packed SGEMM (packed).
func BenchmarkDecodeProducts(b *testing.B) {
	shapes := [][2]int{{256, 256}, {128, 256}, {128, 256}, {256, 256}, {768, 256}, {768, 256}, {256, 768}}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 {
		x := make([]float32, n)
		for i := range x {
			x[i] = float32(r.NormFloat64())
		}
		return x
	}
	var ws [][]float32
	for _, s := range shapes {
		ws = append(ws, fill(s[0]*s[1]))
	}
	head := fill(512 * 256)
	for _, M := range []int{1, 8, 32} {
		A := fill(M * 768)
		C := make([]float32, M*768)
		for _, kind := range []string{"rows", "packed"} {
			b.Run(fmt.Sprintf("%s/M=%d", kind, M), func(b *testing.B) {
				mm := matMulTRows[float32]
				if kind == "packed" {
					mm = MatMulT[float32]
				}
				for range b.N {
					for range 4 {
						for i, s := range shapes {
							mm(C, A, ws[i], M, s[0], s[1], false)
						}
					}
					mm(C, A, head, M, 512, 256, false)
				}
				b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*M), "ns/row")
			})
		}
	}
}
