package nn

import (
	"math"
	"math/rand/v2"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSwigluF32Bits checks that swiglu's float32 path (the vector kernel on amd64) gives
// the bits of the scalar Go loop for every input: random values over many magnitudes,
// zeros, infinities, NaN, values at and past the kernel's ±708 range and subnormals, at
// every alignment and length (groups of four and a tail).
func TestSwigluF32Bits(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 707.99, -707.99, 708, -708, 708.01, -708.01,
		709, -709, 750, -750, 1e30, -1e30, math.MaxFloat32, -math.MaxFloat32, 1e-45, -1e-45, 1e-39,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	const n = 1 << 16
	g, u := make([]float32, n), make([]float32, n)
	for i := range g {
		switch i % 7 {
		case 0:
			g[i] = special[r.IntN(len(special))]
		case 1:
			g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-3)))
		default:
			g[i] = float32(r.NormFloat64() * 4)
		}
		u[i] = float32(r.NormFloat64())
	}
	want := make([]float32, n)
	swigluGo(g, u, want)
	for _, lo := range []int{0, 1, 3} {
		for _, hi := range []int{n, n - 1, n - 2, lo + 7, lo + 4} {
			got := make([]float32, n)
			swigluF32(g[lo:hi], u[lo:hi], got[lo:hi])
			require.Equal(t, bitsOf(want[lo:hi]), bitsOf(got[lo:hi]), "elements %d..%d", lo, hi)
		}
	}
	got := make([]float32, n)
	swiglu(g, u, got)
	require.Equal(t, bitsOf(want), bitsOf(got))
}

// TestExpInPlaceBits checks that expInPlace (the vector kernel on amd64) gives math.Exp's
// bits for every input, at every alignment and length.
func TestExpInPlaceBits(t *testing.T) {
	r := rand.New(rand.NewPCG(7, 8))
	special := []float64{0, math.Copysign(0, -1), 1, -1, 707.99, -707.99, 708, -708, 708.01, -708.01,
		709.7, 709.8, -745, -746, -800, 1e300, -1e300, 5e-324, math.Inf(1), math.Inf(-1), math.NaN()}
	const n = 1 << 16
	x := make([]float64, n)
	for i := range x {
		switch i % 5 {
		case 0:
			x[i] = special[r.IntN(len(special))]
		case 1:
			x[i] = r.NormFloat64() * math.Pow(10, float64(r.IntN(7)-4))
		default:
			x[i] = -r.ExpFloat64() * 10
		}
	}
	want := append([]float64(nil), x...)
	expGo(want)
	for _, lo := range []int{0, 1, 3} {
		for _, hi := range []int{n, n - 1, n - 2, lo + 7, lo + 4, lo} {
			got := append([]float64(nil), x...)
			expInPlace(got[lo:hi])
			for i := lo; i < hi; i++ {
				if math.Float64bits(got[i]) != math.Float64bits(want[i]) && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
					t.Fatalf("exp(%v) = %v, math.Exp %v (elements %d..%d)", x[i], got[i], want[i], lo, hi)
				}
			}
		}
	}
}

