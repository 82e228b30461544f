// Decode kernels for matMulTRows (infer.go): the dot products of sdot2x4 (kernels_amd64.s),
// reduced in the kernel. Each output is Σ_{k<8·k8} a_r[k]·b_j[k] computed as eight lane
// sums (lane l: k ≡ l mod 8, fused multiply-adds in k order) added as
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7)): the same bits as sdot2x4 followed by the reduction
// in sgemmNTSmall.

#include "textflag.h"
#include "kernels_amd64.h"

// func sdot2x4r(k8 int, a0, a1, b *float32, ldb int, out *[8]float32)
// out[r*4+j] = Σ_{k<8*k8} a_r[k]·b[j*ldb+k] for rows r∈{0,1}, j∈0..3.
TEXT ·sdot2x4r(SB), NOSPLIT, $0-48
	MOVQ k8+0(FP), CX
	MOVQ a0+8(FP), AX
	MOVQ a1+16(FP), DX
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), R8
	SHLQ $2, R8
	MOVQ out+40(FP), DI
	LEAQ (BX)(R8*2), R9
	ZERO_Y0_Y7
	XORQ SI, SI
	TESTQ CX, CX
	JZ r24store
r24loop:
	VMOVUPS (AX)(SI*1), Y8
	VMOVUPS (DX)(SI*1), Y9
	VMOVUPS (BX)(SI*1), Y10
	VFMADD231PS Y10, Y8, Y0
	VFMADD231PS Y10, Y9, Y4
	LEAQ (BX)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y11
	VFMADD231PS Y11, Y8, Y1
	VFMADD231PS Y11, Y9, Y5
	VMOVUPS (R9)(SI*1), Y12
	VFMADD231PS Y12, Y8, Y2
	VFMADD231PS Y12, Y9, Y6
	LEAQ (R9)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y13
	VFMADD231PS Y13, Y8, Y3
	VFMADD231PS Y13, Y9, Y7
	ADDQ $32, SI
	DECQ CX
	JNZ r24loop
r24store:
	VHADDPS Y1, Y0, Y8
	VHADDPS Y3, Y2, Y9
	VHADDPS Y9, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	VMOVUPS X8, 0(DI)
	VHADDPS Y5, Y4, Y10
	VHADDPS Y7, Y6, Y11
	VHADDPS Y11, Y10, Y10
	VEXTRACTF128 $1, Y10, X11
	VADDPS X11, X10, X10
	VMOVUPS X10, 16(DI)
	VZEROUPPER
	RET

// func sdot1x4r(k8 int, a0, b *float32, ldb int, out *[8]float32)
// out[j] = Σ_{k<8*k8} a0[k]·b[j*ldb+k] for j∈0..3.
TEXT ·sdot1x4r(SB), NOSPLIT, $0-40
	MOVQ k8+0(FP), CX
	MOVQ a0+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ ldb+24(FP), R8
	SHLQ $2, R8
	MOVQ out+32(FP), DI
	LEAQ (BX)(R8*2), R9
	VXORPS Y0, Y0, Y0
	VXORPS Y1, Y1, Y1
	VXORPS Y2, Y2, Y2
	VXORPS Y3, Y3, Y3
	XORQ SI, SI
	TESTQ CX, CX
	JZ r14store
r14loop:
	VMOVUPS (AX)(SI*1), Y8
	VFMADD231PS (BX)(SI*1), Y8, Y0
	LEAQ (BX)(R8*1), R10
	VFMADD231PS (R10)(SI*1), Y8, Y1
	VFMADD231PS (R9)(SI*1), Y8, Y2
	LEAQ (R9)(R8*1), R10
	VFMADD231PS (R10)(SI*1), Y8, Y3
	ADDQ $32, SI
	DECQ CX
	JNZ r14loop
r14store:
	VHADDPS Y1, Y0, Y8
	VHADDPS Y3, Y2, Y9
	VHADDPS Y9, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	VMOVUPS X8, 0(DI)
	VZEROUPPER
	RET

// func sdot4x4r(k8 int, a *float32, lda int, b *float32, ldb int, ng int, out *float32)
// For each group g < ng of four rows of B (b + 4·g·ldb): out[16g + 4r + j] =
// Σ_{k<8*k8} a[r*lda+k]·b[(4g+j)*ldb+k] for rows r∈0..3, j∈0..3. Each B load serves four
// rows of A. Needs AVX-512VL for Y16–Y23 (EVEX-encoded); the 16 accumulators Y0–Y15 hold
// the lane sums of sdot2x4r, in the same order, reduced the same way.
TEXT ·sdot4x4r(SB), NOSPLIT, $0-56
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), DX
	SHLQ $2, DX
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), R8
	SHLQ $2, R8
	MOVQ ng+40(FP), R12
	MOVQ out+48(FP), DI
	LEAQ (AX)(DX*2), R11      // row 2 of A
	TESTQ R12, R12
	JZ r44done
