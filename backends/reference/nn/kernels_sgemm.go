package nn

import (
	"os"
	"strings"
	"sync"
)

// The float32 matrix products run through a cache-blocked, packed SGEMM in the style of
// BLIS/GotoBLAS: for each block of kc (≤ gemmKC) steps of the inner dimension, a block of
// op(A) is packed into mr-row strips (k-major) and a panel of op(B) into nr-column strips,
// and a register-tiled micro-kernel computes each mr×nr tile of C. The micro-kernel is
// assembly (AVX-512 or AVX2+FMA, chosen at start-up from the CPU features) on amd64 and
// the generic pure-Go kernels of kernels.go elsewhere. Every element of C is owned by one tile and summed over k in
// order, one kc block after the other, so results do not depend on the number of
// threads. Work is split over goroutines by (row block, column group) tiles.

// sgemmKernel is one micro-kernel and its tile shape.
type sgemmKernel struct {
	name   string
	mr, nr int
	// fn computes C[mr×nr] = (accum ? C : 0) + Σ_{k<kc} a[k·mr+i]·b[k·nr+j], where c is
	// C[0,0] of a row-major tile with row stride ldc.
	fn func(kc int, a, b, c *float32, ldc int, accum bool)
	// fnA, when set, is fn reading a full mr-row panel of a row-major A in place (rows lda
	// apart) instead of packed, with fn's bits.
	fnA func(kc int, a *float32, lda int, b, c *float32, ldc int, accum bool)
	// dot, when set, is the unpacked small-M kernel for A·Bᵀ (see sgemmNTSmall).
	dot func(k8 int, a0, a1, b *float32, ldb int, out *[64]float32)
}

var (
	// kernelGo stands for the portable pure-Go kernels in kernels.go (no fn: the float32
	// products take the generic path), used where no assembly kernel applies.
	kernelGo         = &sgemmKernel{name: "go"}
	availableKernels = []*sgemmKernel{kernelGo}
	activeKernel     = kernelGo
)

// selectKernelFromEnv honours LOOPS_SGEMM_KERNEL (go, avx2 or avx512; a prefix of the
// kernel name) so benchmarks can compare kernels. Unknown or unavailable names are ignored.
func selectKernelFromEnv() {
	v := os.Getenv("LOOPS_SGEMM_KERNEL")
	if v == "" {
		return
	}
	for _, k := range availableKernels {
		if strings.HasPrefix(k.name, v) {
			activeKernel = k
		}
	}
}

// KernelName names the float32 micro-kernel in use (for benchmark reports).
func KernelName() string { return activeKernel.name }

const (
	gemmKC   = 256  // inner-dimension block: an mr×kc and a kc×nr strip fit in L1
	gemmMC   = 144  // rows of C per compute task (a multiple of 6 and 12); A block in L2
	gemmNC   = 2048 // columns of packed B per panel (L3)
	gemmCols = 128  // columns of C per compute task
	// smallM is the largest row count for which A·Bᵀ uses the unpacked dot kernel
	// (decoding): packing B would cost as much as the product itself.
	smallM = 4
)

// packPool holds the packing buffers between products.
var packPool bufPool[float32]

// sgemm computes C (+)= op(A)·op(B) for C[M,N] with row stride ldc, where op(A)[i,k] is
// A[i·ars+k·acs] and op(B)[k,j] is B[k·brs+j·bcs].
func sgemm(kn *sgemmKernel, M, N, K int, A []float32, ars, acs int, B []float32, brs, bcs int, C []float32, ldc int, acc bool) {
	if M == 0 || N == 0 {
		return
	}
	if K == 0 {
		if !acc {
			for i := 0; i < M; i++ {
				clear(C[i*ldc : i*ldc+N])
			}
		}
		return
	}
	mr, nr := kn.mr, kn.nr
	mp := (M + mr - 1) / mr
	kcMax := min(K, gemmKC)
	ncMax := min((N+nr-1)/nr*nr, gemmNC)
	pa, pb := packPool.get(mp*mr*kcMax), packPool.get(ncMax*kcMax)
	g := sgemmCalls.Get().(*sgemmCall)
	*g = sgemmCall{kn: kn, M: M, N: N, A: A, ars: ars, acs: acs, B: B, brs: brs, bcs: bcs, C: C, ldc: ldc,
		bufA: *pa, bufB: *pb, mc: max(mr, gemmMC/mr*mr), colStrips: max(1, gemmCols/nr),
		inPlaceA: kn.fnA != nil && acs == 1} // a row-major A is read in place; only a last partial panel is packed
	for pc := 0; pc < K; pc += gemmKC {
		g.pc, g.kc = pc, min(gemmKC, K-pc)
		g.accum = acc || pc > 0
		if !g.inPlaceA {
			parallelRun(mp, M*g.kc*4, (*sgemmPackA)(g))
		} else if s := mp - 1; M-s*mr < mr {
			(*sgemmPackA)(g).do(s)
		}
		for jc := 0; jc < N; jc += gemmNC {
			g.jc, g.nc = jc, min(gemmNC, N-jc)
			g.ns = (g.nc + nr - 1) / nr
			if bcs == 1 { // rows of B in place: pack by rows, reading each row in order
				parallelRun((g.kc+packRowsPerTask-1)/packRowsPerTask, g.nc*g.kc*4, (*sgemmPackBRows)(g))
			} else {
				parallelRun(g.ns, g.nc*g.kc*4, (*sgemmPackB)(g))
			}
			rb := (M + g.mc - 1) / g.mc
			g.cg = (g.ns + g.colStrips - 1) / g.colStrips
			parallelRun(rb*g.cg, M*g.nc*g.kc, (*sgemmTiles)(g))
		}
	}
	*g = sgemmCall{}
	sgemmCalls.Put(g)
	packPool.put(pa)
	packPool.put(pb)
}

