// kernels/cpu/backend_avx2vnni.c: the "avx2vnni" backend (AVX2 + FMA + F16C + AVX-VNNI; 8-float vectors, 256-bit vpdpbusd int8 dots).
#define KRN_AVXVNNI 1
#define KRN_SIMD_NAME "avx2vnni"
#define KRN_SIMD_TABLE krn_cpu_avx2vnni_table
#include "kernels/cpu/simd_body.h"
