// kv/prefix.c: the cross-request KV block store: hash-chained entries, per-tier LRU lists, leaf-first eviction, events.
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "kv/prefix.h"
#include "util/log.h"

#define NT 3 // tiers: 0 pool, 1 host DRAM, 2 disk

typedef struct pf_ent {
  uint64_t key;
  int32_t parent;     // entry index, -1 for a first block
  int32_t hnext;      // next entry in the same bucket; next free entry when not live
  int32_t prev, next; // this tier's LRU list: prev is more recent
  int32_t block;      // tier 0: pool block id (the store's reference)
  int32_t slot;       // tier 1: arena slot; tier 2: file slot
  int32_t nch[NT];    // children per tier
  int8_t tier;        // 0..2, -1 when not live
  int8_t pinned;      // being restored: not an eviction candidate
} pf_ent;

typedef struct pf_tier {
  int head, tail; // most / least recently used, -1 when empty
  int n;
} pf_tier;

struct kv_prefix {
  kv_pool *pool; // (borrowed)
  kv_blockhash_fn hash;
  int bs;            // tokens per block
  int budget;        // tier-0 entries kept
  size_t bbytes;     // bytes of one block
  pf_ent *ents;      // (owned) (cap_ents)
  int32_t *toks;     // (owned) (cap_ents, bs)
  int cap_ents, free_ent; // free_ent: head of the free list through hnext, -1 none; never-used from n_used
  int n_used;
  int32_t *buckets;  // (owned) (n_buckets) first entry per bucket, -1 empty
  uint64_t bmask;
  pf_tier tier[NT];
  int slots[NT];         // slots of tiers 1 and 2 (tier 0's limit is budget)
  int32_t *free_slot[NT];// (owned) (slots) stacks of free slots for tiers 1, 2
  int n_free_slot[NT];
  unsigned char *arena;  // (owned) (host_blocks, bbytes) tier 1
  int fd;                // tier 2 file, -1 none
  char *path;            // (owned) tier 2 file name
  unsigned char *scratch;// (owned) (bbytes) bounce buffer for tier 2
  kv_event *ev;      // (owned) (max_ev) pending events, oldest first
  int n_ev, max_ev;
  int quiet;             // 1 while clearing: no REMOVED events (CLEARED says it all)
  char log_name[64];     // its log lines' component
  int warned[NT];        // tier t's first refusal was logged
  kv_prefix_stats st;
};

// ---- small helpers

static uint64_t pf_bucket(const kv_prefix *s, uint64_t key) { return (key ^ (key >> 29)) & s->bmask; }

static void pf_event(kv_prefix *s, int kind, uint64_t key) {
  if (s->quiet) return;
  if (s->n_ev >= s->max_ev) {
    s->st.events_lost += (uint64_t)s->n_ev;
    s->n_ev = 0;
    s->ev[s->n_ev++] = (kv_event){0, KV_EVENT_CLEARED};
    if (s->n_ev >= s->max_ev) return;
  }
  s->ev[s->n_ev++] = (kv_event){key, kind};
}

static void lru_unlink(kv_prefix *s, int i) {
  pf_ent *e = &s->ents[i];
  pf_tier *t = &s->tier[e->tier];
  if (e->prev >= 0) s->ents[e->prev].next = e->next;
  else t->head = e->next;
  if (e->next >= 0) s->ents[e->next].prev = e->prev;
  else t->tail = e->prev;
  e->prev = e->next = -1;
  t->n--;
}

static void lru_front(kv_prefix *s, int i) {
  pf_ent *e = &s->ents[i];
  pf_tier *t = &s->tier[e->tier];
  e->prev = -1;
  e->next = t->head;
  if (t->head >= 0) s->ents[t->head].prev = i;
  t->head = i;
  if (t->tail < 0) t->tail = i;
  t->n++;
}

static void lru_touch(kv_prefix *s, int i) {
  lru_unlink(s, i);
  lru_front(s, i);
}

// Moves live entry i to tier nt (list and the parent's child counts); bytes are the caller's business.
static void set_tier(kv_prefix *s, int i, int nt) {
  pf_ent *e = &s->ents[i];
  lru_unlink(s, i);
  if (e->parent >= 0) {
    s->ents[e->parent].nch[e->tier]--;
    s->ents[e->parent].nch[nt]++;
  }
  e->tier = (int8_t)nt;
  lru_front(s, i);
}

