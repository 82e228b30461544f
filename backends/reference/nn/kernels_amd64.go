//go:build amd64

package nn

import "golang.org/x/sys/cpu"

// Assembly micro-kernels (kernels_amd64.s). Each computes one register tile
// C[mr×nr] (+)= Σ_k a[k·mr+i]·b[k·nr+j] from packed panels, summing k in order.
//
//go:noescape
func sgemmKernel6x16(kc int, a, b, c *float32, ldc int, accum bool)

// sgemmKernel6x16u is sgemmKernel6x16 reading six rows of A in place, lda floats apart.
//
//go:noescape
func sgemmKernel6x16u(kc int, a *float32, lda int, b, c *float32, ldc int, accum bool)

//go:noescape
func sgemmKernel12x32(kc int, a, b, c *float32, ldc int, accum bool)

// sdot2x4 computes 8-lane partial dot products of two rows of A with four rows of B
// (row stride ldb) over the first 8·k8 elements; see kernels_sgemm.go.
//
//go:noescape
func sdot2x4(k8 int, a0, a1, b *float32, ldb int, out *[64]float32)

// sdotAVX2 returns Σ a[k]·b[k] over the first 16·n16 elements.
//
//go:noescape
func sdotAVX2(n16 int, a, b *float32) float32

// sdotRowsAVX2 sets out[r] = sdotAVX2(n16, a, b + r·ldb) for r < nrows.
//
//go:noescape
func sdotRowsAVX2(n16 int, a, b *float32, ldb, nrows int, out *float32)

// sdotRows2AVX2 sets out0[r] = sdotAVX2(n16, a0, b + r·ldb) and out1[r] = sdotAVX2(n16,
// a1, b + r·ldb) for r < nrows, two rows of b at a time.
//
//go:noescape
func sdotRows2AVX2(n16 int, a0, a1, b *float32, ldb, nrows int, out0, out1 *float32)

// sdotRows2x4AVX2 is sdotRows2AVX2 for 4·ng rows, four rows a group, with its bits.
//
//go:noescape
func sdotRows2x4AVX2(n16 int, a0, a1, b *float32, ldb, ng int, out0, out1 *float32)

// sdotRows2x4AVX512 is sdotRows2x4AVX2 with AVX-512F (16-lane accumulators), with its
// bits.
//
//go:noescape
func sdotRows2x4AVX512(n16 int, a0, a1, b *float32, ldb, ng int, out0, out1 *float32)

// hasDot512 says whether dotRows2 takes sdotRows2x4AVX512.
var hasDot512 = cpu.X86.HasAVX512F

// transpose8x8Strips transposes eight rows of src (lds floats apart) into eight columns
// of a packed 16-wide B strip, eight columns of src at a time (k8 times).
//
//go:noescape
func transpose8x8Strips(dst, src *float32, lds, k8 int)

var (
	kernelAVX2   = &sgemmKernel{name: "avx2-6x16", mr: 6, nr: 16, fn: sgemmKernel6x16, fnA: sgemmKernel6x16u, dot: sdot2x4}
	kernelAVX512 = &sgemmKernel{name: "avx512-12x32", mr: 12, nr: 32, fn: sgemmKernel12x32, dot: sdot2x4}
)

func init() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		dotF32 = dotAVX2
		transpose8 = transpose8x8Strips
		availableKernels = append(availableKernels, kernelAVX2)
		activeKernel = kernelAVX2
		if cpu.X86.HasAVX512F {
			availableKernels = append(availableKernels, kernelAVX512)
			activeKernel = kernelAVX512
		}
	}
	selectKernelFromEnv()
}

func dotAVX2(a, b []float32) float32 {
	n := len(a)
	b = b[:n]
	var s float32
	if n >= 16 {
		s = sdotAVX2(n/16, &a[0], &b[0])
	}
	for k := n &^ 15; k < n; k++ {
		s += a[k] * b[k]
	}
	return s
}