// TestSwigluBwdF32Bits checks that swigluBwd's float32 path gives the bits of the scalar
// Go loop for every input, at every alignment and length.
func TestSwigluBwdF32Bits(t *testing.T) {
	r := rand.New(rand.NewPCG(9, 10))
	special := []float32{0, float32(math.Copysign(0, -1)), 1, -1, 707.99, -707.99, 708, -708, 708.01, -708.01,
		750, -750, 1e30, -1e30, 1e-45, float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	const n = 1 << 16
	g, u, d := make([]float32, n), make([]float32, n), make([]float32, n)
	for i := range g {
		if i%7 == 0 {
			g[i] = special[r.IntN(len(special))]
		} else {
			g[i] = float32(r.NormFloat64() * math.Pow(10, float64(r.IntN(5)-2)))
		}
		u[i], d[i] = float32(r.NormFloat64()), float32(r.NormFloat64())
	}
	wg, wu := make([]float32, n), make([]float32, n)
	swigluBwdGo(g, u, d, wg, wu)
	for _, lo := range []int{0, 1, 3} {
		for _, hi := range []int{n, n - 1, n - 2, lo + 7, lo + 4} {
			gg, gu := make([]float32, n), make([]float32, n)
			swigluBwdF32(g[lo:hi], u[lo:hi], d[lo:hi], gg[lo:hi], gu[lo:hi])
			require.Equal(t, bitsOf(wg[lo:hi]), bitsOf(gg[lo:hi]), "dg, elements %d..%d", lo, hi)
			require.Equal(t, bitsOf(wu[lo:hi]), bitsOf(gu[lo:hi]), "du, elements %d..%d", lo, hi)
		}
	}
}

// TestAttnGradBits checks that attnGrad (the vector kernel on amd64) gives the bits of the
// Go loop, for head sizes with and without a lane tail.
func TestAttnGradBits(t *testing.T) {
	r := rand.New(rand.NewPCG(11, 12))
	f32 := func(n int) []float32 { return normalF32(r, n) }
	f64 := func(n int) []float64 {
		x := make([]float64, n)
		for i := range x {
			x[i] = r.NormFloat64()
		}
		return x
	}
	for _, hd := range []int{128, 96, 64, 32, 8, 6, 3} { // multiples of 32 take attnGradF32x32
		const n, ldk = 37, 150
		q, do, k := f32(hd), f32(hd), f32(n*ldk)
		ds, p := f64(n), f64(n)
		dqa0, dk0, dv0 := f64(hd), f32(n*ldk), f32(n*ldk)
		wq, wk, wv := append([]float64(nil), dqa0...), append([]float32(nil), dk0...), append([]float32(nil), dv0...)
		attnGradFrom(wq, ds, p, q, do, k, ldk, wk, wv, 0)
		gq, gk, gv := append([]float64(nil), dqa0...), append([]float32(nil), dk0...), append([]float32(nil), dv0...)
		attnGrad(gq, ds, p, q, do, k, ldk, gk, gv)
		require.Equal(t, wq, gq, "hd=%d dq", hd)
		require.Equal(t, bitsOf(wk), bitsOf(gk), "hd=%d dk", hd)
		require.Equal(t, bitsOf(wv), bitsOf(gv), "hd=%d dv", hd)
	}
}

// TestExpAffineBits checks that expAffine (the vector kernel on amd64) gives the bits of
// math.Exp(float64(x)*scale - shift) for every input, at every alignment and length.
func TestExpAffineBits(t *testing.T) {
	r := rand.New(rand.NewPCG(13, 14))
	special := []float32{0, float32(math.Copysign(0, -1)), 700, -700, 720, -720, 1e30, -1e30,
		float32(math.Inf(1)), float32(math.Inf(-1)), float32(math.NaN())}
	const n = 1 << 15
	x := make([]float32, n)
	for i := range x {
		if i%9 == 0 {
			x[i] = special[r.IntN(len(special))]
		} else {
			x[i] = float32(r.NormFloat64() * 8)
		}
	}
	for _, sc := range [][2]float64{{1, 3.5}, {1 / 0.7, 12.25}, {1, 0}, {2, -1}} {
		want := make([]float64, n)
		expAffineGo(x, sc[0], sc[1], want)
		for _, lo := range []int{0, 1, 3} {
			for _, hi := range []int{n, n - 1, n - 2, lo + 7, lo + 4, lo} {
				got := make([]float64, n)
				expAffine(x[lo:hi], sc[0], sc[1], got[lo:hi])
				for i := lo; i < hi; i++ {
					if math.Float64bits(got[i]) != math.Float64bits(want[i]) && !(math.IsNaN(got[i]) && math.IsNaN(want[i])) {
						t.Fatalf("scale %v shift %v: exp(%v) = %v, want %v", sc[0], sc[1], x[i], got[i], want[i])
					}
				}
			}
		}
	}
}

// TestDotRowsBits checks that dotRows gives dot's bits for every row, with and without a
// tail past the vector kernel's 16 lanes.
func TestDotRowsBits(t *testing.T) {
	r := rand.New(rand.NewPCG(15, 16))
	for _, K := range []int{64, 128, 37, 16, 17, 8, 1} {
		const n, ldb = 29, 200
		a, b := make([]float32, K), make([]float32, n*ldb)
		for i := range a {
			a[i] = float32(r.NormFloat64())
		}
		for i := range b {
			b[i] = float32(r.NormFloat64())
		}
		got := make([]float32, n)
		dotRows(got, a, b, ldb)
		for j := range n {
			require.Equal(t, math.Float32bits(dot(a, b[j*ldb:j*ldb+K])), math.Float32bits(got[j]), "K=%d row %d", K, j)
		}
	}
}

// TestDotRows2Bits: dotRows2 gives each of its two vectors dotRows' bits, for row counts
// odd and even and head sizes with and without a tail.
func TestDotRows2Bits(t *testing.T) {
	defer func(v bool) { hasDot512 = v }(hasDot512)
	for _, on := range []bool{hasDot512, false} { // the AVX-512 kernel and AVX2's
		hasDot512 = on
		testDotRows2Bits(t)
	}
}

func testDotRows2Bits(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 18))
	for _, K := range []int{128, 64, 37, 16, 17, 8, 1, 192} {
		for _, n := range []int{1, 2, 3, 4, 5, 8, 29, 30, 31} {
			const ldb = 200
			a0, a1, b := make([]float32, K), make([]float32, K), make([]float32, n*ldb)
			for _, x := range [][]float32{a0, a1, b} {
				for i := range x {
					x[i] = float32(r.NormFloat64())
				}
			}
			w0, w1, g0, g1 := make([]float32, n), make([]float32, n), make([]float32, n), make([]float32, n)
			dotRows(w0, a0, b, ldb)
			dotRows(w1, a1, b, ldb)
			dotRows2(g0, g1, a0, a1, b, ldb)
			require.Equal(t, bitsOf(w0), bitsOf(g0), "K=%d n=%d", K, n)
			require.Equal(t, bitsOf(w1), bitsOf(g1), "K=%d n=%d", K, n)
		}
	}
}

