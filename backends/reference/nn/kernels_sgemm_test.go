package nn

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

var sgemmShapes = [][3]int{ // M, N, K
	{1, 1, 1}, {7, 13, 5}, {1, 17, 9}, {2, 3, 1000}, {3, 5, 7}, {4, 33, 17}, {5, 16, 8},
	{6, 16, 256}, {12, 32, 256}, {13, 33, 257}, {25, 47, 513}, {100, 70, 300},
	{64, 2100, 40}, {150, 20, 20}, {3, 9, 4099}, {9, 5, 3000}, {37, 19, 1}, {8, 1, 31},
	{300, 129, 64},
}

func randSlice(r *rand.Rand, n int) []float32 {
	s := make([]float32, n)
	for i := range s {
		s[i] = float32(r.NormFloat64())
	}
	return s
}

// checkClose compares got against the float64 reference ref with a tolerance scaled by
// abs (Σ|a·b| of each element): 4·√K·2⁻²⁴ of it, far below the worst-case K·2⁻²⁴ bound.
func checkClose(t *testing.T, what string, got []float32, ref, abs []float64, K int) {
	t.Helper()
	tol := 4 * math.Sqrt(float64(K)) * 0x1p-24
	worst := 0.0
	for i := range got {
		e := math.Abs(float64(got[i])-ref[i]) / (abs[i] + 1e-30)
		if e > worst {
			worst = e
		}
		if e > tol {
			t.Fatalf("%s: element %d = %v, want %v (relative error %.3g > %.3g)", what, i, got[i], ref[i], e, tol)
		}
	}
}

func withKernel(k *sgemmKernel, f func()) {
	old := activeKernel
	activeKernel = k
	defer func() { activeKernel = old }()
	f()
}

func TestSgemmShapes(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 7))
	for _, kn := range availableKernels {
		for _, sh := range sgemmShapes {
			M, N, K := sh[0], sh[1], sh[2]
			name := fmt.Sprintf("%s/%dx%dx%d", kn.name, M, N, K)
			A, B := randSlice(r, M*K), randSlice(r, N*K)
			C0 := randSlice(r, M*N)
			// op(A)[i,k], op(B)[k,j] for the three layouts
			type layout struct {
				name string
				a, b func(i, k int) float64
				run  func(C []float32, acc bool)
			}
			At := make([]float32, K*M) // A stored [K,M]
			for i := 0; i < M; i++ {
				for k := 0; k < K; k++ {
					At[k*M+i] = A[i*K+k]
				}
			}
			Bn := make([]float32, K*N) // B stored [K,N]
			for j := 0; j < N; j++ {
				for k := 0; k < K; k++ {
					Bn[k*N+j] = B[j*K+k]
				}
			}
			ref, abs := make([]float64, M*N), make([]float64, M*N)
			for i := 0; i < M; i++ {
				for j := 0; j < N; j++ {
					var s, a float64
					for k := 0; k < K; k++ {
						p := float64(A[i*K+k]) * float64(B[j*K+k])
						s += p
						a += math.Abs(p)
					}
					ref[i*N+j], abs[i*N+j] = s, a
				}
			}
			refAcc, absAcc := make([]float64, M*N), make([]float64, M*N)
			for i := range ref {
				refAcc[i] = ref[i] + float64(C0[i])
				absAcc[i] = abs[i] + math.Abs(float64(C0[i]))
			}
			withKernel(kn, func() {
				for _, acc := range []bool{false, true} {
					want, wabs := ref, abs
					if acc {
						want, wabs = refAcc, absAcc
					}
					C := append([]float32(nil), C0...)
					MatMulT(C, A, B, M, N, K, acc)
					checkClose(t, name+fmt.Sprintf("/MatMulT acc=%v", acc), C, want, wabs, K)
					C = append([]float32(nil), C0...)
					MatMul(C, A, Bn, M, N, K, acc)
					checkClose(t, name+fmt.Sprintf("/MatMul acc=%v", acc), C, want, wabs, K)
				}
				C := append([]float32(nil), C0...)
				MatMulTN(C, At, Bn, M, N, K)
				checkClose(t, name+"/MatMulTN", C, refAcc, absAcc, K)
			})
		}
	}
}

// TestSgemmThreadIndependent checks that results are bit-identical for any thread count.
func TestSgemmThreadIndependent(t *testing.T) {
	defer SetThreads(Threads())
	r := rand.New(rand.NewPCG(3, 4))
	for _, sh := range [][3]int{{3, 500, 300}, {200, 300, 600}, {64, 2100, 40}} {
		M, N, K := sh[0], sh[1], sh[2]
		A, B := randSlice(r, M*K), randSlice(r, N*K)
		var first []float32
		for _, th := range []int{1, 2, 3, 7} {
			SetThreads(th)
			C := make([]float32, M*N)
			MatMulT(C, A, B, M, N, K, false)
			MatMul(C, A, B[:K*N], M, N, K, true)
			MatMulTN(C, A[:K*M], B[:K*N], M, N, K)
			if first == nil {
				first = C
				continue
			}
			for i := range C {
				if math.Float32bits(C[i]) != math.Float32bits(first[i]) {
					t.Fatalf("%v threads=%d: element %d = %v, with 1 thread %v", sh, th, i, C[i], first[i])
				}
			}
		}
	}
}

