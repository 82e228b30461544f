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