static int tok_eq(const kv_prefix *s, int i, const int32_t *toks) {
  return memcmp(s->toks + (size_t)i * s->bs, toks, (size_t)s->bs * sizeof *toks) == 0;
}

// The entry for the block toks (bs) under parent entry `parent` (-1: first block), or -1. *collide is set
// when a live entry has the key but is a different block.
static int lookup(const kv_prefix *s, int parent, const int32_t *toks, uint64_t *key_out, int *collide) {
  uint64_t pk = parent >= 0 ? s->ents[parent].key : KV_BLOCKHASH_ROOT;
  uint64_t key = s->hash(pk, toks, s->bs);
  if (key_out) *key_out = key;
  if (collide) *collide = 0;
  for (int i = s->buckets[pf_bucket(s, key)]; i >= 0; i = s->ents[i].hnext) {
    if (s->ents[i].key != key) continue;
    if (s->ents[i].parent == parent && tok_eq(s, i, toks)) return i;
    if (collide) *collide = 1;
  }
  return -1;
}

static void bucket_unlink(kv_prefix *s, int i) {
  int32_t *pp = &s->buckets[pf_bucket(s, s->ents[i].key)];
  while (*pp >= 0 && *pp != i) pp = &s->ents[*pp].hnext;
  if (*pp == i) *pp = s->ents[i].hnext;
}

static int new_ent(kv_prefix *s) {
  int i;
  if (s->free_ent >= 0) {
    i = s->free_ent;
    s->free_ent = s->ents[i].hnext;
  } else {
    if (s->n_used == s->cap_ents) {
      if (s->cap_ents > INT32_MAX / 4) return -1;
      int cap = s->cap_ents * 2;
      pf_ent *ne = realloc(s->ents, (size_t)cap * sizeof *ne);
      if (!ne) return -1;
      s->ents = ne;
      int32_t *nt = realloc(s->toks, (size_t)cap * s->bs * sizeof *nt);
      if (!nt) return -1;
      s->toks = nt;
      s->cap_ents = cap;
    }
    i = s->n_used++;
  }
  memset(&s->ents[i], 0, sizeof s->ents[i]);
  s->ents[i].prev = s->ents[i].next = -1;
  s->ents[i].block = s->ents[i].slot = -1;
  return i;
}

// Drops live entry i, which must have no children, from every tier.
static void drop(kv_prefix *s, int i) {
  pf_ent *e = &s->ents[i];
  if (e->tier == 0) kv_pool_unref(s->pool, e->block);
  else s->free_slot[e->tier][s->n_free_slot[e->tier]++] = e->slot;
  lru_unlink(s, i);
  if (e->parent >= 0) s->ents[e->parent].nch[e->tier]--;
  bucket_unlink(s, i);
  pf_event(s, KV_EVENT_REMOVED, e->key);
  e->tier = -1;
  e->hnext = s->free_ent;
  s->free_ent = i;
  s->st.removed++;
}

// The next entry of tier t that may leave it, scanning from entry `from` toward the most recent (-1: from
// the LRU end): no child in tier <= t, not pinned, and in tier 0 unused (only the store holds it).
static int candidate(const kv_prefix *s, int t, int from) {
  for (int i = from >= 0 ? from : s->tier[t].tail; i >= 0; i = s->ents[i].prev) {
    const pf_ent *e = &s->ents[i];
    int kids = 0;
    for (int k = 0; k <= t; k++) kids += e->nch[k];
    if (kids || e->pinned) continue;
    if (t == 0 && kv_pool_refcount(s->pool, e->block) != 1) continue;
    return i;
  }
  return -1;
}

static int disk_io(kv_prefix *s, int slot, void *buf, int write) {
  off_t off = (off_t)slot * (off_t)s->bbytes;
  size_t done = 0;
  while (done < s->bbytes) {
    ssize_t r = write ? pwrite(s->fd, (char *)buf + done, s->bbytes - done, off + (off_t)done)
                      : pread(s->fd, (char *)buf + done, s->bbytes - done, off + (off_t)done);
    if (r < 0 && errno == EINTR) continue;
    if (r == 0) errno = write ? ENOSPC : EIO; // nothing written (or read) and no error said why
    if (r <= 0) return -1;
    done += (size_t)r;
  }
  return 0;
}

