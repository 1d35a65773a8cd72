// models/sampler.c: grammar mask, penalties, logit bias, temperature, top-k / top-p / min-p, seeded sampling and
// logprobs.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/sampler.h"

struct mdl_sampler {
  mdl_sampling p;     // p.bias points at bias below
  mdl_bias *bias;     // (owned) (p.n_bias)
  int n_vocab;
  int32_t *count;     // (n_vocab) times each token was generated
  uint8_t *seen;      // (n_vocab) 1 when the token is in the prompt or was generated
  uint64_t key;       // the seed, mixed: a position's draw is mix(key, pos) (rng_at)
  int64_t pos;        // output tokens sampled or accepted so far: the position of the next draw
  float *work;        // (n_vocab) adjusted logits
  int32_t *idx;       // (n_vocab) candidate ids
  mdl_grammar_matcher *gm; // (owned) the request's place in p.grammar; NULL without one
  uint32_t *gmask;    // ((n_vocab + 31) / 32) the tokens the grammar allows this step
};

static int allowed(const mdl_sampler *s, int32_t t) { return !s->gm || (s->gmask[t >> 5] >> (t & 31) & 1); }

static uint64_t splitmix64(uint64_t *x) {
  uint64_t z = (*x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// The uniform draw of output position pos, in [0, 1): a counter-based generator (splitmix64's finalizer over the
// mixed seed and the position), so a position's draw depends only on (seed, position) -- the router folds the
// choice index into the seed -- and never on how many tokens a step produced: speculative decoding, which samples
// several positions in one step, draws what one-token steps draw (docs/design.md, "Speculative decoding").
static double rng_at(uint64_t key, int64_t pos) {
  uint64_t x = key ^ ((uint64_t)pos * 0xd1b54a32d192ed03ull);
  return (double)(splitmix64(&x) >> 11) * 0x1.0p-53;
}

int mdl_sampler_new(const mdl_sampling *s, int n_vocab, const int32_t *prompt, int n_prompt, mdl_sampler **out,
                    char *err, size_t errlen) {
  *out = NULL;
  if (n_vocab < 1) {
    snprintf(err, errlen, "sampler: vocabulary size %d", n_vocab);
    return -1;
  }
  if (!(s->temperature >= 0) || !isfinite(s->temperature)) {
    snprintf(err, errlen, "sampler: temperature %g must be >= 0", s->temperature);
    return -1;
  }
  if (s->top_k < 0) {
    snprintf(err, errlen, "sampler: top_k %d must be >= 0", s->top_k);
    return -1;
  }
  if (!(s->top_p > 0 && s->top_p <= 1)) {
    snprintf(err, errlen, "sampler: top_p %g must be in (0, 1]", s->top_p);
    return -1;
  }
  if (!(s->min_p >= 0 && s->min_p <= 1)) {
    snprintf(err, errlen, "sampler: min_p %g must be in [0, 1]", s->min_p);
    return -1;
  }
  if (!(s->presence_penalty >= -2 && s->presence_penalty <= 2) ||
      !(s->frequency_penalty >= -2 && s->frequency_penalty <= 2)) {
    snprintf(err, errlen, "sampler: presence/frequency penalties must be in [-2, 2]");
    return -1;
  }
  if (!(s->repetition_penalty > 0) || !isfinite(s->repetition_penalty)) {
    snprintf(err, errlen, "sampler: repetition_penalty %g must be > 0", s->repetition_penalty);
    return -1;
  }
  if (s->n_logprobs < 0 || s->n_logprobs > 20) {
    snprintf(err, errlen, "sampler: n_logprobs %d must be in 0..20", s->n_logprobs);
    return -1;
  }
  if (s->n_bias < 0 || (s->n_bias > 0 && !s->bias)) {
    snprintf(err, errlen, "sampler: bad logit bias list");
    return -1;
  }
  for (int i = 0; i < s->n_bias; i++) {
    if (s->bias[i].token < 0 || s->bias[i].token >= n_vocab) {
      snprintf(err, errlen, "sampler: logit bias for token %d outside the vocabulary (0..%d)", (int)s->bias[i].token,
               n_vocab - 1);
      return -1;
    }
    if (isnan(s->bias[i].bias)) {
      snprintf(err, errlen, "sampler: logit bias for token %d is NaN", (int)s->bias[i].token);
      return -1;
    }
  }
  if (s->grammar && (!s->grammar_vocab || mdl_grammar_vocab_n(s->grammar_vocab) != n_vocab)) {
    snprintf(err, errlen, "sampler: a grammar needs the vocabulary's token trie (%d tokens)", n_vocab);
    return -1;
  }
  mdl_sampler *m = calloc(1, sizeof *m);
  if (!m) goto oom;
  m->p = *s;
  m->n_vocab = n_vocab;
  m->count = calloc((size_t)n_vocab, sizeof *m->count);
  m->seen = calloc((size_t)n_vocab, 1);
  m->work = malloc((size_t)n_vocab * sizeof *m->work);
  m->idx = malloc((size_t)n_vocab * sizeof *m->idx);
  if (s->n_bias > 0) {
    m->bias = malloc((size_t)s->n_bias * sizeof *m->bias);
    if (m->bias) memcpy(m->bias, s->bias, (size_t)s->n_bias * sizeof *m->bias);
  }
  m->p.bias = m->bias;
  if (!m->count || !m->seen || !m->work || !m->idx || (s->n_bias > 0 && !m->bias)) goto oom;
  if (s->grammar) {
    m->gmask = malloc(((size_t)n_vocab + 31) / 32 * sizeof *m->gmask);
    if (!m->gmask || mdl_grammar_matcher_new(s->grammar, s->grammar_vocab, &m->gm, err, errlen)) goto oom;
  }
  for (int i = 0; i < n_prompt; i++)
    if (prompt[i] >= 0 && prompt[i] < n_vocab) m->seen[prompt[i]] = 1;
  uint64_t x = s->seed;
  m->key = splitmix64(&x);
  *out = m;
  return 0;
oom:
  mdl_sampler_free(m);
  snprintf(err, errlen, "sampler: out of memory");
  return -1;
}

void mdl_sampler_free(mdl_sampler *s) {
  if (!s) return;
  free(s->bias);
  free(s->count);
  free(s->seen);
  free(s->work);
  free(s->idx);
  mdl_grammar_matcher_free(s->gm);
  free(s->gmask);
  free(s);
}

// a ranks before b: larger value, ties to the lower id.
static int before(const float *v, int32_t a, int32_t b) { return v[a] > v[b] || (v[a] == v[b] && a < b); }

// Moves the k best of idx[0, n) (by before()) into idx[0, k), in no particular order. Deterministic.
static void select_top(int32_t *idx, int n, int k, const float *v) {
  int lo = 0, hi = n - 1;
  while (lo < hi) {
    int mid = lo + (hi - lo) / 2;
    // median of three as the pivot
    int32_t a = idx[lo], b = idx[mid], c = idx[hi], piv;
    if (before(v, a, b)) piv = before(v, b, c) ? b : (before(v, a, c) ? c : a);
    else piv = before(v, a, c) ? a : (before(v, b, c) ? c : b);
    int i = lo, j = hi;
    while (i <= j) {
      while (before(v, idx[i], piv)) i++;
      while (before(v, piv, idx[j])) j--;
      if (i <= j) {
        int32_t t = idx[i];
        idx[i] = idx[j];
        idx[j] = t;
        i++;
        j--;
      }
    }
    if (k - 1 <= j) hi = j;
    else if (k - 1 >= i) lo = i;
    else break;
  }
}

static void sort_desc(int32_t *idx, int n, const float *v) { // insertion sort for small n, else heap-free merge
  if (n < 2) return;
  if (n <= 64) {
    for (int i = 1; i < n; i++) {
      int32_t x = idx[i];
      int j = i - 1;
      while (j >= 0 && before(v, x, idx[j])) {
        idx[j + 1] = idx[j];
        j--;
      }
      idx[j + 1] = x;
    }
    return;
  }
  // quicksort by recursive selection of the middle
  int h = n / 2;
  select_top(idx, n, h, v);
  sort_desc(idx, h, v);
  sort_desc(idx + h, n - h, v);
}

// Most of the time only the best few tokens survive the filters (greedy, top_k, min_p): checking candidates from
// the most likely down until that set is known (the k best allowed ones; those within min_p of the best allowed one)
// gives the same choice as the full mask, for a few dozen checks instead of a walk of the vocabulary. bits gets
// those candidates; 0 when the full mask is needed (no such filter, or too many candidates refused).
#define LAZY_MAX 1024
static int lazy_mask(mdl_sampler *s, const float *w) {
  const mdl_sampling *p = &s->p;
  int V = s->n_vocab, greedy = p->temperature <= 0 || p->top_k == 1;
  if (!greedy && p->top_k <= 0 && p->min_p <= 0) return 0;
  int32_t *idx = s->idx;
  int n = 0, found = 0, sorted = 0;
  for (int i = 0; i < V; i++)
    if (w[i] > -INFINITY) idx[n++] = i;
  int need = greedy ? 1 : p->top_k > 0 ? p->top_k : n;
  // min_p keeps p_i >= min_p * p_max, i.e. w_i >= w_max + T ln(min_p); a little slack keeps the boundary's tokens
  // for the filter itself to decide
  double cut = !greedy && p->min_p > 0 ? p->temperature * log(p->min_p) - 1e-3 : -INFINITY, wmax = 0;
  memset(s->gmask, 0, ((size_t)V + 31) / 32 * sizeof *s->gmask);
  for (int m = 64; sorted < n; m *= 4) {
    if (m > n) m = n;
    if (m > LAZY_MAX) return 0;
    if (m < n) select_top(idx + sorted, n - sorted, m - sorted, w);
    sort_desc(idx + sorted, m - sorted, w);
    for (; sorted < m; sorted++) {
      int32_t t = idx[sorted];
      if (found && w[t] < wmax + cut) return 1; // this one and every later one fall below min_p
      if (!mdl_grammar_matcher_allows(s->gm, t)) continue;
      if (!found) wmax = w[t];
      s->gmask[t >> 5] |= 1u << (t & 31);
      if (++found >= need) return 1;
    }
  }
  return found > 0; // every candidate checked
}

// The grammar's mask on w: from the grammar's cache, the candidates above, or a full walk (which fills the cache).
static void grammar_mask(mdl_sampler *s, float *w) {
  if (!mdl_grammar_matcher_mask_cached(s->gm, s->gmask) && !lazy_mask(s, w)) mdl_grammar_matcher_mask(s->gm, s->gmask);
  for (int i = 0; i < s->n_vocab; i++)
    if (!allowed(s, i)) w[i] = -INFINITY;
}

static void top_logprobs(mdl_sampler *s, const float *logits, float lse, mdl_sampled *out) {
  int n = s->p.n_logprobs, have = 0;
  mdl_logprob *t = out->top;
  for (int i = 0; i < s->n_vocab && n > 0; i++) {
    float l = isnan(logits[i]) ? -INFINITY : logits[i];
    if (have == n && !(l > t[n - 1].logprob)) continue;
    int j = have < n ? have++ : n - 1;
    while (j > 0 && l > t[j - 1].logprob) {
      t[j] = t[j - 1];
      j--;
    }
    t[j].token = i;
    t[j].logprob = l;
  }
  for (int i = 0; i < have; i++) t[i].logprob -= lse;
  out->n_top = have;
}

// Two passes the compiler vectorizes (a max over 16 lanes, then the first index holding it) instead of one whose
// branch on the running best serializes the walk: over Gemma 3's 262k vocabulary the one-pass loop was a quarter of
// a batch-8 decode step (perf, bench/engine_bench.sh).
int mdl_argmax(const float *v, int n) {
  float lane[16];
  for (int l = 0; l < 16; l++) lane[l] = -INFINITY;
  int i = 0;
  for (; i + 16 <= n; i += 16)
    for (int l = 0; l < 16; l++) lane[l] = v[i + l] > lane[l] ? v[i + l] : lane[l];
  float best = -INFINITY;
  for (int l = 0; l < 16; l++) best = lane[l] > best ? lane[l] : best;
  for (; i < n; i++) best = v[i] > best ? v[i] : best;
  for (i = 0; i < n; i++)
    if (v[i] == best) return i;
  return 0;
}

void mdl_sampler_sample(mdl_sampler *s, const float *logits, mdl_sampled *out) {
  int V = s->n_vocab;
  const mdl_sampling *p = &s->p;
  float *w = s->work;
  // 1. raw log-softmax (what logprobs report): an expf per vocabulary entry, skipped when nobody reads it
  const int want_lp = !p->no_logprob || p->n_logprobs > 0;
  float mx = -INFINITY;
  for (int i = 0; i < V && want_lp; i++)
    if (logits[i] > mx) mx = logits[i];
  double z = 0;
  if (isfinite(mx))
    for (int i = 0; i < V; i++)
      if (logits[i] > -INFINITY) z += expf(logits[i] - mx);
  float lse = isfinite(mx) ? mx + (float)log(z) : 0;

  // 2. adjusted logits: bias, repetition, presence and frequency penalties, the grammar's mask (-inf for what it does
  // not allow; the penalties are per token and keep -inf, so it is as if the mask came first)
  for (int i = 0; i < V; i++) w[i] = isnan(logits[i]) ? -INFINITY : logits[i];

  for (int i = 0; i < p->n_bias; i++) w[p->bias[i].token] += p->bias[i].bias;
  float rp = p->repetition_penalty;
  int pen = p->presence_penalty != 0 || p->frequency_penalty != 0;
  if (rp != 1 || pen) {
    for (int i = 0; i < V; i++) {
      if (rp != 1 && s->seen[i]) w[i] = w[i] > 0 ? w[i] / rp : w[i] * rp;
      if (pen && s->count[i] > 0) w[i] -= p->frequency_penalty * (float)s->count[i] + p->presence_penalty;
    }
  }

  if (s->gm) grammar_mask(s, w);

  int32_t tok = 0;
  if (p->temperature <= 0 || p->top_k == 1) {
    tok = mdl_argmax(w, V); // greedy: ties to the lowest id
    if (w[tok] == -INFINITY) goto fallback;
  } else {
    int32_t *idx = s->idx;
    float inv_t = 1.0f / p->temperature, wm = -INFINITY;
    int n = 0;
    for (int i = 0; i < V; i++) {
      if (w[i] == -INFINITY) continue;
      w[i] *= inv_t;
      if (w[i] > wm) wm = w[i];
      idx[n++] = i;
    }
    if (n == 0) goto fallback;
    // the k best by w are the k best by exp(w - max): only they need the exp (top_k first, then exp over k tokens,
    // not the whole vocabulary)
    if (p->top_k > 0 && p->top_k < n) {
      select_top(idx, n, p->top_k, w);
      n = p->top_k;
    }
    // w becomes the unnormalised probability exp(w - max)
    for (int i = 0; i < n; i++) w[idx[i]] = expf(w[idx[i]] - wm);
    if (p->min_p > 0) { // keep p >= min_p * p_max; p_max has w == 1
      int m = 0;
      for (int i = 0; i < n; i++)
        if (w[idx[i]] >= p->min_p) idx[m++] = idx[i];
      n = m;
    }
    if (p->top_p < 1) {
      double total = 0;
      for (int i = 0; i < n; i++) total += w[idx[i]];
      double want = p->top_p * total;
      // the nucleus is usually small: sort a growing head until it reaches top_p
      for (int k = 64;; k *= 4) {
        if (k > n) k = n;
        if (k < n) select_top(idx, n, k, w);
        sort_desc(idx, k, w);
        double cum = 0;
        int cut = -1;
        for (int i = 0; i < k; i++) {
          cum += w[idx[i]];
          if (cum >= want) {
            cut = i + 1;
            break;
          }
        }
        if (cut > 0 || k == n) {
          n = cut > 0 ? cut : n;
          break;
        }
      }
    }
    double total = 0;
    for (int i = 0; i < n; i++) total += w[idx[i]];
    double r = rng_at(s->key, s->pos) * total, cum = 0;
    tok = idx[n - 1];
    for (int i = 0; i < n; i++) {
      cum += w[idx[i]];
      if (r < cum) {
        tok = idx[i];
        break;
      }
    }
  }
  goto done;
fallback: // everything banned (or -inf): the raw argmax among what the grammar allows
  tok = -1;
  for (int i = 0; i < V; i++)
    if (allowed(s, i) && (tok < 0 || logits[i] > logits[tok])) tok = i;
  if (tok < 0) tok = 0;
done:
  if (s->gm) mdl_grammar_matcher_accept_token(s->gm, tok); // a refusal (nothing allowed) ends the output
  out->token = tok;
  out->logprob = !want_lp ? 0 : (isfinite(mx) && logits[tok] > -INFINITY) ? logits[tok] - lse : -INFINITY;
  out->n_top = 0;
  if (p->n_logprobs > 0) top_logprobs(s, logits, lse, out);
  if (s->count[tok] < INT32_MAX) s->count[tok]++;
  s->seen[tok] = 1;
  s->pos++;
}

void mdl_sampler_accept(mdl_sampler *s, int32_t token) {
  if (token < 0 || token >= s->n_vocab) return;
  s->pos++; // the next draw is the next position's
  if (s->count[token] < INT32_MAX) s->count[token]++;
  s->seen[token] = 1;
  if (s->gm) mdl_grammar_matcher_accept_token(s->gm, token);
}

int mdl_sampler_grammar_done(const mdl_sampler *s) { return s->gm && mdl_grammar_matcher_done(s->gm); }
int mdl_sampler_grammar_too_costly(const mdl_sampler *s) { return s->gm && mdl_grammar_matcher_too_costly(s->gm); }
