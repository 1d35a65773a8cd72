// kernels/cpu/backend_avx2.c: the "avx2" backend (AVX2 + FMA + F16C; 8-float vectors, maddubs int8 dots).
#define KRN_SIMD_NAME "avx2"
#define KRN_SIMD_TABLE krn_cpu_avx2_table
#include "kernels/cpu/simd_body.h"