static int make_room(kv_prefix *s, int t);

static const char *const TIER_NAMES[NT] = {"pool", "host", "disk"};

// Tier t could not store a block (why: its reason): counted, and logged the first time only, since a full disk would
// otherwise say so on every eviction.
static void refused(kv_prefix *s, int t, const char *why) {
  s->st.refused[t]++;
  if (s->warned[t]) return;
  s->warned[t] = 1;
  utl_warn(s->log_name, "prefix cache: the %s tier%s%s refused a block (%s): blocks it cannot take go to the next tier "
           "or leave the cache; counted in dserve:prefix_cache_tier_refused_total, logged once", TIER_NAMES[t],
           t == 2 ? " " : "", t == 2 ? s->path : "", why);
}

// Copies candidate i's bytes into a free slot of tier nt (1 or 2) and moves it there. 0 ok, -1 (nothing
// changed) on no room or an I/O error.
static int move_down(kv_prefix *s, int i, int nt) {
  pf_ent *e = &s->ents[i];
  int t = e->tier;
  if (make_room(s, nt) != 0) {
    refused(s, nt, "full, and every block in it is the parent of one in a tier above");
    return -1;
  }
  int slot = s->free_slot[nt][--s->n_free_slot[nt]];
  unsigned char *dst = nt == 1 ? s->arena + (size_t)slot * s->bbytes : s->scratch;
  int rc = 0;
  if (t == 0) rc = kv_pool_read_block(s->pool, e->block, dst);
  else memcpy(dst, s->arena + (size_t)e->slot * s->bbytes, s->bbytes); // t == 1, nt == 2
  if (rc == 0 && nt == 2 && (rc = disk_io(s, slot, s->scratch, 1)) != 0) {
    char why[160];
    snprintf(why, sizeof why, "write failed: %s", strerror(errno));
    refused(s, nt, why);
  }
  if (rc != 0) {
    s->free_slot[nt][s->n_free_slot[nt]++] = slot;
    return -1;
  }
  if (t == 0) kv_pool_unref(s->pool, e->block);
  else s->free_slot[t][s->n_free_slot[t]++] = e->slot;
  e->block = -1;
  e->slot = slot;
  set_tier(s, i, nt);
  s->st.demoted++;
  return 0;
}

// Candidate i leaves its tier: into the first lower configured tier that takes it, else dropped when it
// has no children. 0 when it left, -1 when it stayed (its children live in lower tiers that are full).
static int demote(kv_prefix *s, int i) {
  for (int nt = s->ents[i].tier + 1; nt < NT; nt++)
    if (s->slots[nt] > 0 && move_down(s, i, nt) == 0) return 0;
  const pf_ent *e = &s->ents[i];
  if (e->nch[0] + e->nch[1] + e->nch[2] != 0) return -1;
  drop(s, i);
  return 0;
}

// Moves one candidate of tier t out (LRU first, skipping those that cannot go). 1 when one left.
static int evict_one(kv_prefix *s, int t) {
  for (int c = candidate(s, t, -1); c >= 0;) {
    int prev = s->ents[c].prev;
    if (demote(s, c) == 0) return 1;
    c = prev >= 0 ? candidate(s, t, prev) : -1;
  }
  return 0;
}

// Frees one slot in tier t (1 or 2) if none is free. 0 when a slot is free after.
static int make_room(kv_prefix *s, int t) {
  while (s->n_free_slot[t] == 0)
    if (!evict_one(s, t)) return -1;
  return 0;
}

// Evicts one unused tier-0 entry; 1 when its pool block was given back.
static int evict0(kv_prefix *s) { return evict_one(s, 0); }

static void trim(kv_prefix *s) {
  while (s->tier[0].n > s->budget && evict0(s)) {
  }
}

