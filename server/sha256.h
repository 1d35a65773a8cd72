// server/sha256.h: SHA-256 and HMAC-SHA256 (FIPS 180-4, RFC 2104) for the cluster's shared-secret proofs.
#ifndef DSERVE_SRV_SHA256_H
#define DSERVE_SRV_SHA256_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct srv_sha256 {
  uint32_t h[8];
  uint64_t n_bytes;
  uint8_t block[64];
  size_t used;
} srv_sha256;

void srv_sha256_init(srv_sha256 *s);
void srv_sha256_update(srv_sha256 *s, const void *data, size_t len);
void srv_sha256_final(srv_sha256 *s, uint8_t out[32]);
void srv_hmac_sha256(const uint8_t *key, size_t key_len, const uint8_t *msg, size_t msg_len, uint8_t out[32]);

#ifdef __cplusplus
}
#endif
#endif
