// Attention kernel for step (infer.go): the probability-weighted sum of value rows, in
// float64, each output lane computed exactly as the scalar loop computes it
// (acc[d] += p[j]·float64(v[j][d]) for j in order, a multiply then an add, no fused
// multiply-add), so its bits do not change.

#include "textflag.h"

// func wsumF64(n int, p *float64, v *float32, ldv int, nb int, acc *float64)
// acc[16·b+d] += Σ_{j<n} p[j]·float64(v[j·ldv+16·b+d]) for b < nb, d < 16, j in order.
TEXT ·wsumF64(SB), NOSPLIT, $0-48
	MOVQ n+0(FP), CX
	MOVQ p+8(FP), SI
	MOVQ v+16(FP), DI
	MOVQ ldv+24(FP), R8
	SHLQ $2, R8
	MOVQ nb+32(FP), R9
	MOVQ acc+40(FP), DX

wsblock:
	TESTQ R9, R9
	JZ wsdone
	VMOVUPD 0(DX), Y0
	VMOVUPD 32(DX), Y1
	VMOVUPD 64(DX), Y2
	VMOVUPD 96(DX), Y3
	MOVQ CX, R10
	MOVQ SI, R11
	MOVQ DI, R12

wsloop:
	TESTQ R10, R10
	JZ wsstore
	PREFETCHT0 (R12)(R8*8) // this block's line of the value row eight ahead (see sdotRowsAVX2)
	VBROADCASTSD (R11), Y4
	VCVTPS2PD 0(R12), Y5
	VCVTPS2PD 16(R12), Y6
	VCVTPS2PD 32(R12), Y7
	VCVTPS2PD 48(R12), Y8
	VMULPD Y4, Y5, Y5
	VMULPD Y4, Y6, Y6
	VMULPD Y4, Y7, Y7
	VMULPD Y4, Y8, Y8
	VADDPD Y5, Y0, Y0
	VADDPD Y6, Y1, Y1
	VADDPD Y7, Y2, Y2
	VADDPD Y8, Y3, Y3
	ADDQ $8, R11
	ADDQ R8, R12
	DECQ R10
	JMP wsloop

wsstore:
	VMOVUPD Y0, 0(DX)
	VMOVUPD Y1, 32(DX)
	VMOVUPD Y2, 64(DX)
	VMOVUPD Y3, 96(DX)
	ADDQ $128, DX
	ADDQ $64, DI
	DECQ R9
	JMP wsblock

wsdone:
	VZEROUPPER
	RET

// func attnGradF32(n, hd4 int, ds, p *float64, q, dout, k *float32, ldk int, dqa *float64, dk, dv *float32)
// attnBwd's inner loop for rows j < n of k, dk and dv (ldk apart) and lanes d < 4·hd4, j in
// order: dqa[d] += ds[j]·float64(k[j][d]); dk[j][d] += float32(ds[j]·float64(q[d]));
// dv[j][d] += float32(p[j]·float64(dout[d])), each a multiply then an add, as written in Go.
TEXT ·attnGradF32(SB), NOSPLIT, $0-88
	MOVQ n+0(FP), CX
	MOVQ hd4+8(FP), R9
	SHLQ $4, R9                        // bytes of float32 per row
	MOVQ ds+16(FP), R12
	MOVQ p+24(FP), R13
	MOVQ q+32(FP), SI
	MOVQ dout+40(FP), DI
	MOVQ k+48(FP), AX
	MOVQ ldk+56(FP), R8
	SHLQ $2, R8
	MOVQ dqa+64(FP), DX
	MOVQ dk+72(FP), BX
	MOVQ dv+80(FP), R11
	TESTQ R9, R9
	JZ agdone
agrow:
	TESTQ CX, CX
	JZ agdone
	VBROADCASTSD (R12), Y0             // ds[j]
	VBROADCASTSD (R13), Y1             // p[j]
	XORQ R10, R10