// sgemmCall is one sgemm call's operands and blocking, shared by its parallel regions: the
// regions' tasks are this struct under other names (sgemmPackA, sgemmPackB, sgemmTiles),
// and calls take it from a pool, so a product allocates nothing.
type sgemmCall struct {
	kn             *sgemmKernel
	M, N           int
	A, B, C        []float32
	ars, acs       int
	brs, bcs       int
	ldc            int
	bufA, bufB     []float32 // packed A strips, packed B strips
	mc, colStrips  int       // rows and column strips of C per tile task
	inPlaceA       bool
	pc, kc         int // the current block of the inner dimension
	jc, nc, ns, cg int // the current panel of B: first column, columns, strips, column groups
	accum          bool
}

var sgemmCalls = sync.Pool{New: func() any { return new(sgemmCall) }}

// sgemmPackA packs A's strip s (mr rows) of the current inner block.
type sgemmPackA sgemmCall

func (g *sgemmPackA) do(s int) {
	mr, kc := g.kn.mr, g.kc
	packA(g.bufA[s*mr*kc:(s+1)*mr*kc], g.A, g.ars, g.acs, s*mr, min(mr, g.M-s*mr), g.pc, kc, mr)
}

// sgemmPackB packs B's strip s (nr columns) of the current panel and inner block.
type sgemmPackB sgemmCall

func (g *sgemmPackB) do(s int) {
	nr, kc := g.kn.nr, g.kc
	packB(g.bufB[s*nr*kc:(s+1)*nr*kc], g.B, g.brs, g.bcs, g.jc+s*nr, min(nr, g.nc-s*nr), g.pc, kc, nr)
}

// sgemmPackBRows packs rows [r·packRowsPerTask, …) of the current inner block of a
// row-major B (bcs = 1) into every strip of the current panel. Packing strip by strip
// would read 64 bytes from each of kc rows a row stride apart, a cache miss per row that
// the prefetchers, which stop at page boundaries, do not hide.
type sgemmPackBRows sgemmCall

// packRowsPerTask is how many rows of B one sgemmPackBRows task packs.
const packRowsPerTask = 16

func (g *sgemmPackBRows) do(r int) {
	k0 := r * packRowsPerTask
	packRows(g.bufB, g.B, g.brs, g.jc, g.nc, g.pc, g.kc, k0, min(k0+packRowsPerTask, g.kc), g.kn.nr)
}

// packRows writes rows [k0, k1) of the inner block pc..pc+kc of a row-major B (bcs = 1),
// columns jc..jc+nc, into the ⌈nc/nr⌉ strips of dst (strip s at dst[s·nr·kc:], packB's
// layout), zero-padding the last strip, reading each row of B in order.
func packRows(dst, B []float32, brs, jc, nc, pc, kc, k0, k1, nr int) {
	full := nc / nr // strips without padding
	for k := k0; k < k1; k++ {
		src := B[(pc+k)*brs+jc:][:nc]
		d := dst[k*nr:]
		if nr == 16 { // the AVX2 kernel's strips: 64-byte moves, not calls of copy
			for s := range full {
				*(*[16]float32)(d[s*16*kc:]) = [16]float32(src[s*16:])
			}
		} else {
			for s := range full {
				copy(d[s*nr*kc:][:nr], src[s*nr:])
			}
		}
		if rest := nc - full*nr; rest > 0 {
			p := d[full*nr*kc:][:nr]
			clear(p[copy(p, src[full*nr:]):])
		}
	}
}

