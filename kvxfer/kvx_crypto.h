// kvxfer/kvx_crypto.h: SHA-256, HMAC-SHA256 and constant-time compare, shared by kvxfer and the control hub.
#ifndef DSERVE_KVX_CRYPTO_H
#define DSERVE_KVX_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

void kvx_sha256(const void *data, size_t len, uint8_t out[32]);
// HMAC-SHA256 of the concatenation of parts (nparts of them, lens[i] bytes each) under key.
void kvx_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens, int nparts,
                     uint8_t out[32]);
int kvx_ct_equal(const void *a, const void *b, size_t n); // 1 when equal; time depends only on n

#ifdef __cplusplus
}
#endif
#endif
