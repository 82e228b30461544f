//go:build amd64

package nn

import "golang.org/x/sys/cpu"

// sdot2x4r is sdot2x4 with the lane sums reduced (kernels_rows_amd64.s).
//
//go:noescape
func sdot2x4r(k8 int, a0, a1, b *float32, ldb int, out *[8]float32)

// sdot1x4r is sdot2x4r for one row of A.
//
//go:noescape
func sdot1x4r(k8 int, a0, b *float32, ldb int, out *[8]float32)

// sdot4x4r is sdot2x4r for four rows of A (lda apart) and ng groups of four rows of B
// (ldb apart), out holding 16 results per group; each load of B serves the four rows of
// A. It needs AVX-512VL for its registers.
//
//go:noescape
func sdot4x4r(k8 int, a *float32, lda int, b *float32, ldb int, ng int, out *float32)

// sdot3x4r is sdot4x4r for three rows of A (12 results per group), in AVX2's registers.
//
//go:noescape
func sdot3x4r(k8 int, a *float32, lda int, b *float32, ldb int, ng int, out *float32)

// sdot3x4c is sdot3x4r storing its results into C (row stride ldc), or adding them to C
// when acc is set, instead of into a buffer.
//
//go:noescape
func sdot3x4c(k8 int, a *float32, lda int, b *float32, ldb int, ng int, c *float32, ldc int, acc bool)

// The row kernels are called directly (not through function values) so that the
// buffers they write stay on the caller's stack.
var (
	hasRowDot = cpu.X86.HasAVX2 && cpu.X86.HasFMA
	rowTile   = bestRowTile()
)

// bestRowTile is the widest row kernel the CPU has: four rows with AVX-512VL's 32
// registers, three with AVX2's 16.
func bestRowTile() int {
	switch {
	case hasRowDot && cpu.X86.HasAVX512F && cpu.X86.HasAVX512VL:
		return 4
	case hasRowDot:
		return 3
	}
	return 0
}

// rowTiles are the row-kernel widths this CPU can run, for tests.
func rowTiles() []int {
	switch rowTile {
	case 4:
		return []int{4, 3}
	case 3:
		return []int{3}
	}
	return nil
}

// rowDotTileInto is rowDotTile writing into C (row stride ldc; adding when acc is set),
// when the CPU's widest kernel can; it reports whether it did.
func rowDotTileInto(k8 int, a *float32, lda int, b *float32, ldb int, ng int, c *float32, ldc int, acc bool) bool {
	if rowTile != 3 {
		return false
	}
	sdot3x4c(k8, a, lda, b, ldb, ng, c, ldc, acc)
	return true
}

func rowDotTile(k8 int, a *float32, lda int, b *float32, ldb int, ng int, out *float32) {
	if rowTile == 4 {
		sdot4x4r(k8, a, lda, b, ldb, ng, out)
	} else {
		sdot3x4r(k8, a, lda, b, ldb, ng, out)
	}
}

func rowDot2(k8 int, a0, a1, b *float32, ldb int, out *[8]float32) {
	sdot2x4r(k8, a0, a1, b, ldb, out)
}

func rowDot1(k8 int, a0, b *float32, ldb int, out *[8]float32) { sdot1x4r(k8, a0, b, ldb, out) }

// sdot1x8c is sdot1x4r for ng groups of eight rows of B (ldb apart), storing each sum into
// c[8g+j], or adding it when acc is set (kernels_rows_amd64.s).
//
//go:noescape
func sdot1x8c(k8 int, a, b *float32, ldb int, ng int, c *float32, acc bool)

// rowDot8 sets (or, with acc, adds to) c[j] for j < 8·ng the dot products of one row of
// A with rows of B (ldb apart) over 8·k8 elements, as rowDot1 forms them, eight rows of B
// per group (hasRowDot).
func rowDot8(k8 int, a, b *float32, ldb int, ng int, c *float32, acc bool) {
	sdot1x8c(k8, a, b, ldb, ng, c, acc)
}

// sgemv16x4 is one row of sgemmKernel6x16u over four packed column strips (bs floats
// apart), writing 64 results to c (kernels_rows_amd64.s).
//
//go:noescape
func sgemv16x4(kc int, a *float32, b *float32, bs int, c *float32, accum bool)

// packedKernel is the micro-kernel the packed products run (packed.go): AVX2's six-row
// kernel, with sgemv16x4 for single rows, on any CPU that has AVX2 and FMA (on AVX-512 too:
// every kernel sums each element in the same order, so this changes no bit); nil without.
var packedKernel = func() *sgemmKernel {
	if hasRowDot {
		return kernelAVX2
	}
	return nil
}()

// packedRow is sgemv16x4: one row of A over four strips bs floats apart.
func packedRow(kc int, a *float32, b *float32, bs int, c *float32, accum bool) {
	sgemv16x4(kc, a, b, bs, c, accum)
}

// widenBF16AVX2 is widenBF16 for n a multiple of 8 (widen_amd64.s).
//
//go:noescape
func widenBF16AVX2(dst *float32, src *uint16, n int)

// hasWiden is whether widenBF16AVX2 runs here.
var hasWiden = cpu.X86.HasAVX2

// sdot1x8cBF16 is sdot1x8c with B's rows held as bfloat16 (widen_amd64.s).
//
//go:noescape
func sdot1x8cBF16(k8 int, a *float32, b *uint16, ldb int, ng int, c *float32, acc bool)

// rowDot8BF16 is rowDot8 with B's rows held as bfloat16, widened in the kernel (hasRowDot).
func rowDot8BF16(k8 int, a *float32, b *uint16, ldb int, ng int, c *float32, acc bool) {
	sdot1x8cBF16(k8, a, b, ldb, ng, c, acc)
}
