// kvstore/kvs_value.c: the store's keys and values: "dsv:" + hex(SHA-256(space || key)), header + payload + HMAC.
#include <string.h>

#include "kvstore/kvs_int.h"
#include "util/crypto.h"

static void put32(uint8_t *p, uint32_t v) {
  for (int i = 0; i < 4; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static void put64(uint8_t *p, uint64_t v) {
  for (int i = 0; i < 8; i++) p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get32(const uint8_t *p) {
  uint32_t v = 0;
  for (int i = 0; i < 4; i++) v |= (uint32_t)p[i] << (8 * i);
  return v;
}

void kvs_key_name(const uint8_t space[32], uint64_t key, char out[KVS_KEY_LEN + 1]) {
  uint8_t in[40], d[32];
  memcpy(in, space, 32);
  put64(in + 32, key); // little-endian on every host, so every worker names a block alike
  utl_sha256(in, sizeof in, d);
  memcpy(out, "dsv:", 4);
  utl_hex(d, 32, out + 4);
}

size_t kvs_value_payload_off(int block_tokens) { return KVS_HDR + 4 * (size_t)block_tokens; }

size_t kvs_value_len(int block_tokens, size_t block_bytes) {
  return kvs_value_payload_off(block_tokens) + block_bytes + KVS_MAC;
}

static void header(const kvs_config *c, const kvs_block *b, size_t payload_len, uint8_t *h) {
  memcpy(h, KVS_MAGIC, 4);
  put32(h + 4, KVS_VERSION);
  memcpy(h + 8, c->space, 32);
  put64(h + 40, b->key);
  put64(h + 48, b->parent);
  put32(h + 56, (uint32_t)c->block_tokens);
  put32(h + 60, 0);
  put64(h + 64, (uint64_t)payload_len);
}

void kvs_value_encode(const kvs_config *c, const kvs_block *b, const void *payload, uint8_t *out) {
  header(c, b, c->block_bytes, out);
  uint8_t *t = out + KVS_HDR;
  for (int i = 0; i < c->block_tokens; i++) put32(t + 4 * i, (uint32_t)b->toks[i]);
  size_t off = kvs_value_payload_off(c->block_tokens);
  memcpy(out + off, payload, c->block_bytes);
  const void *parts[1] = {out};
  size_t lens[1] = {off + c->block_bytes};
  utl_hmac_sha256(c->mac_key, 32, parts, lens, 1, out + off + c->block_bytes);
}

kvs_verdict kvs_value_check(const kvs_config *c, const kvs_block *b, const uint8_t *v, size_t n) {
  if (n < KVS_MAC) return KVS_V_MAC;
  // The MAC first: nothing of a value is read before we know one of our workers wrote it.
  uint8_t mac[32];
  const void *parts[1] = {v};
  size_t lens[1] = {n - KVS_MAC};
  utl_hmac_sha256(c->mac_key, 32, parts, lens, 1, mac);
  if (!utl_ct_equal(mac, v + n - KVS_MAC, KVS_MAC)) return KVS_V_MAC;
  // Then that it is this block: a value of another model, layout, chain or token run under a colliding (or copied)
  // key would be genuine but wrong.
  if (n != kvs_value_len(c->block_tokens, c->block_bytes)) return KVS_V_MISMATCH;
  uint8_t h[KVS_HDR];
  header(c, b, c->block_bytes, h);
  if (memcmp(h, v, KVS_HDR) != 0) return KVS_V_MISMATCH;
  const uint8_t *t = v + KVS_HDR;
  for (int i = 0; i < c->block_tokens; i++)
    if (get32(t + 4 * i) != (uint32_t)b->toks[i]) return KVS_V_MISMATCH;
  return KVS_V_OK;
}
