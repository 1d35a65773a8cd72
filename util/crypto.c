// util/crypto.c: SHA-256, HMAC, HKDF, AES-256-GCM and base64 through libcrypto; random bytes from getrandom(2).
#include "util/crypto.h"

#include <errno.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>

#include <openssl/core_names.h>
#include <openssl/crypto.h>
#include <openssl/evp.h>
#include <openssl/hmac.h>
#include <openssl/kdf.h>
#include <openssl/params.h>
#include <openssl/sha.h>

void utl_sha256(const void *data, size_t len, uint8_t out[32]) { SHA256(data, len, out); }

void utl_hmac_sha256(const void *key, size_t klen, const void *const *parts, const size_t *lens, int nparts,
                     uint8_t out[32]) {
  // Keys over 64 bytes are hashed first by HMAC itself; an empty key is a valid (all-zero) HMAC key.
  static const uint8_t zero = 0;
  EVP_MAC *mac = EVP_MAC_fetch(NULL, "HMAC", NULL);
  EVP_MAC_CTX *ctx = mac ? EVP_MAC_CTX_new(mac) : NULL;
  OSSL_PARAM params[] = {OSSL_PARAM_construct_utf8_string(OSSL_MAC_PARAM_DIGEST, (char *)"SHA256", 0),
                         OSSL_PARAM_construct_end()};
  size_t got = 0;
  int ok = ctx && EVP_MAC_init(ctx, klen ? key : &zero, klen, params);
  for (int i = 0; ok && i < nparts; i++) ok = EVP_MAC_update(ctx, parts[i], lens[i]);
  ok = ok && EVP_MAC_final(ctx, out, &got, 32) && got == 32;
  if (!ok) memset(out, 0, 32); // never equal to a real MAC by chance of a caller's compare: both sides fail alike
  EVP_MAC_CTX_free(ctx);
  EVP_MAC_free(mac);
}

int utl_hkdf_sha256(const void *ikm, size_t ikm_len, const void *salt, size_t salt_len, const void *info,
                    size_t info_len, uint8_t *out, size_t n) {
  EVP_KDF *kdf = EVP_KDF_fetch(NULL, "HKDF", NULL);
  EVP_KDF_CTX *ctx = kdf ? EVP_KDF_CTX_new(kdf) : NULL;
  OSSL_PARAM params[] = {
      OSSL_PARAM_construct_utf8_string(OSSL_KDF_PARAM_DIGEST, (char *)"SHA256", 0),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_KEY, (void *)ikm, ikm_len),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_SALT, (void *)salt, salt_len),
      OSSL_PARAM_construct_octet_string(OSSL_KDF_PARAM_INFO, (void *)info, info_len),
      OSSL_PARAM_construct_end()};
  int ok = ctx && EVP_KDF_derive(ctx, out, n, params) > 0;
  EVP_KDF_CTX_free(ctx);
  EVP_KDF_free(kdf);
  return ok ? 0 : -1;
}

int utl_random(void *p, size_t n) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = getrandom(b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

int utl_ct_equal(const void *a, const void *b, size_t n) { return CRYPTO_memcmp(a, b, n) == 0; }

void utl_wipe(void *p, size_t n) { OPENSSL_cleanse(p, n); }

void utl_crypto_thread_done(void) { OPENSSL_thread_stop(); }

void utl_hex(const uint8_t *p, size_t n, char *out) {
  static const char d[] = "0123456789abcdef";
  for (size_t i = 0; i < n; i++) {
    out[2 * i] = d[p[i] >> 4];
    out[2 * i + 1] = d[p[i] & 15];
  }
  out[2 * n] = 0;
}

char *utl_base64_encode(const void *data, size_t len) {
  if (len > (size_t)INT_MAX / 4 * 3 - 3) return NULL;
  char *out = malloc(4 * ((len + 2) / 3) + 1);
  if (out) EVP_EncodeBlock((unsigned char *)out, data, (int)len);
  return out;
}

int utl_base64_decode(const char *s, size_t slen, uint8_t **out, size_t *len) {
  *out = NULL;
  *len = 0;
  // EVP_DecodeBlock skips leading and trailing white space and counts padding as zero bytes: refuse what it would
  // pass over (white space, a length that is not a multiple of 4) and take the padding off by hand.
  if (slen % 4 || slen > (size_t)INT_MAX) return -1;
  for (size_t i = 0; i < slen; i++) {
    char c = s[i];
    int pad_ok = c == '=' && (i == slen - 1 || (i == slen - 2 && s[slen - 1] == '='));
    if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '+' || c == '/' ||
          pad_ok))
      return -1;
  }
  uint8_t *b = malloc(slen / 4 * 3 + 1);
  if (!b) return -1;
  int n = slen ? EVP_DecodeBlock(b, (const unsigned char *)s, (int)slen) : 0;
  if (n < 0) {
    free(b);
    return -1;
  }
  size_t pad = slen && s[slen - 1] == '=' ? (s[slen - 2] == '=' ? 2 : 1) : 0;
  *len = (size_t)n - pad;
  b[*len] = 0; // a text value reads as a C string
  *out = b;
  return 0;
}

