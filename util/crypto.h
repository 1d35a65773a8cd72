// util/crypto.h: the crypto every module uses, from libcrypto (OpenSSL 3): SHA-256, HMAC, HKDF, random bytes,
// constant-time compare, base64, and AES-256-GCM sealing with a per-direction sequence number.
#ifndef DSERVE_UTL_CRYPTO_H
#define DSERVE_UTL_CRYPTO_H

#include <stddef.h>
#include <stdint.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

void utl_sha256(const void *data, size_t len, uint8_t out[32]);
// HMAC-SHA256 of the concatenation of parts (nparts of them, lens[i] bytes each) under key.
void utl_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens, int nparts,
                     uint8_t out[32]);
// HKDF-SHA256 (RFC 5869): n bytes of key material from ikm, salt and info. 0, or -1 (libcrypto failed).
int utl_hkdf_sha256(const void *ikm, size_t ikm_len, const void *salt, size_t salt_len, const void *info,
                    size_t info_len, uint8_t *out, size_t n) UTL_WARN_UNUSED;
int utl_random(void *p, size_t n) UTL_WARN_UNUSED; // getrandom(2): 0, or -1 with errno
int utl_ct_equal(const void *a, const void *b, size_t n); // 1 when equal; time depends only on n
void utl_wipe(void *p, size_t n);                         // zeroes n bytes in a way the compiler keeps
void utl_hex(const uint8_t *p, size_t n, char *out);      // 2n lowercase hex digits and a NUL
// Frees libcrypto's state for the calling thread (its error queue), which libcrypto would free only as the thread
// ends: a detached thread calls it before it tells its owner it is done, so that nothing of it is left when the
// owner (and then the process) goes on.
void utl_crypto_thread_done(void);

// Base64 (RFC 4648, with padding). encode: a malloc'ed NUL-terminated string, NULL on out of memory.
// decode: 0 with *out malloc'ed (*len bytes and a NUL after them), -1 when s is not base64 (or memory ran out).
char *utl_base64_encode(const void *data, size_t len);
int utl_base64_decode(const char *s, size_t slen, uint8_t **out, size_t *len) UTL_WARN_UNUSED;

// One direction of a sealed channel: AES-256-GCM under its own key, each message's 96-bit nonce the direction's
// 4-byte label then its 64-bit sequence number (0, 1, 2, ... in the order sealed). The opener counts the same way,
// so a message that was changed, repeated, dropped or reordered fails to open; the channel is then dead.
#define UTL_SEAL_TAG 16
typedef struct utl_seal utl_seal;
// key: 32 bytes; label: 4 bytes naming the direction; opening: 1 for the receiving side. NULL on out of memory.
utl_seal *utl_seal_new(const uint8_t key[32], const char label[4], int opening);
void utl_seal_free(utl_seal *s);
// One message in pieces: begin (its additional data, authenticated, not encrypted), any number of updates (out may
// equal in; sealing encrypts, opening decrypts), then end: sealing writes the tag, opening checks it. The
// sequence number moves on at begin. 0, or -1: libcrypto failed, or (end, opening) the tag does not match.
int utl_seal_begin(utl_seal *s, const void *aad, size_t aad_len) UTL_WARN_UNUSED;
int utl_seal_update(utl_seal *s, const void *in, size_t n, void *out) UTL_WARN_UNUSED;
int utl_seal_end(utl_seal *s, uint8_t tag[UTL_SEAL_TAG]) UTL_WARN_UNUSED;
uint64_t utl_seal_seq(const utl_seal *s); // messages begun so far

#ifdef __cplusplus
}
#endif
#endif
