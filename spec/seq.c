// spec/seq.c: the drafts' config (defaults, checks) and each sequence's draft length from its recent acceptance.
#include "spec/spec.h"

#include <math.h>

void spc_cfg_default(spc_cfg *c) {
  c->k_max = SPC_DEF_K_MAX;
  c->index_bytes = SPC_DEF_INDEX_BYTES;
  c->ngram_min = SPC_DEF_NGRAM_MIN;
  c->ngram_max = SPC_DEF_NGRAM_MAX;
}

int spc_cfg_check(const spc_cfg *c, char *err, size_t errlen) {
  if (c->k_max < 1 || c->k_max > SPC_K_LIMIT) {
    utl_seterr(err, errlen, "spec k_max %d: must be 1..%d", c->k_max, SPC_K_LIMIT);
    return -1;
  }
  if (c->ngram_max < 1 || c->ngram_max > SPC_NGRAM_LIMIT) {
    utl_seterr(err, errlen, "spec ngram_max %d: must be 1..%d", c->ngram_max, SPC_NGRAM_LIMIT);
    return -1;
  }
  if (c->ngram_min < 1 || c->ngram_min > c->ngram_max) {
    utl_seterr(err, errlen, "spec ngram_min %d: must be 1..ngram_max (%d)", c->ngram_min, c->ngram_max);
    return -1;
  }
  if (c->index_bytes != 0 && c->index_bytes < SPC_INDEX_MIN_BYTES) {
    utl_seterr(err, errlen, "spec index_bytes %zu: must be 0 (no suffix index) or at least %zu", c->index_bytes,
               (size_t)SPC_INDEX_MIN_BYTES);
    return -1;
  }
  return 0;
}

void spc_seq_init(spc_seq *s, const spc_cfg *c) {
  *s = (spc_seq){0};
  s->k_max = c->k_max < 1 ? 1 : c->k_max;
  s->k = s->k_max < 4 ? s->k_max : 4; // a middling start: doubling reaches k_max in a step or two when drafts hold
  s->interval = SPC_PROBE_MIN_STEPS;
}

int spc_want(const spc_seq *s, int k_cap) {
  if (k_cap <= 0)
    return 0;
  int k = s->k;
  if (k == 0 && s->quiet >= s->interval)
    k = SPC_PROBE_K;
  return k < k_cap ? k : k_cap;
}

void spc_seq_update(spc_seq *s, int drafted, int accepted) {
  if (drafted <= 0) {
    if (s->k == 0 && s->quiet < SPC_PROBE_MAX_STEPS)
      s->quiet++;
    return;
  }
  accepted = accepted < 0 ? 0 : accepted > drafted ? drafted : accepted;
  s->drafts++;
  s->drafted += drafted;
  s->accepted += accepted;
  s->acc_ewma += ((float)accepted - s->acc_ewma) * 0.25f;
  if (s->k == 0) { // a probe
    s->quiet = 0;
    if (accepted == 0) {
      s->interval = s->interval * 2 > SPC_PROBE_MAX_STEPS ? SPC_PROBE_MAX_STEPS : s->interval * 2;
      return;
    }
    s->interval = SPC_PROBE_MIN_STEPS;
    s->fails = 0;
  }
  if (accepted == 0 && ++s->fails >= SPC_OFF_AFTER) {
    s->k = 0; // off: wait `interval` steps, then probe
    s->quiet = 0;
    return;
  }
  if (accepted > 0)
    s->fails = 0;
  int k;
  if (accepted == drafted)
    k = drafted * 2; // the whole draft held: the next may be longer
  else
    k = (int)ceilf(s->acc_ewma) + 1; // about what recent drafts kept, plus the one that might hold
  s->k = k < 1 ? 1 : k > s->k_max ? s->k_max : k;
}