// TestWeightedSum2Bits: weightedSum2 gives each head weightedSum's bits, with and without
// its AVX-512 blocks (an AVX2 machine's path).
func TestWeightedSum2Bits(t *testing.T) {
	defer func(v bool) { hasWsum512 = v }(hasWsum512)
	for _, on := range []bool{hasWsum512, false} {
		hasWsum512 = on
		testWeightedSum2Bits(t)
	}
}

func testWeightedSum2Bits(t *testing.T) {
	r := rand.New(rand.NewPCG(19, 20))
	for _, hd := range []int{128, 64, 80, 200, 40, 16, 8} {
		for _, n := range []int{1, 7, 33} {
			const ldv = 300
			v := make([]float32, n*ldv)
			for i := range v {
				v[i] = float32(r.NormFloat64())
			}
			p0, p1 := make([]float64, n), make([]float64, n)
			w0, w1, g0, g1 := make([]float64, hd), make([]float64, hd), make([]float64, hd), make([]float64, hd)
			for i := range p0 {
				p0[i], p1[i] = r.Float64(), r.Float64()
			}
			for d := range w0 {
				w0[d], w1[d] = r.NormFloat64(), r.NormFloat64()
			}
			copy(g0, w0)
			copy(g1, w1)
			weightedSum(w0, p0, v, ldv)
			weightedSum(w1, p1, v, ldv)
			weightedSum2(g0, g1, p0, p1, v, ldv)
			require.Equal(t, w0, g0, "hd=%d n=%d", hd, n)
			require.Equal(t, w1, g1, "hd=%d n=%d", hd, n)
		}
	}
}