// Touches the chain ending at entry i, leaf first, so every parent is more recent than its children.
static void touch_chain(kv_prefix *s, int i) {
  for (; i >= 0; i = s->ents[i].parent) lru_touch(s, i);
}

// ---- public

int kv_prefix_new(kv_pool *pool, const kv_prefix_opts *o, kv_prefix **out, char *err, size_t errlen) {
  *out = NULL;
  if (!pool || !o) {
    snprintf(err, errlen, "prefix: missing pool or options");
    return -1;
  }
  if (o->budget_blocks < 1) {
    snprintf(err, errlen, "prefix: budget of %d blocks (needs >= 1)", o->budget_blocks);
    return -1;
  }
  if (o->host_blocks < 0 || o->disk_blocks < 0 || o->max_events < 0) {
    snprintf(err, errlen, "prefix: negative host_blocks, disk_blocks or max_events");
    return -1;
  }
  if (o->budget_blocks > (1 << 26) || o->host_blocks > (1 << 26) || o->disk_blocks > (1 << 26)) {
    snprintf(err, errlen, "prefix: block counts above %d", 1 << 26);
    return -1;
  }
  if (o->disk_blocks > 0 && (!o->disk_path || !*o->disk_path)) {
    snprintf(err, errlen, "prefix: disk_blocks %d without a disk_path", o->disk_blocks);
    return -1;
  }
  kv_prefix *s = calloc(1, sizeof *s);
  if (!s) goto oom;
  s->fd = -1;
  s->pool = pool;
  s->hash = o->hash ? o->hash : kv_blockhash;
  s->bs = kv_pool_kv(pool)->block_size;
  s->budget = o->budget_blocks;
  s->bbytes = kv_pool_block_bytes(pool);
  s->max_ev = o->max_events ? o->max_events : 4096;
  s->slots[1] = o->host_blocks;
  s->slots[2] = o->disk_blocks;
  snprintf(s->log_name, sizeof s->log_name, "%s", o->log_name ? o->log_name : "prefix");
  for (int t = 0; t < NT; t++) s->tier[t] = (pf_tier){-1, -1, 0};
  s->free_ent = -1;
  s->cap_ents = 64;
  s->ents = malloc((size_t)s->cap_ents * sizeof *s->ents);
  s->toks = malloc((size_t)s->cap_ents * s->bs * sizeof *s->toks);
  size_t want = 2 * ((size_t)o->budget_blocks + o->host_blocks + o->disk_blocks), nb = 64;
  while (nb < want) nb *= 2;
  s->bmask = nb - 1;
  s->buckets = malloc(nb * sizeof *s->buckets);
  s->ev = malloc((size_t)s->max_ev * sizeof *s->ev);
  if (!s->ents || !s->toks || !s->buckets || !s->ev) goto oom;
  for (size_t i = 0; i < nb; i++) s->buckets[i] = -1;
  for (int t = 1; t < NT; t++) {
    if (!s->slots[t]) continue;
    s->free_slot[t] = malloc((size_t)s->slots[t] * sizeof(int32_t));
    if (!s->free_slot[t]) goto oom;
    for (int k = 0; k < s->slots[t]; k++) s->free_slot[t][k] = s->slots[t] - 1 - k;
    s->n_free_slot[t] = s->slots[t];
  }
  if (s->slots[1]) {
    s->arena = malloc((size_t)s->slots[1] * s->bbytes);
    if (!s->arena) {
      snprintf(err, errlen, "prefix: cannot allocate %zu bytes of host tier", (size_t)s->slots[1] * s->bbytes);
      kv_prefix_free(s);
      return -1;
    }
  }
  if (s->slots[2]) {
    s->scratch = malloc(s->bbytes);
    s->path = strdup(o->disk_path);
    if (!s->scratch || !s->path) goto oom;
    s->fd = open(o->disk_path, O_RDWR | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
    if (s->fd < 0 || ftruncate(s->fd, (off_t)s->slots[2] * (off_t)s->bbytes) != 0) {
      snprintf(err, errlen, "prefix: disk tier %s: %s", o->disk_path, strerror(errno));
      if (s->fd < 0) {
        free(s->path); // not ours to remove
        s->path = NULL;
      }
      kv_prefix_free(s);
      return -1;
    }
  }
  *out = s;
  return 0;
oom:
  snprintf(err, errlen, "prefix: out of memory");
  kv_prefix_free(s);
  return -1;
}

void kv_prefix_free(kv_prefix *s) {
  if (!s) return;
  if (s->ents && s->buckets) {
    for (int i = 0; i < s->n_used; i++)
      if (s->ents[i].tier == 0) kv_pool_unref(s->pool, s->ents[i].block);
  }
  if (s->fd >= 0) close(s->fd);
  if (s->path) unlink(s->path);
  free(s->path);
  free(s->scratch);
  free(s->arena);
  for (int t = 0; t < NT; t++) free(s->free_slot[t]);
  free(s->ev);
  free(s->buckets);
  free(s->toks);
  free(s->ents);
  free(s);
}

int kv_prefix_block_size(const kv_prefix *s) { return s->bs; }

static int match_limit(const kv_prefix *s, int n_toks, int max_blocks) {
  int lim = n_toks > 0 ? (n_toks - 1) / s->bs : 0;
  return lim < max_blocks ? lim : max_blocks;
}

int kv_prefix_match(kv_prefix *s, const int32_t *toks, int n_toks, int32_t *block_ids_out, int max_blocks) {
  s->st.queries++;
  if (!toks || n_toks < 1) return 0;
  int lim = match_limit(s, n_toks, max_blocks);
  if (lim > 0 && !block_ids_out) return 0;
  s->st.query_tokens += (uint64_t)n_toks;
  s->st.query_blocks += (uint64_t)((n_toks - 1) / s->bs);
  int parent = -1, n = 0;
  while (n < lim) {
    int e = lookup(s, parent, toks + (size_t)n * s->bs, NULL, NULL);
    if (e < 0 || s->ents[e].tier != 0) break;
    block_ids_out[n++] = s->ents[e].block;
    parent = e;
  }
  // A sliding-window model's blocks may have given back their window pages: the match ends where its window would
  // read one (kv/pool.h). What follows is then computed again, so it is not counted as a hit.
  for (int usable = kv_pool_usable_prefix(s->pool, block_ids_out, n); n > usable; n--) parent = s->ents[parent].parent;
  // The same walk goes on through the lower tiers: the tokens they are asked for are the ones not found before.
  int found[NT] = {n, 0, 0};
  for (int i = n, pe = parent; i < lim; i++) {
    int e = lookup(s, pe, toks + (size_t)i * s->bs, NULL, NULL);
    if (e < 0) break;
    found[s->ents[e].tier]++;
    pe = e;
  }
  uint64_t seen = 0;
  for (int t = 0; t < NT; t++) {
    if (t == 0 || s->slots[t] > 0) s->st.tier_query_tokens[t] += (uint64_t)n_toks - seen;
    seen += (uint64_t)found[t] * (uint64_t)s->bs;
  }
  if (n == 0) return 0;
  touch_chain(s, parent);
  for (int i = 0; i < n; i++) kv_pool_ref(s->pool, block_ids_out[i]);
  s->st.hit_queries++;
  s->st.hit_blocks[0] += (uint64_t)n;
  s->st.hit_tokens[0] += (uint64_t)n * (uint64_t)s->bs;
  return n;
}

int kv_prefix_peek(const kv_prefix *s, const int32_t *toks, int n_toks, int n_have, int counts[3]) {
  int c[NT] = {0, 0, 0};
  int lim = toks ? match_limit(s, n_toks, INT32_MAX) : 0, parent = -1, total = 0;
  for (int i = 0; i < lim; i++) {
    int e = lookup(s, parent, toks + (size_t)i * s->bs, NULL, NULL);
    if (e < 0) break;
    if (i >= n_have) {
      c[s->ents[e].tier]++;
      total++;
    }
    parent = e;
  }
  if (counts)
    for (int t = 0; t < NT; t++) counts[t] = c[t];
  return total;
}

int kv_prefix_restore(kv_prefix *s, const int32_t *toks, int n_toks, int n_have, int32_t *block_ids_out,
                       int max_blocks, char *err, size_t errlen) {
  if (!toks || n_have < 0 || max_blocks < 1 || !block_ids_out) return 0;
  int lim = match_limit(s, n_toks, INT32_MAX), parent = -1, i = 0, n = 0, rc = 0;
  for (; i < n_have && i < lim; i++) {
    int e = lookup(s, parent, toks + (size_t)i * s->bs, NULL, NULL);
    if (e < 0 || s->ents[e].tier != 0) return 0; // not what match returned
    parent = e;
  }
  for (; i < lim && n < max_blocks; i++) {
    int e = lookup(s, parent, toks + (size_t)i * s->bs, NULL, NULL);
    if (e < 0) break;
    pf_ent *en = &s->ents[e];
    int t = en->tier;
    if (t != 0) {
      en->pinned = 1;
      int32_t b = -1;
      while (kv_pool_alloc(s->pool, &b, 1) != 0)
        if (!evict0(s)) break;
      en = &s->ents[e]; // eviction does not move entries, but keep the pointer honest
      if (b < 0) {
        en->pinned = 0;
        break;
      }
      const unsigned char *src = s->arena ? s->arena + (size_t)en->slot * s->bbytes : NULL;
      if (t == 2) {
        if (disk_io(s, en->slot, s->scratch, 0) != 0) {
          snprintf(err, errlen, "prefix: cannot read block from disk tier %s", s->path);
          kv_pool_unref(s->pool, b);
          en->pinned = 0;
          if (en->nch[0] + en->nch[1] + en->nch[2] == 0) drop(s, e);
          rc = -1;
          break;
        }
        src = s->scratch;
      }
      if (kv_pool_write_block(s->pool, b, src) != 0) { // a block fresh from kv_pool_alloc is whole: a pool bug
        snprintf(err, errlen, "prefix: cannot write a restored block into pool block %d", (int)b);
        kv_pool_unref(s->pool, b);
        en->pinned = 0;
        rc = -1;
        break;
      }
      s->free_slot[t][s->n_free_slot[t]++] = en->slot;
      en->slot = -1;
      en->block = b; // the store's reference
      en->pinned = 0;
      set_tier(s, e, 0);
    }
    kv_pool_ref(s->pool, en->block); // the caller's
    block_ids_out[n++] = en->block;
    s->st.hit_blocks[t]++;
    s->st.hit_tokens[t] += (uint64_t)s->bs;
    parent = e;
  }
  if (n > 0) {
    touch_chain(s, parent);
    if (n_have == 0) s->st.hit_queries++;
    trim(s);
  }
  return rc < 0 && n == 0 ? -1 : n; // blocks restored before a failed one are the caller's (each holds a reference)
}

// 1 when an entry cached in pool block ours should take the caller's copy theirs of the same block instead: theirs
// still has the window pages ours lost, or nobody but the store uses ours. The latter frees ours at once; kept, it
// would be the parent of the caller's next blocks once they enter the store, and a parent is never evicted before its
// children: a copy nobody uses would stay while the caller runs, and a sequence that needs the whole pool would wait
// for it forever.
static int swap_copy(const kv_prefix *s, int32_t ours, int32_t theirs) {
  int ours_whole = kv_pool_whole(s->pool, ours), theirs_whole = kv_pool_whole(s->pool, theirs);
  return theirs_whole && (!ours_whole || kv_pool_refcount(s->pool, ours) == 1);
}

int kv_prefix_insert(kv_prefix *s, const int32_t *toks, int n_toks, const int32_t *block_ids, int n_blocks) {
  if (!toks || !block_ids || n_toks < s->bs || n_blocks < 1) return 0;
  int n = n_toks / s->bs;
  if (n > n_blocks) n = n_blocks;
  int parent = -1, added = 0, rc = 0;
  for (int i = 0; i < n; i++) {
    const int32_t *bt = toks + (size_t)i * s->bs;
    uint64_t key;
    int collide;
    int e = lookup(s, parent, bt, &key, &collide);
    if (kv_pool_refcount(s->pool, block_ids[i]) < 1) break; // not a block the caller holds
    if (e < 0 && collide) {
      s->st.collisions++;
      break;
    }
    if (e < 0) {
      e = new_ent(s);
      if (e < 0) {
        rc = -1;
        break;
      }
      pf_ent *en = &s->ents[e];
      en->key = key;
      en->parent = parent;
      en->block = block_ids[i];
      en->tier = 0;
      memcpy(s->toks + (size_t)e * s->bs, bt, (size_t)s->bs * sizeof *bt);
      uint64_t bk = pf_bucket(s, key);
      en->hnext = s->buckets[bk];
      s->buckets[bk] = e;
      lru_front(s, e);
      if (parent >= 0) s->ents[parent].nch[0]++;
      kv_pool_ref(s->pool, block_ids[i]);
      pf_event(s, KV_EVENT_ADDED, key);
      s->st.inserted++;
      added++;
    } else if (s->ents[e].tier != 0) {
      pf_ent *en = &s->ents[e];
      s->free_slot[en->tier][s->n_free_slot[en->tier]++] = en->slot;
      en->slot = -1;
      en->block = block_ids[i];
      kv_pool_ref(s->pool, block_ids[i]);
      set_tier(s, e, 0);
    } else if (s->ents[e].block != block_ids[i] && swap_copy(s, s->ents[e].block, block_ids[i])) {
      kv_pool_unref(s->pool, s->ents[e].block);
      s->ents[e].block = block_ids[i];
      kv_pool_ref(s->pool, block_ids[i]);
    }
    parent = e;
  }
  if (parent >= 0) touch_chain(s, parent);
  trim(s);
  return rc < 0 ? -1 : added;
}

int kv_prefix_evict_for(kv_prefix *s, int n_free_needed) {
  int before = kv_pool_free_blocks(s->pool);
  while (kv_pool_free_blocks(s->pool) < n_free_needed && evict0(s)) {
  }
  int got = kv_pool_free_blocks(s->pool) - before;
  return got > 0 ? got : 0;
}

void kv_prefix_clear(kv_prefix *s) {
  if (!s) return;
  // Leaf first: repeatedly drop childless entries from the tails (each pass drops at least every leaf).
  s->quiet = 1;
  int left = s->tier[0].n + s->tier[1].n + s->tier[2].n;
  while (left > 0) {
    for (int t = NT - 1; t >= 0; t--) {
      for (int i = s->tier[t].tail; i >= 0;) {
        int prev = s->ents[i].prev;
        const pf_ent *e = &s->ents[i];
        if (e->nch[0] + e->nch[1] + e->nch[2] == 0) drop(s, i);
        i = prev;
      }
    }
    left = s->tier[0].n + s->tier[1].n + s->tier[2].n;
  }
  s->quiet = 0;
  s->n_ev = 0; // superseded by CLEARED
  pf_event(s, KV_EVENT_CLEARED, 0);
}

int kv_prefix_drain_events(kv_prefix *s, kv_event *out, int max) {
  if (!out || max < 1 || s->n_ev == 0) return 0;
  int n = s->n_ev < max ? s->n_ev : max;
  memcpy(out, s->ev, (size_t)n * sizeof *out);
  memmove(s->ev, s->ev + n, (size_t)(s->n_ev - n) * sizeof *s->ev);
  s->n_ev -= n;
  return n;
}

int kv_prefix_pending_events(const kv_prefix *s) { return s->n_ev; }

void kv_prefix_get_stats(const kv_prefix *s, kv_prefix_stats *out) {
  *out = s->st;
  for (int t = 0; t < NT; t++) out->blocks[t] = s->tier[t].n;
  out->unused = 0; // counted when asked (once a second, from stats), not kept on every ref and unref
  for (int i = s->tier[0].head; i >= 0; i = s->ents[i].next)
    out->unused += kv_pool_refcount(s->pool, s->ents[i].block) == 1;
}

int kv_prefix_has_tier(const kv_prefix *s, int tier) {
  return tier == 0 || (tier > 0 && tier < NT && s->slots[tier] > 0);
}

int kv_prefix_keys(const kv_prefix *s, uint64_t *keys_out, int max) {
  int total = 0;
  for (int t = NT - 1; t >= 0; t--)
    for (int i = s->tier[t].tail; i >= 0; i = s->ents[i].prev, total++)
      if (total < max && keys_out) keys_out[total] = s->ents[i].key;
  return total;
}