r44group:
	MOVQ k8+0(FP), CX
	LEAQ (BX)(R8*2), R9       // column 2 of B
	ZERO_Y0_Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	VXORPS Y12, Y12, Y12
	VXORPS Y13, Y13, Y13
	VXORPS Y14, Y14, Y14
	VXORPS Y15, Y15, Y15
	XORQ SI, SI
	TESTQ CX, CX
	JZ r44store
r44loop:
	VMOVUPS (AX)(SI*1), Y16
	LEAQ (AX)(DX*1), R10
	VMOVUPS (R10)(SI*1), Y17
	VMOVUPS (R11)(SI*1), Y18
	LEAQ (R11)(DX*1), R10
	VMOVUPS (R10)(SI*1), Y19
	VMOVUPS (BX)(SI*1), Y20
	LEAQ (BX)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y21
	VMOVUPS (R9)(SI*1), Y22
	LEAQ (R9)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y23
	VFMADD231PS Y20, Y16, Y0
	VFMADD231PS Y20, Y17, Y4
	VFMADD231PS Y20, Y18, Y8
	VFMADD231PS Y20, Y19, Y12
	VFMADD231PS Y21, Y16, Y1
	VFMADD231PS Y21, Y17, Y5
	VFMADD231PS Y21, Y18, Y9
	VFMADD231PS Y21, Y19, Y13
	VFMADD231PS Y22, Y16, Y2
	VFMADD231PS Y22, Y17, Y6
	VFMADD231PS Y22, Y18, Y10
	VFMADD231PS Y22, Y19, Y14
	VFMADD231PS Y23, Y16, Y3
	VFMADD231PS Y23, Y17, Y7
	VFMADD231PS Y23, Y18, Y11
	VFMADD231PS Y23, Y19, Y15
	ADDQ $32, SI
	DECQ CX
	JNZ r44loop
r44store:
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVUPS X0, 0(DI)
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VMOVUPS X4, 16(DI)
	VHADDPS Y9, Y8, Y8
	VHADDPS Y11, Y10, Y10
	VHADDPS Y10, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	VMOVUPS X8, 32(DI)
	VHADDPS Y13, Y12, Y12
	VHADDPS Y15, Y14, Y14
	VHADDPS Y14, Y12, Y12
	VEXTRACTF128 $1, Y12, X13
	VADDPS X13, X12, X12
	VMOVUPS X12, 48(DI)
	ADDQ $64, DI
	LEAQ (BX)(R8*4), BX
	DECQ R12
	JNZ r44group
	VZEROUPPER
r44done:
	RET

// func sdot3x4r(k8 int, a *float32, lda int, b *float32, ldb int, ng int, out *float32)
// sdot4x4r for three rows of A in AVX2's sixteen registers: out[12g + 4r + j] =
// Σ_{k<8*k8} a[r*lda+k]·b[(4g+j)*ldb+k] for rows r∈0..2, j∈0..3. The twelve accumulators
// Y0–Y11 hold the lane sums of sdot2x4r, in the same order, reduced the same way; each load
// of B (Y15) serves three rows of A (Y12–Y14).
TEXT ·sdot3x4r(SB), NOSPLIT, $0-56
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), DX
	SHLQ $2, DX
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), R8
	SHLQ $2, R8
	MOVQ ng+40(FP), R12
	MOVQ out+48(FP), DI
	LEAQ (AX)(DX*1), R13      // row 1 of A
	LEAQ (AX)(DX*2), R11      // row 2 of A
	TESTQ R12, R12
	JZ r34done
r34group:
	MOVQ k8+0(FP), CX
	LEAQ (BX)(R8*2), R9       // column 2 of B
	ZERO_Y0_Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ SI, SI
	TESTQ CX, CX
	JZ r34store
r34loop:
	VMOVUPS (AX)(SI*1), Y12
	VMOVUPS (R13)(SI*1), Y13
	VMOVUPS (R11)(SI*1), Y14
	VMOVUPS (BX)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y0
	VFMADD231PS Y15, Y13, Y4
	VFMADD231PS Y15, Y14, Y8
	LEAQ (BX)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y1
	VFMADD231PS Y15, Y13, Y5
	VFMADD231PS Y15, Y14, Y9
	VMOVUPS (R9)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y6
	VFMADD231PS Y15, Y14, Y10
	LEAQ (R9)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y3
	VFMADD231PS Y15, Y13, Y7
	VFMADD231PS Y15, Y14, Y11
	ADDQ $32, SI
	DECQ CX
	JNZ r34loop
