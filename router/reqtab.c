// router/reqtab.c: the router's requests by id (reqtab.h): FNV-1a, linear probing, backward-shift deletion.
#include "router/reqtab.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

static uint64_t hash(const char *k, size_t n) {
  uint64_t h = 1469598103934665603ULL;
  for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)k[i]) * 1099511628211ULL;
  return h;
}

static int same(const char *a, const char *k, size_t n) { return !strncmp(a, k, n) && a[n] == 0; }

// Places key in slots (cap, a power of two, with room); no check for a duplicate.
static void place(rtr_reqtab_slot *slots, size_t cap, const char *key, void *val) {
  size_t i = (size_t)hash(key, strlen(key)) & (cap - 1);
  while (slots[i].key) i = (i + 1) & (cap - 1);
  slots[i] = (rtr_reqtab_slot){key, val};
}

int rtr_reqtab_put(rtr_reqtab *t, const char *key, void *val) {
  if ((t->n + 1) * 4 > t->cap * 3) {
    size_t cap = t->cap ? t->cap * 2 : 64;
    rtr_reqtab_slot *ns = calloc(cap, sizeof *ns);
    if (!ns) return -1;
    for (size_t i = 0; i < t->cap; i++)
      if (t->slots[i].key) place(ns, cap, t->slots[i].key, t->slots[i].val);
    free(t->slots);
    t->slots = ns;
    t->cap = cap;
  }
  place(t->slots, t->cap, key, val);
  t->n++;
  return 0;
}

void *rtr_reqtab_get(const rtr_reqtab *t, const char *key, size_t len) {
  if (!t->n) return NULL;
  for (size_t i = (size_t)hash(key, len) & (t->cap - 1); t->slots[i].key; i = (i + 1) & (t->cap - 1))
    if (same(t->slots[i].key, key, len)) return t->slots[i].val;
  return NULL;
}

void rtr_reqtab_del(rtr_reqtab *t, const char *key) {
  if (!t->n) return;
  size_t mask = t->cap - 1, i = (size_t)hash(key, strlen(key)) & mask;
  while (t->slots[i].key && strcmp(t->slots[i].key, key)) i = (i + 1) & mask;
  if (!t->slots[i].key) return;
  // backward shift: each later entry of the run whose home is not between the hole and itself moves into the hole
  for (size_t j = (i + 1) & mask; t->slots[j].key; j = (j + 1) & mask) {
    size_t home = (size_t)hash(t->slots[j].key, strlen(t->slots[j].key)) & mask;
    if (((j - home) & mask) >= ((j - i) & mask)) {
      t->slots[i] = t->slots[j];
      i = j;
    }
  }
  t->slots[i] = (rtr_reqtab_slot){NULL, NULL};
  t->n--;
}

void rtr_reqtab_free(rtr_reqtab *t) {
  free(t->slots);
  *t = (rtr_reqtab){0};
}

// Reads "-<digits>" ending at end (exclusive) backwards: the position of its '-' or NULL.
static const char *dash_number(const char *start, const char *end, long *v) {
  const char *p = end;
  while (p > start && p[-1] >= '0' && p[-1] <= '9') p--;
  if (p == end || p == start || p[-1] != '-' || end - p > 9) return NULL;
  *v = strtol(p, NULL, 10);
  return p - 1;
}

size_t rtr_choice_id_split(const char *id, int *index) {
  const char *end = id + strlen(id), *p;
  long v;
  // a moved choice: "-r<k>" after the index
  const char *q = end;
  while (q > id && q[-1] >= '0' && q[-1] <= '9') q--;
  if (q < end && q - id >= 2 && q[-1] == 'r' && q[-2] == '-') end = q - 2;
  if (!(p = dash_number(id, end, &v)) || p == id) return 0;
  *index = (int)v;
  return (size_t)(p - id);
}
