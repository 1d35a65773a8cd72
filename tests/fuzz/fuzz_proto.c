// tests/fuzz/fuzz_proto.c: libFuzzer target: arbitrary JSON through every control-message decoder (proto/); a
// decoded message is encoded again and that must decode too. Nothing may crash or leak.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "proto/events.h"
#include "proto/handoff.h"
#include "proto/hello.h"
#include "proto/prefix.h"
#include "proto/request.h"
#include "proto/stats.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// Decodes j as type T with dec, re-encodes it with enc, decodes that again (must succeed), frees with fr.
#define ROUND(T, dec, enc, fr)                                                                                        \
  do {                                                                                                                \
    T m, m2;                                                                                                          \
    if (dec(j, &m, err, sizeof err) == 0) {                                                                           \
      cJSON *e = enc(&m, err, sizeof err);                                                                            \
      if (!e) abort();                                                                                                \
      if (dec(e, &m2, err, sizeof err)) abort();                                                                      \
      fr(&m2);                                                                                                        \
      cJSON_Delete(e);                                                                                                \
      fr(&m);                                                                                                         \
    }                                                                                                                 \
  } while (0)

#define NOFREE(p) (void)(p)

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *s = malloc(size + 1);
  if (!s) return 0;
  memcpy(s, data, size);
  s[size] = 0;
  cJSON *j = cJSON_Parse(s);
  free(s);
  if (!j) return 0;
  char err[256];
  ROUND(prt_challenge, prt_challenge_decode, prt_challenge_encode, NOFREE);
  ROUND(prt_hello, prt_hello_decode, prt_hello_encode, NOFREE);
  ROUND(prt_hello_ok, prt_hello_ok_decode, prt_hello_ok_encode, NOFREE);
  ROUND(prt_generate, prt_generate_decode, prt_generate_encode, prt_generate_free);
  ROUND(prt_token, prt_token_decode, prt_token_encode, prt_token_free);
  ROUND(prt_done, prt_done_decode, prt_done_encode, NOFREE);
  ROUND(prt_error, prt_error_decode, prt_error_encode, NOFREE);
  ROUND(prt_cancel, prt_cancel_decode, prt_cancel_encode, NOFREE);
  ROUND(prt_stats_ok, prt_stats_ok_decode, prt_stats_ok_encode, NOFREE);
  ROUND(prt_kv_table, prt_kv_table_decode, prt_kv_table_encode, prt_kv_table_free);
  ROUND(prt_kv_first, prt_kv_first_decode, prt_kv_first_encode, NOFREE);
  ROUND(prt_kv_started, prt_kv_started_decode, prt_kv_started_encode, NOFREE);
  ROUND(prt_kv_fail, prt_kv_fail_decode, prt_kv_fail_encode, NOFREE);
  ROUND(prt_kv_freed, prt_kv_freed_decode, prt_kv_freed_encode, NOFREE);
  ROUND(prt_prefix_pull, prt_prefix_pull_decode, prt_prefix_pull_encode, prt_prefix_pull_free);
  ROUND(prt_prefix_pulled, prt_prefix_pulled_decode, prt_prefix_pulled_encode, NOFREE);
  ROUND(prt_prefix_fail, prt_prefix_fail_decode, prt_prefix_fail_encode, NOFREE);
  ROUND(prt_kv_events, prt_kv_events_decode, prt_kv_events_encode, prt_kv_events_free);
  // token_batch: every item of a batch decodes (or is refused) as a lone token would
  const cJSON *items = prt_tokens_items(j, err, sizeof err), *it;
  cJSON_ArrayForEach(it, items) {
    prt_token t;
    if (!prt_token_decode(it, &t, err, sizeof err)) (void)prt_tokens_count(j);
    prt_token_free(&t);
  }
  (void)prt_op(j);
  cJSON_Delete(j);
  return 0;
}