r34store:
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VMOVUPS X0, 0(DI)
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VMOVUPS X4, 16(DI)
	VHADDPS Y9, Y8, Y8
	VHADDPS Y11, Y10, Y10
	VHADDPS Y10, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	VMOVUPS X8, 32(DI)
	ADDQ $48, DI
	LEAQ (BX)(R8*4), BX
	DECQ R12
	JNZ r34group
	VZEROUPPER
r34done:
	RET

// func sdot3x4c(k8 int, a *float32, lda int, b *float32, ldb int, ng int, c *float32, ldc int, acc bool)
// sdot3x4r writing its results into C: c[r·ldc + 4g + j] (+)= Σ_{k<8*k8} a[r*lda+k]·b[(4g+j)*ldb+k]
// for rows r∈0..2, groups g < ng, j∈0..3 (adding to C when acc is set).
TEXT ·sdot3x4c(SB), NOSPLIT, $0-65
	MOVQ a+8(FP), AX
	MOVQ lda+16(FP), DX
	SHLQ $2, DX
	MOVQ b+24(FP), BX
	MOVQ ldb+32(FP), R8
	SHLQ $2, R8
	MOVQ ng+40(FP), R12
	MOVQ c+48(FP), DI
	LEAQ (AX)(DX*1), R13      // row 1 of A
	LEAQ (AX)(DX*2), R11      // row 2 of A
	MOVQ ldc+56(FP), DX
	SHLQ $2, DX               // from here on DX is C's row stride
	TESTQ R12, R12
	JZ c34done
c34group:
	MOVQ k8+0(FP), CX
	LEAQ (BX)(R8*2), R9       // column 2 of B
	ZERO_Y0_Y7
	VXORPS Y8, Y8, Y8
	VXORPS Y9, Y9, Y9
	VXORPS Y10, Y10, Y10
	VXORPS Y11, Y11, Y11
	XORQ SI, SI
	TESTQ CX, CX
	JZ c34store
c34loop:
	VMOVUPS (AX)(SI*1), Y12
	VMOVUPS (R13)(SI*1), Y13
	VMOVUPS (R11)(SI*1), Y14
	VMOVUPS (BX)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y0
	VFMADD231PS Y15, Y13, Y4
	VFMADD231PS Y15, Y14, Y8
	LEAQ (BX)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y1
	VFMADD231PS Y15, Y13, Y5
	VFMADD231PS Y15, Y14, Y9
	VMOVUPS (R9)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y2
	VFMADD231PS Y15, Y13, Y6
	VFMADD231PS Y15, Y14, Y10
	LEAQ (R9)(R8*1), R10
	VMOVUPS (R10)(SI*1), Y15
	VFMADD231PS Y15, Y12, Y3
	VFMADD231PS Y15, Y13, Y7
	VFMADD231PS Y15, Y14, Y11
	ADDQ $32, SI
	DECQ CX
	JNZ c34loop
c34store:
	VHADDPS Y1, Y0, Y0
	VHADDPS Y3, Y2, Y2
	VHADDPS Y2, Y0, Y0
	VEXTRACTF128 $1, Y0, X1
	VADDPS X1, X0, X0
	VHADDPS Y5, Y4, Y4
	VHADDPS Y7, Y6, Y6
	VHADDPS Y6, Y4, Y4
	VEXTRACTF128 $1, Y4, X5
	VADDPS X5, X4, X4
	VHADDPS Y9, Y8, Y8
	VHADDPS Y11, Y10, Y10
	VHADDPS Y10, Y8, Y8
	VEXTRACTF128 $1, Y8, X9
	VADDPS X9, X8, X8
	CMPB acc+64(FP), $0
	JEQ c34put
	VADDPS (DI), X0, X0
	VADDPS (DI)(DX*1), X4, X4
	VADDPS (DI)(DX*2), X8, X8
c34put:
	VMOVUPS X0, (DI)
	VMOVUPS X4, (DI)(DX*1)
	VMOVUPS X8, (DI)(DX*2)
	ADDQ $16, DI
	LEAQ (BX)(R8*4), BX
	DECQ R12
	JNZ c34group
	VZEROUPPER
c34done:
	RET

// func sgemv16x4(kc int, a *float32, b *float32, bs int, c *float32, accum bool)
// c[16s+j] = (accum ? c[16s+j] : 0) + Σ_{k<kc} a[k]·b[s·bs + 16k + j] for four packed
// column strips s of the AVX2 SGEMM (sgemmKernel6x16's B layout) and j < 16: one row of
// sgemmKernel6x16u, each sum a chain of fused multiply-adds in k order, added to C at the
// end, so that a row gets these bits whether it is computed alone or in a six-row panel.
TEXT ·sgemv16x4(SB), NOSPLIT, $0-41
	MOVQ kc+0(FP), CX
	MOVQ a+8(FP), AX
	MOVQ b+16(FP), BX
	MOVQ bs+24(FP), R10
	SHLQ $2, R10
	LEAQ (BX)(R10*2), R11
	MOVQ c+32(FP), DI
	ZERO_Y0_Y7
	TESTQ CX, CX
	JZ gv4store
