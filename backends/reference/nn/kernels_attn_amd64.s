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