// sgemmTiles computes tile task t: row block t/cg by column group t%cg of the current panel.
type sgemmTiles sgemmCall

func (g *sgemmTiles) do(t int) {
	kn, M, N, A, C, ldc := g.kn, g.M, g.N, g.A, g.C, g.ldc
	mr, nr, kc, mc, ars, pc := kn.mr, kn.nr, g.kc, g.mc, g.ars, g.pc
	bi, bj := t/g.cg, t%g.cg
	var tmp [12 * 32]float32
	for s := bj * g.colStrips; s < min((bj+1)*g.colStrips, g.ns); s++ {
		j0 := g.jc + s*nr
		nj := min(nr, N-j0)
		bp := &g.bufB[s*nr*kc]
		for i0 := bi * mc; i0 < min((bi+1)*mc, M); i0 += mr {
			ni := min(mr, M-i0)
			if g.inPlaceA && ni == mr {
				a := &A[i0*ars+pc]
				if nj == nr {
					kernelTileA(kn, kc, a, ars, bp, &C[i0*ldc+j0], ldc, g.accum)
					continue
				}
				kernelTileA(kn, kc, a, ars, bp, &tmp[0], nr, false)
			} else {
				ap := &g.bufA[i0*kc]
				if ni == mr && nj == nr {
					kernelTile(kn, kc, ap, bp, &C[i0*ldc+j0], ldc, g.accum)
					continue
				}
				kernelTile(kn, kc, ap, bp, &tmp[0], nr, false)
			}
			for ii := 0; ii < ni; ii++ {
				c := C[(i0+ii)*ldc+j0 : (i0+ii)*ldc+j0+nj]
				t := tmp[ii*nr : ii*nr+nj]
				if g.accum {
					for jj, v := range t {
						c[jj] += v
					}
				} else {
					copy(c, t)
				}
			}
		}
	}
}

// packA writes rows i0..i0+ni of op(A), columns pc..pc+kc, as dst[k·mr+ii], zero-padding
// rows ni..mr.
func packA(dst, A []float32, ars, acs, i0, ni, pc, kc, mr int) {
	dst = dst[:kc*mr]
	if acs == 1 && ni == 6 && mr == 6 { // the AVX2 kernel's full panels: six rows in step
		r0, r1, r2 := A[i0*ars+pc:][:kc], A[(i0+1)*ars+pc:][:kc], A[(i0+2)*ars+pc:][:kc]
		r3, r4, r5 := A[(i0+3)*ars+pc:][:kc], A[(i0+4)*ars+pc:][:kc], A[(i0+5)*ars+pc:][:kc]
		for k := range kc {
			d := dst[k*6 : k*6+6 : k*6+6]
			d[0], d[1], d[2], d[3], d[4], d[5] = r0[k], r1[k], r2[k], r3[k], r4[k], r5[k]
		}
		return
	}
	if acs == 1 {
		for ii := 0; ii < ni; ii++ {
			src := A[(i0+ii)*ars+pc:][:kc]
			for k, v := range src {
				dst[k*mr+ii] = v
			}
		}
		if ni < mr {
			for k := 0; k < kc; k++ {
				clear(dst[k*mr+ni : k*mr+mr])
			}
		}
		return
	}
	for k := 0; k < kc; k++ {
		d := dst[k*mr : k*mr+mr]
		if ars == 1 && ni == 6 && mr == 6 { // six floats: a call of copy would cost more
			s := A[i0+(pc+k)*acs:][:6:6]
			d[0], d[1], d[2], d[3], d[4], d[5] = s[0], s[1], s[2], s[3], s[4], s[5]
			continue
		} else if ars == 1 {
			copy(d, A[i0+(pc+k)*acs:][:ni])
		} else {
			for ii := 0; ii < ni; ii++ {
				d[ii] = A[(i0+ii)*ars+(pc+k)*acs]
			}
		}
		clear(d[ni:])
	}
}

// transpose8 is the vector kernel of packB for a transposed B (transpose8x8Strips; nil:
// none).
var transpose8 func(dst, src *float32, lds, k8 int)

