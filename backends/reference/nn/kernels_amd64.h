// Register blocks shared by the AVX2 kernels (kernels_amd64.s, kernels_rows_amd64.s).

// ZERO_Y0_Y7 clears the accumulators Y0..Y7.
#define ZERO_Y0_Y7 \
	VXORPS Y0, Y0, Y0; \
	VXORPS Y1, Y1, Y1; \
	VXORPS Y2, Y2, Y2; \
	VXORPS Y3, Y3, Y3; \
	VXORPS Y4, Y4, Y4; \
	VXORPS Y5, Y5, Y5; \
	VXORPS Y6, Y6, Y6; \
	VXORPS Y7, Y7, Y7

// STORE_Y0_Y7 writes Y0..Y7 to the 64 floats at DI.
#define STORE_Y0_Y7 \
	VMOVUPS Y0, (DI); \
	VMOVUPS Y1, 32(DI); \
	VMOVUPS Y2, 64(DI); \
	VMOVUPS Y3, 96(DI); \
	VMOVUPS Y4, 128(DI); \
	VMOVUPS Y5, 160(DI); \
	VMOVUPS Y6, 192(DI); \
	VMOVUPS Y7, 224(DI)

// STORE_6X16 writes a 6×16 tile held two registers a row in Y0..Y11 to C at DI, rows R8
// bytes apart (DI ends at the last row); ADD_STORE_6X16 adds C's values to the tile first.
#define STORE_6X16 \
	VMOVUPS Y0, (DI); VMOVUPS Y1, 32(DI); ADDQ R8, DI; \
	VMOVUPS Y2, (DI); VMOVUPS Y3, 32(DI); ADDQ R8, DI; \
	VMOVUPS Y4, (DI); VMOVUPS Y5, 32(DI); ADDQ R8, DI; \
	VMOVUPS Y6, (DI); VMOVUPS Y7, 32(DI); ADDQ R8, DI; \
	VMOVUPS Y8, (DI); VMOVUPS Y9, 32(DI); ADDQ R8, DI; \
	VMOVUPS Y10, (DI); VMOVUPS Y11, 32(DI)

#define ADD_STORE_6X16 \
	VADDPS (DI), Y0, Y0; VADDPS 32(DI), Y1, Y1; VMOVUPS Y0, (DI); VMOVUPS Y1, 32(DI); ADDQ R8, DI; \
	VADDPS (DI), Y2, Y2; VADDPS 32(DI), Y3, Y3; VMOVUPS Y2, (DI); VMOVUPS Y3, 32(DI); ADDQ R8, DI; \
	VADDPS (DI), Y4, Y4; VADDPS 32(DI), Y5, Y5; VMOVUPS Y4, (DI); VMOVUPS Y5, 32(DI); ADDQ R8, DI; \
	VADDPS (DI), Y6, Y6; VADDPS 32(DI), Y7, Y7; VMOVUPS Y6, (DI); VMOVUPS Y7, 32(DI); ADDQ R8, DI; \
	VADDPS (DI), Y8, Y8; VADDPS 32(DI), Y9, Y9; VMOVUPS Y8, (DI); VMOVUPS Y9, 32(DI); ADDQ R8, DI; \
	VADDPS (DI), Y10, Y10; VADDPS 32(DI), Y11, Y11; VMOVUPS Y10, (DI); VMOVUPS Y11, 32(DI)