aglane:
	VCVTPS2PD (AX)(R10*1), Y2          // k
	VMULPD Y2, Y0, Y2
	VADDPD (DX)(R10*2), Y2, Y2
	VMOVUPD Y2, (DX)(R10*2)            // dqa += ds·k
	VCVTPS2PD (SI)(R10*1), Y3          // q
	VMULPD Y3, Y0, Y3
	VCVTPD2PSY Y3, X3
	VADDPS (BX)(R10*1), X3, X3
	VMOVUPS X3, (BX)(R10*1)            // dk += float32(ds·q)
	VCVTPS2PD (DI)(R10*1), Y4          // dout
	VMULPD Y4, Y1, Y4
	VCVTPD2PSY Y4, X4
	VADDPS (R11)(R10*1), X4, X4
	VMOVUPS X4, (R11)(R10*1)           // dv += float32(p·dout)
	ADDQ $16, R10
	CMPQ R10, R9
	JLT aglane
	ADDQ R8, AX
	ADDQ R8, BX
	ADDQ R8, R11
	ADDQ $8, R12
	ADDQ $8, R13
	DECQ CX
	JMP agrow
agdone:
	VZEROUPPER
	RET

// AGGROUP is one group of eight lanes (byte offset o of float32, o16 = o+16) of
// attnGradF32x32's row j: dqa (in A, B) += ds·k; dk += float32(ds·q); dv += float32(p·dout),
// each a multiply then an add, as in attnGradF32.
#define AGGROUP(o, o16, A, B) \
	VCVTPS2PD o(AX)(R10*1), Y2; \
	VCVTPS2PD o16(AX)(R10*1), Y3; \
	VMULPD Y2, Y0, Y2; \
	VMULPD Y3, Y0, Y3; \
	VADDPD Y2, A, A; \
	VADDPD Y3, B, B; \
	VCVTPS2PD o(SI), Y4; \
	VCVTPS2PD o16(SI), Y5; \
	VMULPD Y4, Y0, Y4; \
	VMULPD Y5, Y0, Y5; \
	VCVTPD2PSY Y4, X4; \
	VCVTPD2PSY Y5, X5; \
	VINSERTF128 $1, X5, Y4, Y4; \
	VADDPS o(BX)(R10*1), Y4, Y4; \
	VMOVUPS Y4, o(BX)(R10*1); \
	VCVTPS2PD o(DI), Y6; \
	VCVTPS2PD o16(DI), Y7; \
	VMULPD Y6, Y1, Y6; \
	VMULPD Y7, Y1, Y7; \
	VCVTPD2PSY Y6, X6; \
	VCVTPD2PSY Y7, X7; \
	VINSERTF128 $1, X7, Y6, Y6; \
	VADDPS o(R11)(R10*1), Y6, Y6; \
	VMOVUPS Y6, o(R11)(R10*1)

// func attnGradF32x32(n, hd32 int, ds, p *float64, q, dout, k *float32, ldk int, dqa *float64, dk, dv *float32)
// attnGradF32 for lanes d < 32·hd32, 32 lanes at a time: for each block of 32 lanes, rows j
// < n in order, with that block of dqa held in Y8–Y15 instead of loaded and stored per row,
// and dk, dv updated eight lanes per store. Each element gets the same operations in the same
// order as in attnGradF32, so the same bits.
TEXT ·attnGradF32x32(SB), NOSPLIT, $0-88
	MOVQ hd32+8(FP), R9
	MOVQ ds+16(FP), R12
	MOVQ p+24(FP), R13
	MOVQ q+32(FP), SI
	MOVQ dout+40(FP), DI
	MOVQ k+48(FP), AX
	MOVQ ldk+56(FP), R8
	SHLQ $2, R8
	MOVQ dqa+64(FP), R14
	MOVQ dk+72(FP), BX
	MOVQ dv+80(FP), R11