// packB writes columns j0..j0+nj of op(B), rows pc..pc+kc, as dst[k·nr+jj], zero-padding
// columns nj..nr.
func packB(dst, B []float32, brs, bcs, j0, nj, pc, kc, nr int) {
	dst = dst[:kc*nr]
	if bcs == 1 {
		packRows(dst, B, brs, j0, nj, pc, kc, 0, kc, nr)
		return
	}
	if brs == 1 {
		jj := 0
		if k8 := kc / 8; nr == 16 && transpose8 != nil && k8 > 0 { // eight rows at a time
			for ; jj+8 <= nj; jj += 8 {
				src := B[(j0+jj)*bcs+pc:]
				_, _ = src[7*bcs+kc-1], dst[(8*k8-1)*16+jj+7] // what the kernel reads and writes
				transpose8(&dst[jj], &src[0], bcs, k8)
				for r := range 8 {
					for k := 8 * k8; k < kc; k++ {
						dst[k*16+jj+r] = src[r*bcs+k]
					}
				}
			}
		}
		for ; jj+4 <= nj; jj += 4 {
			s0 := B[(j0+jj)*bcs+pc:][:kc]
			s1 := B[(j0+jj+1)*bcs+pc:][:kc]
			s2 := B[(j0+jj+2)*bcs+pc:][:kc]
			s3 := B[(j0+jj+3)*bcs+pc:][:kc]
			for k := range s0 {
				d := dst[k*nr+jj : k*nr+jj+4 : k*nr+jj+4]
				d[0], d[1], d[2], d[3] = s0[k], s1[k], s2[k], s3[k]
			}
		}
		for ; jj < nj; jj++ {
			src := B[(j0+jj)*bcs+pc:][:kc]
			for k, v := range src {
				dst[k*nr+jj] = v
			}
		}
	} else {
		for k := 0; k < kc; k++ {
			for jj := 0; jj < nj; jj++ {
				dst[k*nr+jj] = B[(pc+k)*brs+(j0+jj)*bcs]
			}
		}
	}
	if nj < nr {
		for k := 0; k < kc; k++ {
			clear(dst[k*nr+nj : k*nr+nr])
		}
	}
}

// sgemmNTSmall computes C[M,N] (+)= A[M,K]·B[N,K]ᵀ for a few rows of A without packing:
// the dot kernel reads rows of B in place (each B row once per pair of A rows, from cache
// within a task). Each element is Σ of 8 lane sums (fixed order) plus the k tail.
func sgemmNTSmall(kn *sgemmKernel, C, A, B []float32, M, N, K int, acc bool) {
	const rowsPerTask = 64
	k8 := K / 8
	nt := (N + rowsPerTask - 1) / rowsPerTask
	parallelFor(nt, M*N*K, func(t int) {
		var out [64]float32
		j0, j1 := t*rowsPerTask, min(t*rowsPerTask+rowsPerTask, N)
		for i := 0; i < M; i += 2 {
			i1 := min(i+1, M-1)
			a0, a1 := A[i*K:i*K+K], A[i1*K:i1*K+K]
			for j := j0; j < j1; {
				w, ldb := 4, K
				if j1-j < 4 {
					w, ldb = 1, 0 // one row of B at a time (repeated in all four slots)
				}
				if k8 > 0 {
					kernelDot(kn, k8, &a0[0], &a1[0], &B[j*K], ldb, &out)
				}
				for r := 0; r < 2 && i+r < M; r++ {
					a := a0
					if r == 1 {
						a = a1
					}
					c := C[(i+r)*N+j : (i+r)*N+j+w]
					for jj := range c {
						var s float32
						if k8 > 0 {
							l := out[8*(r*4+jj) : 8*(r*4+jj)+8]
							s = ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]))
						}
						b := B[(j+jj)*K : (j+jj)*K+K]
						for k := 8 * k8; k < K; k++ {
							s += a[k] * b[k]
						}
						if acc {
							c[jj] += s
						} else {
							c[jj] = s
						}
					}
				}
				j += w
			}
		}
	})
}

// Float32 entry points used by MatMulT, MatMul and MatMulTN.

func sgemmNT(C, A, B []float32, M, N, K int, acc bool) {
	kn := activeKernel
	if M <= smallM && kn.dot != nil {
		sgemmNTSmall(kn, C, A, B, M, N, K, acc)
		return
	}
	sgemm(kn, M, N, K, A, K, 1, B, 1, K, C, N, acc)
}

func sgemmNN(C, A, B []float32, M, N, K int, acc bool) {
	sgemm(activeKernel, M, N, K, A, K, 1, B, N, 1, C, N, acc)
}

func sgemmTN(C, A, B []float32, M, N, K int) {
	sgemm(activeKernel, M, N, K, A, 1, M, B, N, 1, C, N, true)
}
