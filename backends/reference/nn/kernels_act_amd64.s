// Activation kernel for swiglu (ops.go): silu(g)·u for float32 g and u, four elements at a
// time in float64, with the bits of the scalar code: exp is Go's math.Exp on amd64 with
// FMA (math/exp_amd64.s, the avxfma path: the same reduction, the same Taylor polynomial
// and squarings, the same operations in the same order), lane by lane, for |x| ≤ 708,
// where that code takes none of its special paths.

#include "textflag.h"

// Each constant four times, for 256-bit operands.
DATA expk<>+0(SB)/8, $1.4426950408889634073599246810018920 // LOG2E
DATA expk<>+8(SB)/8, $1.4426950408889634073599246810018920
DATA expk<>+16(SB)/8, $1.4426950408889634073599246810018920
DATA expk<>+24(SB)/8, $1.4426950408889634073599246810018920
DATA expk<>+32(SB)/8, $0.69314718055966295651160180568695068359375 // LN2U
DATA expk<>+40(SB)/8, $0.69314718055966295651160180568695068359375
DATA expk<>+48(SB)/8, $0.69314718055966295651160180568695068359375
DATA expk<>+56(SB)/8, $0.69314718055966295651160180568695068359375
DATA expk<>+64(SB)/8, $0.28235290563031577122588448175013436025525412068e-12 // LN2L
DATA expk<>+72(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA expk<>+80(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA expk<>+88(SB)/8, $0.28235290563031577122588448175013436025525412068e-12
DATA expk<>+96(SB)/8, $0.0625
DATA expk<>+104(SB)/8, $0.0625
DATA expk<>+112(SB)/8, $0.0625
DATA expk<>+120(SB)/8, $0.0625
DATA expk<>+128(SB)/8, $2.4801587301587301587e-5
DATA expk<>+136(SB)/8, $2.4801587301587301587e-5
DATA expk<>+144(SB)/8, $2.4801587301587301587e-5
DATA expk<>+152(SB)/8, $2.4801587301587301587e-5
DATA expk<>+160(SB)/8, $1.9841269841269841270e-4
DATA expk<>+168(SB)/8, $1.9841269841269841270e-4
DATA expk<>+176(SB)/8, $1.9841269841269841270e-4
DATA expk<>+184(SB)/8, $1.9841269841269841270e-4
DATA expk<>+192(SB)/8, $1.3888888888888888889e-3
DATA expk<>+200(SB)/8, $1.3888888888888888889e-3
DATA expk<>+208(SB)/8, $1.3888888888888888889e-3
DATA expk<>+216(SB)/8, $1.3888888888888888889e-3
DATA expk<>+224(SB)/8, $8.3333333333333333333e-3
DATA expk<>+232(SB)/8, $8.3333333333333333333e-3
DATA expk<>+240(SB)/8, $8.3333333333333333333e-3
DATA expk<>+248(SB)/8, $8.3333333333333333333e-3
DATA expk<>+256(SB)/8, $4.1666666666666666667e-2
DATA expk<>+264(SB)/8, $4.1666666666666666667e-2
DATA expk<>+272(SB)/8, $4.1666666666666666667e-2
DATA expk<>+280(SB)/8, $4.1666666666666666667e-2
DATA expk<>+288(SB)/8, $1.6666666666666666667e-1
DATA expk<>+296(SB)/8, $1.6666666666666666667e-1
DATA expk<>+304(SB)/8, $1.6666666666666666667e-1
DATA expk<>+312(SB)/8, $1.6666666666666666667e-1
DATA expk<>+320(SB)/8, $0.5
DATA expk<>+328(SB)/8, $0.5
DATA expk<>+336(SB)/8, $0.5
DATA expk<>+344(SB)/8, $0.5
DATA expk<>+352(SB)/8, $1.0
DATA expk<>+360(SB)/8, $1.0
DATA expk<>+368(SB)/8, $1.0
DATA expk<>+376(SB)/8, $1.0
DATA expk<>+384(SB)/8, $2.0
DATA expk<>+392(SB)/8, $2.0
DATA expk<>+400(SB)/8, $2.0
DATA expk<>+408(SB)/8, $2.0
DATA expk<>+416(SB)/8, $708.0
DATA expk<>+424(SB)/8, $708.0
DATA expk<>+432(SB)/8, $708.0
DATA expk<>+440(SB)/8, $708.0
DATA expk<>+448(SB)/8, $1023
DATA expk<>+456(SB)/8, $1023
DATA expk<>+464(SB)/8, $1023
DATA expk<>+472(SB)/8, $1023
DATA expk<>+480(SB)/8, $0x7fffffffffffffff
DATA expk<>+488(SB)/8, $0x7fffffffffffffff
DATA expk<>+496(SB)/8, $0x7fffffffffffffff
DATA expk<>+504(SB)/8, $0x7fffffffffffffff
DATA expk<>+512(SB)/8, $-1.0
DATA expk<>+520(SB)/8, $-1.0
DATA expk<>+528(SB)/8, $-1.0
DATA expk<>+536(SB)/8, $-1.0
GLOBL expk<>(SB), RODATA|NOPTR, $544

// EXPPD sets Y4 = exp(Y1) lane by lane with math.Exp's bits (for |Y1| ≤ 708): k = x·LOG2E
// rounded to nearest (X3, and Y2 as float64), r = (x − k·LN2U − k·LN2L)/16, y = r·P(r) =
// exp(r) − 1 by the Taylor polynomial, four squarings y·(y+2), the last with the + 1 fused,
// then · 2^k. Clobbers Y2, Y3 and Y5.
#define EXPPD \
	VMULPD expk<>+0(SB), Y1, Y2; \
	VCVTPD2DQY Y2, X3; \
	VCVTDQ2PD X3, Y2; \
	VMOVAPD Y1, Y4; \
	VFNMADD231PD expk<>+32(SB), Y2, Y4; \
	VFNMADD231PD expk<>+64(SB), Y2, Y4; \
	VMULPD expk<>+96(SB), Y4, Y4; \
	VMOVUPD expk<>+128(SB), Y5; \
	VFMADD213PD expk<>+160(SB), Y4, Y5; \
	VFMADD213PD expk<>+192(SB), Y4, Y5; \
	VFMADD213PD expk<>+224(SB), Y4, Y5; \
	VFMADD213PD expk<>+256(SB), Y4, Y5; \
	VFMADD213PD expk<>+288(SB), Y4, Y5; \
	VFMADD213PD expk<>+320(SB), Y4, Y5; \
	VFMADD213PD expk<>+352(SB), Y4, Y5; \
	VMULPD Y5, Y4, Y4; \
	VADDPD expk<>+384(SB), Y4, Y5; \
	VMULPD Y5, Y4, Y4; \
	VADDPD expk<>+384(SB), Y4, Y5; \
	VMULPD Y5, Y4, Y4; \
	VADDPD expk<>+384(SB), Y4, Y5; \
	VMULPD Y5, Y4, Y4; \
	VADDPD expk<>+384(SB), Y4, Y5; \
	VFMADD213PD expk<>+352(SB), Y5, Y4; \
	VPMOVSXDQ X3, Y5; \
	VPADDQ expk<>+448(SB), Y5, Y5; \
	VPSLLQ $52, Y5, Y5; \
	VMULPD Y5, Y4, Y4

// func siluMulF32(n4 int, gate, up, out *float32) (done int)
// out[i] = float32(silu(float64(g[i])))·u[i] for the first 4·done elements: groups of four
// in order until n4 groups are done or one holds an element with |g| > 708 or NaN, which
// the caller computes in Go.
TEXT ·siluMulF32(SB), NOSPLIT, $0-40
	MOVQ n4+0(FP), CX
	MOVQ gate+8(FP), AX
	MOVQ up+16(FP), BX
	MOVQ out+24(FP), DI
	XORQ R11, R11
	TESTQ CX, CX
	JZ silusdone
siluloop:
	VCVTPS2PD (AX), Y0                 // g
	VMULPD expk<>+512(SB), Y0, Y1      // x = -g
	VANDPD expk<>+480(SB), Y1, Y2      // |x|
	VCMPPD $6, expk<>+416(SB), Y2, Y3  // !(|x| <= 708)
	VMOVMSKPD Y3, R10
	TESTQ R10, R10
	JNZ silusdone
	EXPPD
	VADDPD expk<>+352(SB), Y4, Y4      // 1 + exp(-g)
	VDIVPD Y4, Y0, Y0                  // silu(g)
	VCVTPD2PSY Y0, X0
	VMULPS (BX), X0, X0
	VMOVUPS X0, (DI)
	ADDQ $16, AX
	ADDQ $16, BX
	ADDQ $16, DI
	INCQ R11
	DECQ CX
	JNZ siluloop
silusdone:
	VZEROUPPER
	MOVQ R11, done+32(FP)
	RET

// func expF64(n4 int, x *float64) (done int)
// x[i] = exp(x[i]) with math.Exp's bits, for groups of four in order until n4 groups are
// done or one holds an element with |x| > 708 or NaN, which the caller computes in Go.
TEXT ·expF64(SB), NOSPLIT, $0-24
	MOVQ n4+0(FP), CX
	MOVQ x+8(FP), DI
	XORQ R11, R11
	TESTQ CX, CX
	JZ expdone
exploop:
	VMOVUPD (DI), Y1
	VANDPD expk<>+480(SB), Y1, Y2      // |x|
	VCMPPD $6, expk<>+416(SB), Y2, Y3  // !(|x| <= 708)
	VMOVMSKPD Y3, R10
	TESTQ R10, R10
	JNZ expdone
	EXPPD
	VMOVUPD Y4, (DI)
	ADDQ $32, DI
	INCQ R11
	DECQ CX
	JNZ exploop
expdone:
	VZEROUPPER
	MOVQ R11, done+16(FP)
	RET

// func siluBwdF32(n4 int, gate, up, dout, dgate, dup *float32) (done int)
// swigluBwd's loop, four elements at a time with its bits: sg = 1/(1+exp(-g)),
// du = float32(d·g·sg), dg = float32(d·u·sg·(1 + g·(1−sg))), in float64 with g, u and d
// widened, each product and sum in the scalar code's order; groups in order until n4 are
// done or one holds an element with |g| > 708 or NaN.
TEXT ·siluBwdF32(SB), NOSPLIT, $0-56
	MOVQ n4+0(FP), CX
	MOVQ gate+8(FP), AX
	MOVQ up+16(FP), BX
	MOVQ dout+24(FP), DX
	MOVQ dgate+32(FP), DI
	MOVQ dup+40(FP), SI
	XORQ R11, R11
	TESTQ CX, CX
	JZ silubdone
silubloop:
	VCVTPS2PD (AX), Y0                 // g
	VMULPD expk<>+512(SB), Y0, Y1      // x = -g
	VANDPD expk<>+480(SB), Y1, Y2      // |x|
	VCMPPD $6, expk<>+416(SB), Y2, Y3  // !(|x| <= 708)
	VMOVMSKPD Y3, R10
	TESTQ R10, R10
	JNZ silubdone
	EXPPD
	VADDPD expk<>+352(SB), Y4, Y4      // 1 + exp(-g)
	VMOVUPD expk<>+352(SB), Y1
	VDIVPD Y4, Y1, Y1                  // sg
	VCVTPS2PD (DX), Y2                 // d
	VMULPD Y0, Y2, Y3                  // d·g
	VMULPD Y1, Y3, Y3                  // ·sg
	VCVTPD2PSY Y3, X3
	VMOVUPS X3, (SI)                   // du
	VCVTPS2PD (BX), Y3                 // u
	VMULPD Y3, Y2, Y2                  // d·u
	VMULPD Y1, Y2, Y2                  // ·sg
	VMOVUPD expk<>+352(SB), Y3
	VSUBPD Y1, Y3, Y3                  // 1 - sg
	VMULPD Y3, Y0, Y3                  // g·(1-sg)
	VADDPD expk<>+352(SB), Y3, Y3      // 1 + g·(1-sg)
	VMULPD Y3, Y2, Y2
	VCVTPD2PSY Y2, X2
	VMOVUPS X2, (DI)                   // dg
	ADDQ $16, AX
	ADDQ $16, BX
	ADDQ $16, DX
	ADDQ $16, DI
	ADDQ $16, SI
	INCQ R11
	DECQ CX
	JNZ silubloop
silubdone:
	VZEROUPPER
	MOVQ R11, done+48(FP)
	RET

// func expAffineF32(n4 int, x *float32, scale, shift float64, out *float64) (done int)
// out[i] = exp(float64(x[i])·scale − shift) with math.Exp's bits (a multiply, then a
// subtract), for groups of four in order until n4 groups are done or one holds an argument
// with |arg| > 708 or NaN, which the caller computes in Go.
TEXT ·expAffineF32(SB), NOSPLIT, $0-48
	MOVQ n4+0(FP), CX
	MOVQ x+8(FP), AX
	VBROADCASTSD scale+16(FP), Y6
	VBROADCASTSD shift+24(FP), Y7
	MOVQ out+32(FP), DI
	XORQ R11, R11
	TESTQ CX, CX
	JZ expadone
expaloop:
	VCVTPS2PD (AX), Y1
	VMULPD Y6, Y1, Y1
	VSUBPD Y7, Y1, Y1                  // arg = x·scale − shift
	VANDPD expk<>+480(SB), Y1, Y2      // |arg|
	VCMPPD $6, expk<>+416(SB), Y2, Y3  // !(|arg| <= 708)
	VMOVMSKPD Y3, R10
	TESTQ R10, R10
	JNZ expadone
	EXPPD
	VMOVUPD Y4, (DI)
	ADDQ $16, AX
	ADDQ $32, DI
	INCQ R11
	DECQ CX
	JNZ expaloop
expadone:
	VZEROUPPER
	MOVQ R11, done+40(FP)
	RET