agxblock:
	TESTQ R9, R9
	JZ agxdone
	VMOVUPD 0(R14), Y8
	VMOVUPD 32(R14), Y9
	VMOVUPD 64(R14), Y10
	VMOVUPD 96(R14), Y11
	VMOVUPD 128(R14), Y12
	VMOVUPD 160(R14), Y13
	VMOVUPD 192(R14), Y14
	VMOVUPD 224(R14), Y15
	MOVQ n+0(FP), CX
	XORQ R10, R10                      // row j's byte offset in k, dk, dv
	XORQ DX, DX                        // j·8
	TESTQ CX, CX
	JZ agxstore
agxrow:
	VBROADCASTSD (R12)(DX*1), Y0       // ds[j]
	VBROADCASTSD (R13)(DX*1), Y1       // p[j]
	AGGROUP(0, 16, Y8, Y9)
	AGGROUP(32, 48, Y10, Y11)
	AGGROUP(64, 80, Y12, Y13)
	AGGROUP(96, 112, Y14, Y15)
	ADDQ R8, R10
	ADDQ $8, DX
	DECQ CX
	JNZ agxrow
agxstore:
	VMOVUPD Y8, 0(R14)
	VMOVUPD Y9, 32(R14)
	VMOVUPD Y10, 64(R14)
	VMOVUPD Y11, 96(R14)
	VMOVUPD Y12, 128(R14)
	VMOVUPD Y13, 160(R14)
	VMOVUPD Y14, 192(R14)
	VMOVUPD Y15, 224(R14)
	ADDQ $256, R14
	ADDQ $128, SI
	ADDQ $128, DI
	ADDQ $128, AX
	ADDQ $128, BX
	ADDQ $128, R11
	DECQ R9
	JMP agxblock
agxdone:
	VZEROUPPER
	RET

// func wsum2F64(n int, p0, p1 *float64, v *float32, ldv int, nb int, acc0, acc1 *float64)
// wsumF64(n, p0, v, ldv, nb, acc0) and wsumF64(n, p1, v, ldv, nb, acc1) in one pass over
// the value rows (two heads that share them): each value row is loaded and widened once
// for both, and the two heads' eight accumulator chains run side by side. Every lane gets
// wsumF64's operations in wsumF64's order (a multiply then an add, j in order), so its bits.
TEXT ·wsum2F64(SB), NOSPLIT, $0-64
	MOVQ n+0(FP), CX
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), BX
	MOVQ v+24(FP), DI
	MOVQ ldv+32(FP), R8
	SHLQ $2, R8
	MOVQ nb+40(FP), R9
	MOVQ acc0+48(FP), DX
	MOVQ acc1+56(FP), AX

w2block:
	TESTQ R9, R9
	JZ w2done
	VMOVUPD 0(DX), Y0
	VMOVUPD 32(DX), Y1
	VMOVUPD 64(DX), Y2
	VMOVUPD 96(DX), Y3
	VMOVUPD 0(AX), Y4
	VMOVUPD 32(AX), Y5
	VMOVUPD 64(AX), Y6
	VMOVUPD 96(AX), Y7
	MOVQ CX, R10
	XORQ R11, R11
	MOVQ DI, R12

w2loop:
	TESTQ R10, R10
	JZ w2store
	PREFETCHT0 (R12)(R8*8)
	VBROADCASTSD (SI)(R11*8), Y8
	VBROADCASTSD (BX)(R11*8), Y9
	VCVTPS2PD 0(R12), Y10
	VCVTPS2PD 16(R12), Y11
	VCVTPS2PD 32(R12), Y12
	VCVTPS2PD 48(R12), Y13
	VMULPD Y8, Y10, Y14
	VMULPD Y9, Y10, Y15
	VADDPD Y14, Y0, Y0
	VADDPD Y15, Y4, Y4
	VMULPD Y8, Y11, Y14
	VMULPD Y9, Y11, Y15
	VADDPD Y14, Y1, Y1
	VADDPD Y15, Y5, Y5
	VMULPD Y8, Y12, Y14
	VMULPD Y9, Y12, Y15
	VADDPD Y14, Y2, Y2
	VADDPD Y15, Y6, Y6
	VMULPD Y8, Y13, Y14
	VMULPD Y9, Y13, Y15
	VADDPD Y14, Y3, Y3
	VADDPD Y15, Y7, Y7
	INCQ R11
	ADDQ R8, R12
	DECQ R10
	JMP w2loop

