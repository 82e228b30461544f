//go:build amd64

#include "textflag.h"
#include "kernels_amd64.h"

// func widenBF16AVX2(dst *float32, src *uint16, n int)
// dst[i] = float32 with the bits src[i]<<16, for n a multiple of 8: VPMOVZXWD widens eight
// halves to eight 32-bit lanes and VPSLLD moves them to the high half (exact).
TEXT ·widenBF16AVX2(SB), NOSPLIT, $0-24
	MOVQ dst+0(FP), DI
	MOVQ src+8(FP), SI
	MOVQ n+16(FP), CX
	SHRQ $3, CX
	JZ   done
	// 32 halves a pass while they last
	MOVQ CX, DX
	SHRQ $2, DX
	JZ   one
four:
	VPMOVZXWD (SI), Y0
	VPMOVZXWD 16(SI), Y1
	VPMOVZXWD 32(SI), Y2
	VPMOVZXWD 48(SI), Y3
	VPSLLD    $16, Y0, Y0
	VPSLLD    $16, Y1, Y1
	VPSLLD    $16, Y2, Y2
	VPSLLD    $16, Y3, Y3
	VMOVUPS   Y0, (DI)
	VMOVUPS   Y1, 32(DI)
	VMOVUPS   Y2, 64(DI)
	VMOVUPS   Y3, 96(DI)
	ADDQ      $64, SI
	ADDQ      $128, DI
	DECQ      DX
	JNZ       four
	ANDQ      $3, CX
	JZ        done
one:
	VPMOVZXWD (SI), Y0
	VPSLLD    $16, Y0, Y0
	VMOVUPS   Y0, (DI)
	ADDQ      $16, SI
	ADDQ      $32, DI
	DECQ      CX
	JNZ       one
done:
	VZEROUPPER
	RET

// func sdot1x8cBF16(k8 int, a *float32, b *uint16, ldb int, ng int, c *float32, acc bool)
// sdot1x8c with B's rows held as bfloat16: each load of eight halves is widened to float32
// (VPMOVZXWD, VPSLLD $16: exact) and multiplied in the same FMA lanes, so the sums are
// sdot1x8c's on the widened rows, bit for bit.
TEXT ·sdot1x8cBF16(SB), NOSPLIT, $0-49
	MOVQ b+16(FP), BX
	MOVQ ng+32(FP), R12
	MOVQ c+40(FP), DI
	TESTQ R12, R12
	JZ b18done
b18group:
	MOVQ a+8(FP), AX
	MOVQ k8+0(FP), CX
	MOVQ ldb+24(FP), R8
	SHLQ $1, R8
	LEAQ (BX)(R8*1), R9 // row 1
	LEAQ (BX)(R8*2), R10 // row 2
	LEAQ (R9)(R8*2), R11 // row 3
	LEAQ (BX)(R8*4), R13 // row 4
	LEAQ (R9)(R8*4), DX // row 5
	LEAQ (R10)(R8*4), SI // row 6
	LEAQ (R11)(R8*4), R8 // row 7 (ldb is loaded again for the next group)
	ZERO_Y0_Y7
	TESTQ CX, CX
	JZ b18reduce
b18loop:
	VMOVUPS (AX), Y8
	VPMOVZXWD (BX), Y9
	VPMOVZXWD (R9), Y10
	VPMOVZXWD (R10), Y11
	VPMOVZXWD (R11), Y12
	VPSLLD $16, Y9, Y9
	VPSLLD $16, Y10, Y10
	VPSLLD $16, Y11, Y11
	VPSLLD $16, Y12, Y12
	VFMADD231PS Y9, Y8, Y0
	VFMADD231PS Y10, Y8, Y1
	VFMADD231PS Y11, Y8, Y2
	VFMADD231PS Y12, Y8, Y3
	VPMOVZXWD (R13), Y9
	VPMOVZXWD (DX), Y10
	VPMOVZXWD (SI), Y11
	VPMOVZXWD (R8), Y12
	VPSLLD $16, Y9, Y9
	VPSLLD $16, Y10, Y10
	VPSLLD $16, Y11, Y11
	VPSLLD $16, Y12, Y12
	VFMADD231PS Y9, Y8, Y4
	VFMADD231PS Y10, Y8, Y5
	VFMADD231PS Y11, Y8, Y6
	VFMADD231PS Y12, Y8, Y7
	ADDQ $32, AX
	ADDQ $16, BX
	ADDQ $16, R9
	ADDQ $16, R10
	ADDQ $16, R11
	ADDQ $16, R13
	ADDQ $16, DX
	ADDQ $16, SI
	ADDQ $16, R8
	DECQ CX
	JNZ b18loop
b18reduce:
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
	JEQ b18store
	VADDPS (DI), Y11, Y11
b18store:
	VMOVUPS Y11, (DI)
	ADDQ $32, DI
	// next group: row 0 moves on by 8 rows, back by the k8 blocks it advanced
	MOVQ k8+0(FP), CX
	SHLQ $4, CX
	SUBQ CX, BX
	MOVQ ldb+24(FP), R8
	SHLQ $1, R8
	LEAQ (BX)(R8*8), BX
	DECQ R12
	JNZ b18group
b18done:
	VZEROUPPER
	RET