func TestSgemmKernelNames(t *testing.T) {
	if KernelName() == "" || len(availableKernels) == 0 {
		t.Fatal("no kernel")
	}
	t.Logf("active float32 kernel: %s (available %d)", KernelName(), len(availableKernels))
}

func TestDotF32(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 9))
	for _, n := range []int{0, 1, 7, 15, 16, 17, 31, 64, 128, 129, 1000} {
		a, b := randSlice(r, n), randSlice(r, n)
		var ref, abs float64
		for k := range a {
			ref += float64(a[k]) * float64(b[k])
			abs += math.Abs(float64(a[k]) * float64(b[k]))
		}
		checkClose(t, fmt.Sprintf("dot n=%d", n), []float32{dot(a, b)}, []float64{ref}, []float64{abs}, max(n, 1))
	}
}

// TestSgemmConcurrent runs products from several goroutines at once (shared buffer pool)
// and checks each against the same product run alone.
func TestSgemmConcurrent(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	shapes := [][3]int{{3, 300, 200}, {130, 90, 300}, {40, 700, 64}, {4, 33, 17}}
	type job struct{ A, B, want []float32 }
	jobs := make([]job, len(shapes))
	for i, sh := range shapes {
		M, N, K := sh[0], sh[1], sh[2]
		jobs[i] = job{A: randSlice(r, M*K), B: randSlice(r, N*K), want: make([]float32, M*N)}
		MatMulT(jobs[i].want, jobs[i].A, jobs[i].B, M, N, K, false)
	}
	errs := make(chan error, 4*len(shapes))
	done := make(chan struct{})
	for g := 0; g < 4; g++ {
		go func() {
			defer func() { done <- struct{}{} }()
			for rep := 0; rep < 5; rep++ {
				for i, sh := range shapes {
					M, N, K := sh[0], sh[1], sh[2]
					C := make([]float32, M*N)
					MatMulT(C, jobs[i].A, jobs[i].B, M, N, K, false)
					for e := range C {
						if C[e] != jobs[i].want[e] {
							errs <- fmt.Errorf("shape %v element %d: %v, alone %v", sh, e, C[e], jobs[i].want[e])
							return
						}
					}
				}
			}
		}()
	}
	for g := 0; g < 4; g++ {
		<-done
	}
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
}

// TestWeightedSumBits requires the attention's weighted sum of value rows (an assembly
// kernel for 16-wide blocks where the CPU has one, Go for the rest) to give every element
// the bits of the plain loop acc[d] += p[j]·float64(v[j·ldv+d]), j in order, for head
// sizes with and without a tail and strides wider than a row.
func TestWeightedSumBits(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	for _, hd := range []int{1, 5, 16, 24, 64, 72, 128} {
		for _, n := range []int{0, 1, 3, 17, 80} {
			ldv := hd + 8
			v := make([]float32, n*ldv)
			for i := range v {
				v[i] = float32(r.NormFloat64())
			}
			p := make([]float64, n)
			for i := range p {
				p[i] = r.Float64()
			}
			want := make([]float64, hd)
			got := make([]float64, hd)
			for d := range want {
				want[d] = r.NormFloat64()
				got[d] = want[d]
			}
			for j := range p {
				for d := range want {
					want[d] += p[j] * float64(v[j*ldv+d])
				}
			}
			weightedSum(got, p, v, ldv)
			for d := range want {
				require.Equal(t, math.Float64bits(want[d]), math.Float64bits(got[d]), "hd %d n %d element %d", hd, n, d)
			}
		}
	}
}

// TestPackBTransposedKernel: packing a transposed B (brs = 1) through the vector transpose
// writes the strip the scalar loop writes, for partial strips (8–15 rows: the rows past
// eight go through the loop) and column counts that are not a multiple of eight.
func TestPackBTransposedKernel(t *testing.T) {
	if transpose8 == nil {
		t.Skip("no vector transpose on this CPU")
	}
	r := rand.New(rand.NewPCG(11, 1))
	const bcs, nr = 300, 16
	B := randSlice(r, 40*bcs)
	for _, nj := range []int{16, 15, 9, 8, 7, 1} {
		for _, kc := range []int{256, 255, 17, 8, 7, 1} {
			for _, at := range [][2]int{{0, 0}, {3, 5}, {24, 40}} { // first column j0, first row pc
				j0, pc := at[0], at[1]
				want := make([]float32, kc*nr)
				got := make([]float32, kc*nr)
				for i := range want {
					want[i], got[i] = float32(i), float32(-i) // padding must be written too
				}
				func() {
					defer func(k func(dst, src *float32, lds, k8 int)) { transpose8 = k }(transpose8)
					transpose8 = nil
					packB(want, B, 1, bcs, j0, nj, pc, kc, nr)
				}()
				packB(got, B, 1, bcs, j0, nj, pc, kc, nr)
				require.Equal(t, want, got, "nj %d kc %d j0 %d pc %d", nj, kc, j0, pc)
			}
		}
	}
}