w2store:
	VMOVUPD Y0, 0(DX)
	VMOVUPD Y1, 32(DX)
	VMOVUPD Y2, 64(DX)
	VMOVUPD Y3, 96(DX)
	VMOVUPD Y4, 0(AX)
	VMOVUPD Y5, 32(AX)
	VMOVUPD Y6, 64(AX)
	VMOVUPD Y7, 96(AX)
	ADDQ $128, DX
	ADDQ $128, AX
	ADDQ $64, DI
	DECQ R9
	JMP w2block

w2done:
	VZEROUPPER
	RET

// func wsum2F64x64(n int, p0, p1 *float64, v *float32, ldv int, nb int, acc0, acc1 *float64)
// wsum2F64 in blocks of 64 lanes with AVX-512 (nb blocks): per value row, one widening of
// its 64 lanes serves both heads, whose 64-lane accumulators stay in Z0–Z15. Every lane
// gets wsumF64's multiply then add, j in order, so its bits.
TEXT ·wsum2F64x64(SB), NOSPLIT, $0-64
	MOVQ n+0(FP), CX
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), BX
	MOVQ v+24(FP), DI
	MOVQ ldv+32(FP), R8
	SHLQ $2, R8
	MOVQ nb+40(FP), R9
	MOVQ acc0+48(FP), DX
	MOVQ acc1+56(FP), AX

w6block:
	TESTQ R9, R9
	JZ w6done
	VMOVUPD 0(DX), Z0
	VMOVUPD 64(DX), Z1
	VMOVUPD 128(DX), Z2
	VMOVUPD 192(DX), Z3
	VMOVUPD 256(DX), Z4
	VMOVUPD 320(DX), Z5
	VMOVUPD 384(DX), Z6
	VMOVUPD 448(DX), Z7
	VMOVUPD 0(AX), Z8
	VMOVUPD 64(AX), Z9
	VMOVUPD 128(AX), Z10
	VMOVUPD 192(AX), Z11
	VMOVUPD 256(AX), Z12
	VMOVUPD 320(AX), Z13
	VMOVUPD 384(AX), Z14
	VMOVUPD 448(AX), Z15
	MOVQ CX, R10
	XORQ R11, R11
	MOVQ DI, R12

w6loop:
	TESTQ R10, R10
	JZ w6store
	PREFETCHT0 (R12)(R8*8)
	PREFETCHT0 64(R12)(R8*8)
	PREFETCHT0 128(R12)(R8*8)
	PREFETCHT0 192(R12)(R8*8)
	VBROADCASTSD (SI)(R11*8), Z16
	VBROADCASTSD (BX)(R11*8), Z17
	VCVTPS2PD 0(R12), Z18
	VCVTPS2PD 32(R12), Z19
	VCVTPS2PD 64(R12), Z20
	VCVTPS2PD 96(R12), Z21
	VCVTPS2PD 128(R12), Z22
	VCVTPS2PD 160(R12), Z23
	VCVTPS2PD 192(R12), Z24
	VCVTPS2PD 224(R12), Z25
	VMULPD Z16, Z18, Z26
	VMULPD Z17, Z18, Z27
	VADDPD Z26, Z0, Z0
	VADDPD Z27, Z8, Z8
	VMULPD Z16, Z19, Z26
	VMULPD Z17, Z19, Z27
	VADDPD Z26, Z1, Z1
	VADDPD Z27, Z9, Z9
	VMULPD Z16, Z20, Z26
	VMULPD Z17, Z20, Z27
	VADDPD Z26, Z2, Z2
	VADDPD Z27, Z10, Z10
	VMULPD Z16, Z21, Z26
	VMULPD Z17, Z21, Z27
	VADDPD Z26, Z3, Z3
	VADDPD Z27, Z11, Z11
	VMULPD Z16, Z22, Z26
	VMULPD Z17, Z22, Z27
	VADDPD Z26, Z4, Z4
	VADDPD Z27, Z12, Z12
	VMULPD Z16, Z23, Z26
	VMULPD Z17, Z23, Z27
	VADDPD Z26, Z5, Z5
	VADDPD Z27, Z13, Z13
	VMULPD Z16, Z24, Z26
	VMULPD Z17, Z24, Z27
	VADDPD Z26, Z6, Z6
	VADDPD Z27, Z14, Z14
	VMULPD Z16, Z25, Z26
	VMULPD Z17, Z25, Z27
	VADDPD Z26, Z7, Z7
	VADDPD Z27, Z15, Z15
	INCQ R11
	ADDQ R8, R12
	DECQ R10
	JMP w6loop

