// kernels/cpu/backend_avx512.c: the "avx512" backend (AVX-512 F/BW/VL/DQ + VNNI; 16-float vectors, vpdpbusd int8 dots).
#define KRN_W512 1
#define KRN_SIMD_NAME "avx512"
#define KRN_SIMD_TABLE krn_cpu_avx512_table
#include "kernels/cpu/simd_body.h"
