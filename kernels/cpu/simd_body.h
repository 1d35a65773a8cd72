// kernels/cpu/simd_body.h: the AVX2 and AVX-512 backends' ops, written once over a small vector vocabulary.
// Included by backend_avx2.c (KRN_W512 undefined: 8-float vectors, maddubs dot products), backend_avx2vnni.c (the
// same with AVX-VNNI vpdpbusd dot products, KRN_AVXVNNI) and by
// backend_avx512.c (KRN_W512 defined: 16-float vectors, VNNI vpdpbusd dot products on 256-bit blocks).
// Defines one table; the including file names it KRN_SIMD_TABLE and its name string KRN_SIMD_NAME.
// The ops are in simd_vec.h (the vector vocabulary), simd_matmul.h (with matmul_rows.h, matmul_x16.h),
// simd_elementwise.h and simd_attn.h; this file puts them in the table.

#include "kernels/cpu/simd_attn.h"
#include "kernels/cpu/simd_elementwise.h"
#include "kernels/cpu/simd_matmul.h"
#include "kernels/cpu/simd_vec.h"

static const krn_backend simd_backend = {
    .name = KRN_SIMD_NAME,
    .alloc = krn_scalar_alloc,
    .free = krn_scalar_free,
    .upload = krn_scalar_upload,
    .download = krn_scalar_download,
    .sync = krn_scalar_sync,
    .matmul = simd_matmul,
    .get_rows = krn_scalar_get_rows,
    .rmsnorm = simd_rmsnorm,
    .rope = simd_rope,
    .swiglu = simd_swiglu,
    .softmax = simd_softmax,
    .add = simd_add,
    .kv_store = simd_kv_store,
    .paged_attention = simd_paged_attention,
    .ctx_init = NULL,
    .ctx_fini = NULL,
    .event_new = krn_scalar_event_new,
    .event_free = krn_scalar_event_noop,
    .event_record = krn_scalar_event_noop,
    .event_wait = krn_scalar_event_noop,
    .geglu = simd_geglu,
    .scale = krn_scalar_scale,
    .attn_window = 1,
    .kv_q8_0 = 1,
    .rope_freqs = simd_rope_freqs,
    .matmul_group = simd_matmul_group,
    .moe_combine = simd_moe_combine,
    .attn_softcap = 1,
    .attn_vdim = 1,
    .softcap = simd_softcap,
};

const krn_backend *KRN_SIMD_TABLE(void) { return &simd_backend; }