// dotRows sets out[j] = dot(a, b[j·ldb:j·ldb+len(a)]) for j < len(out), with dot's bits:
// float32 rows through one call of the vector kernel, then each row's tail as dotAVX2 adds
// it.
func dotRows[T Float](out, a, b []T, ldb int) {
	n, K := len(out), len(a)
	a32, ok := any(a).([]float32)
	if !ok || dotF32 == nil || K < 16 || n == 0 {
		dotRowsGo(out, a, b, ldb)
		return
	}
	b32, o32 := any(b).([]float32), any(out).([]float32)
	_ = b32[(n-1)*ldb+K-1]
	sdotRowsAVX2(K/16, &a32[0], &b32[0], ldb, n, &o32[0])
	for j := range o32 {
		row := b32[j*ldb : j*ldb+K]
		for k := K &^ 15; k < K; k++ {
			o32[j] += a32[k] * row[k]
		}
	}
}

// kernelTile, kernelTileA and kernelDot call kn's fn, fnA and dot directly, not through
// their function values, so that the tiles and lane buffers their callers pass stay on the
// callers' stacks (a buffer passed to a function value escapes to the heap).
func kernelTile(kn *sgemmKernel, kc int, a, b, c *float32, ldc int, accum bool) {
	switch kn {
	case kernelAVX512:
		sgemmKernel12x32(kc, a, b, c, ldc, accum)
	case kernelAVX2:
		sgemmKernel6x16(kc, a, b, c, ldc, accum)
	default:
		panic("nn: no micro-kernel " + kn.name)
	}
}

func kernelTileA(kn *sgemmKernel, kc int, a *float32, lda int, b, c *float32, ldc int, accum bool) {
	if kn != kernelAVX2 {
		panic("nn: no in-place micro-kernel " + kn.name)
	}
	sgemmKernel6x16u(kc, a, lda, b, c, ldc, accum)
}

func kernelDot(kn *sgemmKernel, k8 int, a0, a1, b *float32, ldb int, out *[64]float32) {
	if kn.dot == nil {
		panic("nn: no dot kernel " + kn.name)
	}
	sdot2x4(k8, a0, a1, b, ldb, out)
}

// dotRows2 is dotRows(o0, a0, b, ldb) and dotRows(o1, a1, b, ldb) with their bits, the two
// vectors (two heads that share their keys) in one pass over the rows of b.
func dotRows2[T Float](o0, o1, a0, a1, b []T, ldb int) {
	n, K := len(o0), len(a0)
	a32, ok := any(a0).([]float32)
	if !ok || dotF32 == nil || K < 16 || n == 0 {
		dotRowsGo(o0, a0, b, ldb)
		dotRowsGo(o1, a1, b, ldb)
		return
	}
	a132, b32 := any(a1).([]float32)[:K], any(b).([]float32)
	p0, p1 := any(o0).([]float32), any(o1).([]float32)[:n]
	_ = b32[(n-1)*ldb+K-1]
	ng := n / 4
	switch {
	case ng == 0:
	case hasDot512:
		sdotRows2x4AVX512(K/16, &a32[0], &a132[0], &b32[0], ldb, ng, &p0[0], &p1[0])
	default:
		sdotRows2x4AVX2(K/16, &a32[0], &a132[0], &b32[0], ldb, ng, &p0[0], &p1[0])
	}
	if r := 4 * ng; r < n {
		sdotRows2AVX2(K/16, &a32[0], &a132[0], &b32[r*ldb], ldb, n-r, &p0[r], &p1[r])
	}
	if K%16 == 0 {
		return
	}
	for j := range n {
		row := b32[j*ldb : j*ldb+K]
		for k := K &^ 15; k < K; k++ {
			p0[j] += a32[k] * row[k]
		}
		for k := K &^ 15; k < K; k++ {
			p1[j] += a132[k] * row[k]
		}
	}
}