gv4loop:
	VBROADCASTSS (AX), Y8
	VFMADD231PS 0(BX), Y8, Y0
	VFMADD231PS 32(BX), Y8, Y1
	VFMADD231PS 0(BX)(R10*1), Y8, Y2
	VFMADD231PS 32(BX)(R10*1), Y8, Y3
	VFMADD231PS 0(R11), Y8, Y4
	VFMADD231PS 32(R11), Y8, Y5
	VFMADD231PS 0(R11)(R10*1), Y8, Y6
	VFMADD231PS 32(R11)(R10*1), Y8, Y7
	ADDQ $4, AX
	ADDQ $64, BX
	ADDQ $64, R11
	DECQ CX
	JNZ gv4loop
gv4store:
	MOVBLZX accum+40(FP), DX
	TESTQ DX, DX
	JZ gv4noacc
	VADDPS (DI), Y0, Y0
	VADDPS 32(DI), Y1, Y1
	VADDPS 64(DI), Y2, Y2
	VADDPS 96(DI), Y3, Y3
	VADDPS 128(DI), Y4, Y4
	VADDPS 160(DI), Y5, Y5
	VADDPS 192(DI), Y6, Y6
	VADDPS 224(DI), Y7, Y7
gv4noacc:
	STORE_Y0_Y7
	VZEROUPPER
	RET

// func sdot1x8c(k8 int, a, b *float32, ldb int, ng int, c *float32, acc bool)
// For each group g < ng of eight rows of B (b + 8·g·ldb): c[8g + j] (+)= Σ_{k<8·k8}
// a[k]·b[(8g+j)·ldb + k], each sum as sdot1x4r forms it (eight FMA lanes, reduced
// ((l0+l1)+(l2+l3))+((l4+l5)+(l6+l7))), then added to c when acc is set.
TEXT ·sdot1x8c(SB), NOSPLIT, $0-49
	MOVQ b+16(FP), BX
	MOVQ ng+32(FP), R12
	MOVQ c+40(FP), DI
	TESTQ R12, R12
	JZ r18done
r18group:
	MOVQ a+8(FP), AX
	MOVQ k8+0(FP), CX
	MOVQ ldb+24(FP), R8
	SHLQ $2, R8
	LEAQ (BX)(R8*1), R9 // row 1
	LEAQ (BX)(R8*2), R10 // row 2
	LEAQ (R9)(R8*2), R11 // row 3
	LEAQ (BX)(R8*4), R13 // row 4
	LEAQ (R9)(R8*4), DX // row 5
	LEAQ (R10)(R8*4), SI // row 6
	LEAQ (R11)(R8*4), R8 // row 7 (ldb is loaded again for the next group)
	ZERO_Y0_Y7
	TESTQ CX, CX
	JZ r18reduce
r18loop:
	VMOVUPS (AX), Y8
	VFMADD231PS (BX), Y8, Y0
	VFMADD231PS (R9), Y8, Y1
	VFMADD231PS (R10), Y8, Y2
	VFMADD231PS (R11), Y8, Y3
	VFMADD231PS (R13), Y8, Y4
	VFMADD231PS (DX), Y8, Y5
	VFMADD231PS (SI), Y8, Y6
	VFMADD231PS (R8), Y8, Y7
	ADDQ $32, AX
	ADDQ $32, BX
	ADDQ $32, R9
	ADDQ $32, R10
	ADDQ $32, R11
	ADDQ $32, R13
	ADDQ $32, DX
	ADDQ $32, SI
	ADDQ $32, R8
	DECQ CX
	JNZ r18loop
r18reduce:
	VHADDPS Y1, Y0, Y8
	VHADDPS Y3, Y2, Y9
	VHADDPS Y9, Y8, Y8 // rows 0–3: low-half and high-half sums
	VHADDPS Y5, Y4, Y10
	VHADDPS Y7, Y6, Y11
	VHADDPS Y11, Y10, Y10 // rows 4–7
	VPERM2F128 $0x20, Y10, Y8, Y11
	VPERM2F128 $0x31, Y10, Y8, Y12
	VADDPS Y12, Y11, Y11
	CMPB acc+48(FP), $0
	JEQ r18store
	VADDPS (DI), Y11, Y11
r18store:
	VMOVUPS Y11, (DI)
	ADDQ $32, DI
	// next group: row 0 moves on by 8 rows, back by the k8 blocks it advanced
	MOVQ k8+0(FP), CX
	SHLQ $5, CX
	SUBQ CX, BX
	MOVQ ldb+24(FP), R8
	SHLQ $2, R8
	LEAQ (BX)(R8*8), BX
	DECQ R12
	JNZ r18group
r18done:
	VZEROUPPER
	RET