// TestWeightedSum2WBits: weightedSum2W on values widened to float64 gives weightedSum2's
// bits on the float32 values, with and without its AVX-512 blocks.
func TestWeightedSum2WBits(t *testing.T) {
	defer func(v bool) { hasWsum512 = v }(hasWsum512)
	r := rand.New(rand.NewPCG(21, 22))
	for _, on := range []bool{hasWsum512, false} {
		hasWsum512 = on
		for _, hd := range []int{128, 64, 192, 80, 40, 8} {
			for _, n := range []int{1, 7, 33, 300} {
				ldv := hd + 64*(n%2) // head-major rows (ldv = hd) and strided ones
				v := make([]float32, n*ldv)
				for i := range v {
					v[i] = float32(r.NormFloat64())
				}
				vw := make([]float64, len(v))
				headMajor(vw, v, 1, 1, len(v)) // one row of one head: a widening copy
				p0, p1 := make([]float64, n), make([]float64, n)
				for i := range p0 {
					p0[i], p1[i] = r.Float64(), r.Float64()
				}
				w0, w1, g0, g1 := make([]float64, hd), make([]float64, hd), make([]float64, hd), make([]float64, hd)
				for d := range w0 {
					w0[d], w1[d] = r.NormFloat64(), r.NormFloat64()
				}
				copy(g0, w0)
				copy(g1, w1)
				weightedSum2(w0, w1, p0, p1, v, ldv)
				weightedSum2W(g0, g1, p0, p1, vw, ldv)
				require.Equal(t, w0, g0, "hd=%d n=%d avx512=%v", hd, n, on)
				require.Equal(t, w1, g1, "hd=%d n=%d avx512=%v", hd, n, on)
			}
		}
	}
}

// TestHeadMajor: headMajor lays rows out head by head, widening when dst is float64.
func TestHeadMajor(t *testing.T) {
	const n, kh, hd = 3, 2, 4
	src := make([]float32, n*kh*hd)
	for i := range src {
		src[i] = float32(i) + 0.5
	}
	d32, d64 := make([]float32, len(src)), make([]float64, len(src))
	headMajor(d32, src, n, kh, hd)
	headMajor(d64, src, n, kh, hd)
	for j := range n {
		for h := range kh {
			for d := range hd {
				require.Equal(t, src[j*kh*hd+h*hd+d], d32[(h*n+j)*hd+d])
				require.Equal(t, float64(src[j*kh*hd+h*hd+d]), d64[(h*n+j)*hd+d])
			}
		}
	}
}

// TestSoftmax2Bits: softmax2 gives each head the bits of the one-head loop (scalar
// quotients), with and without the AVX-512 division.
func TestSoftmax2Bits(t *testing.T) {
	defer func(v bool) { hasWsum512 = v }(hasWsum512)
	r := rand.New(rand.NewPCG(23, 24))
	one := func(sc []float64, qk []float32, scale float64) {
		mx := maxScaled(sc, qk, scale)
		for j := range sc {
			sc[j] -= mx
		}
		expInPlace(sc)
		var sum float64
		for j := range sc {
			sum += sc[j]
		}
		for j := range sc {
			sc[j] /= sum
		}
	}
	for _, on := range []bool{hasWsum512, false} {
		hasWsum512 = on
		for _, n := range []int{1, 7, 8, 9, 64, 701} {
			qk0, qk1 := make([]float32, n), make([]float32, n)
			for j := range qk0 {
				qk0[j], qk1[j] = float32(r.NormFloat64()*4), float32(r.NormFloat64()*4)
			}
			w0, w1, g0, g1 := make([]float64, n), make([]float64, n), make([]float64, n), make([]float64, n)
			one(w0, qk0, 0.0883883)
			one(w1, qk1, 0.0883883)
			softmax2(g0, g1, qk0, qk1, 0.0883883)
			require.Equal(t, bitsOf64(w0), bitsOf64(g0), "n=%d avx512=%v", n, on)
			require.Equal(t, bitsOf64(w1), bitsOf64(g1), "n=%d avx512=%v", n, on)
		}
	}
}

func bitsOf64(x []float64) []uint64 {
	out := make([]uint64, len(x))
	for i, v := range x {
		out[i] = math.Float64bits(v)
	}
	return out
}