w6store:
	VMOVUPD Z0, 0(DX)
	VMOVUPD Z1, 64(DX)
	VMOVUPD Z2, 128(DX)
	VMOVUPD Z3, 192(DX)
	VMOVUPD Z4, 256(DX)
	VMOVUPD Z5, 320(DX)
	VMOVUPD Z6, 384(DX)
	VMOVUPD Z7, 448(DX)
	VMOVUPD Z8, 0(AX)
	VMOVUPD Z9, 64(AX)
	VMOVUPD Z10, 128(AX)
	VMOVUPD Z11, 192(AX)
	VMOVUPD Z12, 256(AX)
	VMOVUPD Z13, 320(AX)
	VMOVUPD Z14, 384(AX)
	VMOVUPD Z15, 448(AX)
	ADDQ $512, DX
	ADDQ $512, AX
	ADDQ $256, DI
	DECQ R9
	JMP w6block

w6done:
	VZEROUPPER
	RET

// func wsum2F64x64W(n int, p0, p1 *float64, v *float64, ldv int, nb int, acc0, acc1 *float64)
// wsum2F64x64 on values already widened to float64 (rows ldv float64s apart): the same
// multiply then add per lane, j in order, so the same bits, without a widening per row
// (which took half the vector ports' slots).
TEXT ·wsum2F64x64W(SB), NOSPLIT, $0-64
	MOVQ n+0(FP), CX
	MOVQ p0+8(FP), SI
	MOVQ p1+16(FP), BX
	MOVQ v+24(FP), DI
	MOVQ ldv+32(FP), R8
	SHLQ $3, R8
	MOVQ nb+40(FP), R9
	MOVQ acc0+48(FP), DX
	MOVQ acc1+56(FP), AX

wwblock:
	TESTQ R9, R9
	JZ wwdone
	VMOVUPD 0(DX), Z0
	VMOVUPD 64(DX), Z1
	VMOVUPD 128(DX), Z2
	VMOVUPD 192(DX), Z3
	VMOVUPD 256(DX), Z4
	VMOVUPD 320(DX), Z5
	VMOVUPD 384(DX), Z6
	VMOVUPD 448(DX), Z7
	VMOVUPD 0(AX), Z8
	VMOVUPD 64(AX), Z9
	VMOVUPD 128(AX), Z10
	VMOVUPD 192(AX), Z11
	VMOVUPD 256(AX), Z12
	VMOVUPD 320(AX), Z13
	VMOVUPD 384(AX), Z14
	VMOVUPD 448(AX), Z15
	MOVQ CX, R10
	XORQ R11, R11
	MOVQ DI, R12