struct utl_seal {
  EVP_CIPHER_CTX *ctx; // (owned) the key is set once; each message sets its nonce
  uint8_t label[4];
  uint64_t seq;
  int opening;
};

utl_seal *utl_seal_new(const uint8_t key[32], const char label[4], int opening) {
  utl_seal *s = calloc(1, sizeof *s);
  if (!s) return NULL;
  s->ctx = EVP_CIPHER_CTX_new();
  memcpy(s->label, label, 4);
  s->opening = opening;
  int ok = s->ctx && EVP_CipherInit_ex(s->ctx, EVP_aes_256_gcm(), NULL, NULL, NULL, opening ? 0 : 1) &&
           EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_SET_IVLEN, 12, NULL) &&
           EVP_CipherInit_ex(s->ctx, NULL, NULL, key, NULL, opening ? 0 : 1);
  if (!ok) {
    utl_seal_free(s);
    return NULL;
  }
  return s;
}

void utl_seal_free(utl_seal *s) {
  if (!s) return;
  EVP_CIPHER_CTX_free(s->ctx); // cleanses the key schedule
  free(s);
}

uint64_t utl_seal_seq(const utl_seal *s) { return s->seq; }

int utl_seal_begin(utl_seal *s, const void *aad, size_t aad_len) {
  uint8_t iv[12];
  memcpy(iv, s->label, 4);
  for (int i = 0; i < 8; i++) iv[4 + i] = (uint8_t)(s->seq >> (56 - 8 * i));
  s->seq++;
  int outl = 0;
  if (aad_len > INT_MAX) return -1;
  if (!EVP_CipherInit_ex(s->ctx, NULL, NULL, NULL, iv, s->opening ? 0 : 1)) return -1;
  if (aad_len && !EVP_CipherUpdate(s->ctx, NULL, &outl, aad, (int)aad_len)) return -1;
  return 0;
}

int utl_seal_update(utl_seal *s, const void *in, size_t n, void *out) {
  const uint8_t *i = in;
  uint8_t *o = out;
  while (n) { // EVP takes an int length
    int k = n > (1u << 30) ? 1 << 30 : (int)n, outl = 0;
    if (!EVP_CipherUpdate(s->ctx, o, &outl, i, k) || outl != k) return -1;
    i += k;
    o += k;
    n -= (size_t)k;
  }
  return 0;
}

int utl_seal_end(utl_seal *s, uint8_t tag[UTL_SEAL_TAG]) {
  uint8_t tail[16];
  int outl = 0;
  if (s->opening) {
    if (!EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_SET_TAG, UTL_SEAL_TAG, tag)) return -1;
    return EVP_CipherFinal_ex(s->ctx, tail, &outl) > 0 ? 0 : -1;
  }
  if (!EVP_CipherFinal_ex(s->ctx, tail, &outl)) return -1;
  return EVP_CIPHER_CTX_ctrl(s->ctx, EVP_CTRL_GCM_GET_TAG, UTL_SEAL_TAG, tag) ? 0 : -1;
}
