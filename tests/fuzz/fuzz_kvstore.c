// tests/fuzz/fuzz_kvstore.c: libFuzzer target for what kvstore reads from a store it does not trust: RESP replies
// (hiredis's parser with kvstore's bounds, then CLUSTER SLOTS and MOVED/ASK handling) and values (signed here with the right key, so the
// checks after the MAC are reached too). Nothing may crash or leak.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kvstore/kvs_int.h"
#include "util/crypto.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static void replies(const uint8_t *data, size_t size) {
  kvs_parser p;
  if (kvs_parser_init(&p, (size_t)1 << 16) < 0) return;
  kvs_topo t = {0};
  if (kvs_parser_feed(&p, (const char *)data, size) == 0) {
    for (int i = 0; i < 16; i++) {
      redisReply *r = NULL;
      if (kvs_parser_get(&p, &r) < 0 || !r) break;
      char err[128], host[256];
      int port = 0;
      if (kvs_topo_load(&t, r, "127.0.0.1", err, sizeof err) == 0) {
        for (int s = 0; s < KVS_SLOTS; s++)
          if (t.slot[s] >= t.n_nodes) abort(); // a slot names a node that is not there
      }
      if (kvs_redirect(r, host, sizeof host, &port) && (port < 1 || port > 65535 || !host[0])) abort();
      freeReplyObject(r);
    }
  }
  kvs_topo_free(&t);
  kvs_parser_free(&p);
}

static void value(const uint8_t *data, size_t size) {
  kvs_config c = {0};
  memset(c.mac_key, 7, 32);
  memset(c.space, 9, 32);
  c.block_tokens = 2;
  c.block_bytes = 16;
  int32_t toks[2] = {1, 2};
  kvs_block b = {.key = 5, .parent = 4, .toks = toks};
  uint8_t *v = malloc(size + KVS_MAC + 1);
  if (!v) return;
  memcpy(v, data, size);
  const void *parts[1] = {v};
  size_t lens[1] = {size};
  utl_hmac_sha256(c.mac_key, 32, parts, lens, 1, v + size); // a genuine MAC over whatever the header says
  kvs_verdict k = kvs_value_check(&c, &b, v, size + KVS_MAC);
  if (k == KVS_V_MAC) abort(); // signed with the key: only the fields may disagree
  if (k == KVS_V_OK) {         // then it must be exactly the value kvs_value_encode makes
    uint8_t *w = malloc(kvs_value_len(2, 16));
    if (!w) abort();
    kvs_value_encode(&c, &b, v + kvs_value_payload_off(2), w);
    if (size + KVS_MAC != kvs_value_len(2, 16) || memcmp(w, v, size + KVS_MAC)) abort();
    free(w);
  }
  (void)kvs_value_check(&c, &b, data, size); // unsigned: the MAC check alone, on any length
  free(v);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  if (size < 1) return 0;
  if (data[0] & 1) replies(data + 1, size - 1);
  else value(data + 1, size - 1);
  return 0;
}