wwloop:
	TESTQ R10, R10
	JZ wwstore
	PREFETCHT0 (R12)(R8*4)
	PREFETCHT0 64(R12)(R8*4)
	PREFETCHT0 128(R12)(R8*4)
	PREFETCHT0 192(R12)(R8*4)
	PREFETCHT0 256(R12)(R8*4)
	PREFETCHT0 320(R12)(R8*4)
	PREFETCHT0 384(R12)(R8*4)
	PREFETCHT0 448(R12)(R8*4)
	VBROADCASTSD (SI)(R11*8), Z16
	VBROADCASTSD (BX)(R11*8), Z17
	VMOVUPD 0(R12), Z18
	VMOVUPD 64(R12), Z19
	VMOVUPD 128(R12), Z20
	VMOVUPD 192(R12), Z21
	VMOVUPD 256(R12), Z22
	VMOVUPD 320(R12), Z23
	VMOVUPD 384(R12), Z24
	VMOVUPD 448(R12), Z25
	VMULPD Z16, Z18, Z26
	VMULPD Z17, Z18, Z27
	VADDPD Z26, Z0, Z0
	VADDPD Z27, Z8, Z8
	VMULPD Z16, Z19, Z28
	VMULPD Z17, Z19, Z29
	VADDPD Z28, Z1, Z1
	VADDPD Z29, Z9, Z9
	VMULPD Z16, Z20, Z30
	VMULPD Z17, Z20, Z31
	VADDPD Z30, Z2, Z2
	VADDPD Z31, Z10, Z10
	VMULPD Z16, Z21, Z26
	VMULPD Z17, Z21, Z27
	VADDPD Z26, Z3, Z3
	VADDPD Z27, Z11, Z11
	VMULPD Z16, Z22, Z28
	VMULPD Z17, Z22, Z29
	VADDPD Z28, Z4, Z4
	VADDPD Z29, Z12, Z12
	VMULPD Z16, Z23, Z30
	VMULPD Z17, Z23, Z31
	VADDPD Z30, Z5, Z5
	VADDPD Z31, Z13, Z13
	VMULPD Z16, Z24, Z26
	VMULPD Z17, Z24, Z27
	VADDPD Z26, Z6, Z6
	VADDPD Z27, Z14, Z14
	VMULPD Z16, Z25, Z28
	VMULPD Z17, Z25, Z29
	VADDPD Z28, Z7, Z7
	VADDPD Z29, Z15, Z15
	INCQ R11
	ADDQ R8, R12
	DECQ R10
	JMP wwloop

wwstore:
	VMOVUPD Z0, 0(DX)
	VMOVUPD Z1, 64(DX)
	VMOVUPD Z2, 128(DX)
	VMOVUPD Z3, 192(DX)
	VMOVUPD Z4, 256(DX)
	VMOVUPD Z5, 320(DX)
	VMOVUPD Z6, 384(DX)
	VMOVUPD Z7, 448(DX)
	VMOVUPD Z8, 0(AX)
	VMOVUPD Z9, 64(AX)
	VMOVUPD Z10, 128(AX)
	VMOVUPD Z11, 192(AX)
	VMOVUPD Z12, 256(AX)
	VMOVUPD Z13, 320(AX)
	VMOVUPD Z14, 384(AX)
	VMOVUPD Z15, 448(AX)
	ADDQ $512, DX
	ADDQ $512, AX
	ADDQ $512, DI
	DECQ R9
	JMP wwblock

wwdone:
	VZEROUPPER
	RET

// func divF64x8(n8 int, x *float64, d float64)
// x[i] /= d for i < 8·n8, eight lanes a division (VDIVPD rounds each quotient as DIVSD
// does: the bits of the scalar loop).
TEXT ·divF64x8(SB), NOSPLIT, $0-24
	MOVQ n8+0(FP), CX
	MOVQ x+8(FP), SI
	VBROADCASTSD d+16(FP), Z0
	TESTQ CX, CX
	JZ dvdone

dvloop:
	VMOVUPD (SI), Z1
	VDIVPD Z0, Z1, Z1
	VMOVUPD Z1, (SI)
	ADDQ $64, SI
	DECQ CX
	JNZ dvloop

dvdone:
	VZEROUPPER
	RET
