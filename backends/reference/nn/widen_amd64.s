//go:build amd64

#include "textflag.h"

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
