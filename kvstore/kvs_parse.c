// kvstore/kvs_parse.c: hiredis's reply parser, bounded: a store (shared infrastructure, maybe not ours) must not make
// a worker allocate what no real reply needs.
#include <string.h>

#include "kvstore/kvs_int.h"

// hiredis 0.14 allocates a declared array's whole pointer table before any element arrives ("*1000000000" is 8 GB
// asked for by 14 bytes); this refuses such an array (the reader then fails with an out-of-memory error).
static void *create_array(const redisReadTask *task, int elements) {
  kvs_parser *p = task->privdata;
  if (elements > KVS_MAX_ARRAY) return NULL;
  return p->array(task, elements);
}

int kvs_parser_init(kvs_parser *p, size_t max_pending) {
  memset(p, 0, sizeof *p);
  p->rd = redisReaderCreate();
  if (!p->rd) return -1;
  // hiredis's own functions (static in it), with our check in front of createArray
  p->fn = *p->rd->fn;
  p->array = p->fn.createArray;
  p->fn.createArray = create_array;
  p->rd->fn = &p->fn;
  p->rd->privdata = p;
  p->max_pending = max_pending;
  return 0;
}

void kvs_parser_free(kvs_parser *p) {
  if (p->rd) redisReaderFree(p->rd);
  p->rd = NULL;
}

int kvs_parser_feed(kvs_parser *p, const char *buf, size_t n) {
  return redisReaderFeed(p->rd, buf, n) == REDIS_OK ? 0 : -1;
}

int kvs_parser_get(kvs_parser *p, redisReply **out) {
  void *r = NULL;
  *out = NULL;
  if (redisReaderGetReply(p->rd, &r) != REDIS_OK) return -1;
  // No whole reply yet: what waits is (the start of) one reply, which may not outgrow the largest we ask for.
  if (!r && p->rd->len - p->rd->pos > p->max_pending) return -1;
  *out = r;
  return 0;
}
