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

func init() {
	if cpu.X86.HasAVX2 && cpu.X86.HasFMA {
		rowDot2, rowDot1 = sdot2x4r, sdot1x4r
	}
}
