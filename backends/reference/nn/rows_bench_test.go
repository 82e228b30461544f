package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// normalF32 returns n float32 draws of the standard normal distribution from r.
func normalF32(r *rand.Rand, n int) []float32 {
	x := make([]float32, n)
	for i := range x {
		x[i] = float32(r.NormFloat64())
	}
	return x
}

// BenchmarkDecodeProducts times the matrix products of one decoding step of a
// loops/tiny-shaped layer stack (4 layers and the head) for M rows: the row-stable
// products of batched decoding on weights as they are (rows) and prepacked (prepacked, the
// decode path of models up to maxPackedModelBytes) against the SGEMM packing per call
// (packed).
func BenchmarkDecodeProducts(b *testing.B) {
	shapes := [][2]int{{256, 256}, {128, 256}, {128, 256}, {256, 256}, {768, 256}, {768, 256}, {256, 768}}
	r := rand.New(rand.NewPCG(1, 2))
	fill := func(n int) []float32 { return normalF32(r, n) }
	var ws [][]float32
	for _, s := range shapes {
		ws = append(ws, fill(s[0]*s[1]))
	}
	head := fill(512 * 256)
	var pks []*packedNT
	for i, s := range shapes {
		pks = append(pks, packNT(ws[i], s[0], s[1]))
	}
	headPk := packNT(head, 512, 256)
	for _, M := range []int{1, 8, 32} {
		A := fill(M * 768)
		C := make([]float32, M*768)
		for _, kind := range []string{"rows", "prepacked", "packed"} {
			b.Run(fmt.Sprintf("%s/M=%d", kind, M), func(b *testing.B) {
				if kind == "prepacked" {
					if packedKernel == nil {
						b.Skip("no packed decode kernel on this CPU")
					}
					for range b.N {
						for range 4 {
							for i := range shapes {
								sgemmNTPacked(C, A, pks[i], M, false)
							}
						}
						sgemmNTPacked(C, A, headPk, M, false)
					}
					b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*M), "ns/row")
					return
				}
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

// TestMatMulTRowsIsRowStable checks that every row of matMulTRows equals that row computed
// alone, bit for bit, for any number of rows and threads (with and without the four-row
// kernels), that the reduced kernels give
// the bits of sdot2x4 and sgemmNTSmall's reduction, and that the result is close to the
// float64 product.
func TestMatMulTRowsIsRowStable(t *testing.T) {
	defer SetThreads(Threads())
	r := rand.New(rand.NewPCG(3, 4))
	for _, sh := range [][2]int{{256, 256}, {37, 19}, {5, 8}, {130, 768}, {64, 4}, {3, 3}, {768, 8}, {8, 256}, {21, 16}} { // N, K: LoRA ranks too
		N, K := sh[0], sh[1]
		B := make([]float32, N*K)
		for i := range B {
			B[i] = float32(r.NormFloat64())
		}
		const M = 35
		A := make([]float32, M*K)
		for i := range A {
			A[i] = float32(r.NormFloat64())
		}
		alone := make([]float32, M*N)
		for i := 0; i < M; i++ {
			matMulTRows(alone[i*N:(i+1)*N], A[i*K:(i+1)*K], B, 1, N, K, false)
		}
		for i := 0; i < M; i++ {
			for j := 0; j < N; j++ {
				var want float64
				for k := 0; k < K; k++ {
					want += float64(A[i*K+k]) * float64(B[j*K+k])
				}
				if d := math.Abs(want - float64(alone[i*N+j])); d > 1e-4*(1+math.Abs(want)) {
					t.Fatalf("N=%d K=%d [%d,%d]: %g, float64 %g", N, K, i, j, alone[i*N+j], want)
				}
			}
		}
		if activeKernel.dot != nil {
			small := make([]float32, 4*N)
			sgemmNTSmall(activeKernel, small, A[:4*K], B, 4, N, K, false)
			require.Equal(t, alone[:4*N], small, "N=%d K=%d: the reduced kernels differ from sdot2x4", N, K)
		}
		// adding to C: each element is C's plus the product's, one float32 add
		c0 := make([]float32, M*N)
		for i := range c0 {
			c0[i] = float32(r.NormFloat64())
		}
		sum := append([]float32(nil), c0...)
		matMulTRows(sum, A, B, M, N, K, true)
		for i := range sum {
			require.Equal(t, math.Float32bits(c0[i]+alone[i]), math.Float32bits(sum[i]), "N=%d K=%d element %d with acc", N, K, i)
		}
		for _, threads := range []int{1, 2, 5} {
			SetThreads(threads)
			// the two-row kernel alone, and each narrower row kernel, give the widest one's bits
			best := rowTile
			for _, tile := range append(rowTiles(), 0) {
				rowTile = tile
				got := make([]float32, M*N)
				matMulTRows(got, A, B, M, N, K, false)
				rowTile = best
				require.Equal(t, alone, got, "N=%d K=%d threads=%d with the %d-row kernel", N, K, threads, tile)
			}
			for _, m := range []int{2, 3, 8, 9, M} {
				got := make([]float32, m*N)
				matMulTRows(got, A[:m*K], B, m, N, K, false)
				require.Equal(t, alone[:m*N], got, "N=%d K=%d M=%d threads=%d", N, K, m, threads)
				off := M - m // the same rows at other positions of a batch
				got = make([]float32, m*N)
				matMulTRows(got, A[off*K:], B, m, N, K, false)
				require.Equal(t, alone[off*N:], got, "N=%d K=%d M=%d threads=%d (last rows)", N, K, m, threads)
			}
		}
	}
}
