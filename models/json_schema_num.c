// models/json_schema_num.c: JSON Schema's numeric keywords (minimum, maximum, exclusiveMinimum, exclusiveMaximum,
// multipleOf) as digit grammars, so an integer or number the grammar writes is always within its bounds.
//
// An integer range is written digit by digit: for each length L, the L-digit strings between the range's two ends
// at that length; a position still equal to an end's digit is "tight" on that side (its next digit is bounded by the
// end's next one), a position past it is free ([0-9] onwards). multipleOf m adds the remainder mod m to the state
// (the value so far times 10 plus the digit, mod m), which must be 0 at the end: one automaton, the range's states
// times m. Free states depend only on (digits left, remainder), so they are shared by every length and both signs.
// multipleOf 10^-k (0.1, 0.01, ...) caps a number's fraction at k digits; other fractional multiples are refused.
// A number with bounds is an integer of the range, or W.F (F: 1..16 fraction digits ending in a nonzero one) for each
// unit (W, W+1) the range touches: any F in a unit wholly inside, and in a unit where a bound falls the F on its side
// of the bound's own decimals (compared digit by digit, the same tight / free states); negatives likewise by their
// magnitude; no exponent. A subset of the valid numbers (each written one way), never an invalid one.
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/json_lit.h"
#include "models/json_schema_int.h"

#define INVALID(c, ...) mdl_js_fail(c, -1, __VA_ARGS__)
#define UNSUP(c, ...) mdl_js_fail(c, MDL_GRAMMAR_UNSUPPORTED, __VA_ARGS__)

#define NUM_MAX 9999999999999999LL // 16 digits: the unbounded grammar's largest magnitude (json_rules.c)
#define NUM_DIGITS 16
#define FRAC_MAX 40                // fraction digits a bound may have; a number between such bounds gets as many
#define MULT_MAX 1000              // multipleOf above this is refused (the automaton has digits x m states: m 9999
                                   // made 2.5M grammar symbols, m 1000 makes a tenth of that)
#define DEAD (-3)                  // a state from which no accepted string continues

#define DEC_DIGITS 40 // significant digits a numeric keyword's value or an enum / const number may have
#define DEC_EXP 100000 // and the largest exponent: beyond either, the value is refused, not rounded

// A number exactly as its literal wrote it (never through a double): 0.dig x 10^point, with its sign.
typedef struct num_dec {
  int neg;                  // 0 for zero
  int n;                    // digits in dig; 0: the value is zero
  char dig[DEC_DIGITS + 1]; // no leading or trailing zeros
  long point;
  const char *text;         // (borrowed) the literal, for messages
} num_dec;

typedef struct num_bounds {
  int has_lo, has_hi, lo_excl, hi_excl, has_mult;
  num_dec lo, hi, mult;
} num_bounds;

static const char *const NUM_KEYS[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                                       NULL};

int mdl_js_is_num_keyword(const char *k) {
  for (const char *const *p = NUM_KEYS; *p; p++)
    if (!strcmp(*p, k)) return 1;
  return 0;
}

// Reads number node v's literal (models/json_lit.h; %.17g for a node built without one) into *d. 0, or -1 with
// the error recorded naming what (the keyword) when it has more digits or a larger exponent than are kept exactly.
static int dec_read(mdl_js_ctx *c, const cJSON *v, const char *what, num_dec *d, char *fallback, size_t cap) {
  const char *t = mdl_json_num_text(v);
  if (!t) {
    snprintf(fallback, cap, "%.17g", v->valuedouble);
    t = fallback;
  }
  memset(d, 0, sizeof *d);
  d->text = t;
  const char *p = t;
  int neg = *p == '-', seen_point = 0, lead = 1;
  if (*p == '-' || *p == '+') p++;
  long point = 0;
  for (; (*p >= '0' && *p <= '9') || *p == '.'; p++) {
    if (*p == '.') {
      seen_point = 1;
      continue;
    }
    if (lead && *p == '0') { // a leading zero: only moves the point when it is after it
      if (seen_point) point--;
      continue;
    }
    lead = 0;
    if (d->n == DEC_DIGITS) {
      if (*p != '0') return UNSUP(c, "'%s' %.60s has more than %d significant digits, which cannot be kept exactly",
                                  what, t, DEC_DIGITS);
      if (!seen_point) point++; // a trailing zero of the whole part
      continue;
    }
    d->dig[d->n++] = *p;
    if (!seen_point) point++;
  }
  while (d->n && d->dig[d->n - 1] == '0') d->dig[--d->n] = 0;
  if (*p == 'e' || *p == 'E') {
    long e = strtol(p + 1, NULL, 10);
    if (e > DEC_EXP || e < -DEC_EXP)
      return UNSUP(c, "'%s' %.60s: an exponent beyond %d cannot be kept exactly", what, t, DEC_EXP);
    point += e;
  }
  d->point = d->n ? point : 0;
  d->neg = d->n ? neg : 0;
  return 0;
}

static int dec_sign(const num_dec *d) { return !d->n ? 0 : d->neg ? -1 : 1; }

// -1, 0, 1 as a < b, a = b, a > b: exactly.
static int dec_cmp(const num_dec *a, const num_dec *b) {
  int sa = dec_sign(a), sb = dec_sign(b);
  if (sa != sb || !sa) return sa < sb ? -1 : sa > sb;
  int mag = a->point != b->point ? (a->point < b->point ? -1 : 1) : 0;
  for (int i = 0; !mag && i < a->n && i < b->n; i++) mag = a->dig[i] < b->dig[i] ? -1 : a->dig[i] > b->dig[i];
  if (!mag) mag = a->n < b->n ? -1 : a->n > b->n;
  return sa < 0 ? -mag : mag;
}

static int dec_is_int(const num_dec *d) { return d->point >= d->n; }

static num_dec dec_abs(const num_dec *d) {
  num_dec m = *d;
  m.neg = 0;
  return m;
}

// |d| as a whole part and up to FRAC_MAX fraction digits (no trailing zeros; "" for a whole number). Returns
// bits: 1 the whole part is beyond NUM_MAX (*whole then NUM_MAX + 1), 2 there are more fraction digits than fit.
static int dec_split(const num_dec *d, int64_t *whole, char frac[FRAC_MAX + 1]) {
  int rc = 0;
  *whole = 0;
  frac[0] = 0;
  if (d->point > NUM_DIGITS) {
    *whole = NUM_MAX + 1;
    rc |= 1;
  } else {
    for (long i = 0; i < d->point; i++) *whole = *whole * 10 + (i < d->n ? d->dig[i] - '0' : 0);
  }
  if (d->n > d->point) { // fraction digits: -point zeros, then the digits after the point
    long zeros = d->point < 0 ? -d->point : 0, from = d->point > 0 ? d->point : 0, k = 0;
    if (zeros + (d->n - from) > FRAC_MAX) return rc | 2;
    for (long i = 0; i < zeros; i++) frac[k++] = '0';
    for (long i = from; i < d->n; i++) frac[k++] = d->dig[i];
    frac[k] = 0;
  }
  return rc;
}

// One side's bound from its inclusive keyword (minimum / maximum) and its exclusive one (a number, or draft 4's
// boolean that makes the inclusive one exclusive): the tighter of the two. 0, or -1 with the error.
static int read_side(mdl_js_ctx *c, const cJSON *s, const char *incl, const char *excl, int upper, int *has, num_dec *v,
                     int *is_excl, char bufs[2][32]) {
  const cJSON *i = cJSON_GetObjectItemCaseSensitive(s, incl), *x = cJSON_GetObjectItemCaseSensitive(s, excl);
  *has = 0;
  *is_excl = 0;
  if (i) {
    if (!cJSON_IsNumber(i)) return INVALID(c, "'%s' must be a number", incl);
    if (dec_read(c, i, incl, v, bufs[0], 32) < 0) return -1;
    *has = 1;
  }
  if (cJSON_IsBool(x)) {
    if (cJSON_IsTrue(x) && !i) return INVALID(c, "'%s': true needs '%s'", excl, incl);
    *is_excl = cJSON_IsTrue(x);
  } else if (x) {
    num_dec e;
    if (!cJSON_IsNumber(x)) return INVALID(c, "'%s' must be a number", excl);
    if (dec_read(c, x, excl, &e, bufs[1], 32) < 0) return -1;
    if (!*has || (upper ? dec_cmp(&e, v) <= 0 : dec_cmp(&e, v) >= 0)) *v = e, *is_excl = 1;
    *has = 1;
  }
  return 0;
}

// bufs: room for the literals of nodes built without one (5 x 32 bytes), which b's texts point into.
static int read_bounds(mdl_js_ctx *c, const cJSON *s, num_bounds *b, char bufs[5][32]) {
  memset(b, 0, sizeof *b);
  if (read_side(c, s, "minimum", "exclusiveMinimum", 0, &b->has_lo, &b->lo, &b->lo_excl, bufs) < 0 ||
      read_side(c, s, "maximum", "exclusiveMaximum", 1, &b->has_hi, &b->hi, &b->hi_excl, bufs + 2) < 0)
    return -1;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
  if (m) {
    if (!cJSON_IsNumber(m)) return INVALID(c, "'multipleOf' must be a number greater than 0");
    if (dec_read(c, m, "multipleOf", &b->mult, bufs[4], 32) < 0) return -1;
    if (dec_sign(&b->mult) <= 0) return INVALID(c, "'multipleOf' must be a number greater than 0");
    b->has_mult = 1;
  }
  return 0;
}

// Whether v is a whole multiple of m (> 0), exactly: both scaled by 10^s to integers V and M, V mod M digit by
// digit. -1 when M needs more than 18 digits (then it cannot be checked here).
static int dec_multiple(const num_dec *v, const num_dec *m) {
  long fv = v->n > v->point ? v->n - v->point : 0, fm = m->n > m->point ? m->n - m->point : 0, sc = fv > fm ? fv : fm;
  long mlen = m->point + sc; // M's digits
  if (mlen > 18) return -1;
  uint64_t M = 0;
  for (long i = 0; i < mlen; i++) M = M * 10 + (uint64_t)(i < m->n ? m->dig[i] - '0' : 0);
  if (!v->n) return 1;
  unsigned __int128 r = 0;
  for (long i = 0, vlen = v->point + sc; i < vlen; i++) r = (r * 10 + (unsigned)(i < v->n ? v->dig[i] - '0' : 0)) % M;
  return r == 0;
}

int mdl_js_num_in_bounds(mdl_js_ctx *c, const cJSON *s, const cJSON *v) {
  num_bounds b;
  num_dec x;
  char bufs[5][32], vb[32];
  if (read_bounds(c, s, &b, bufs) < 0 || dec_read(c, v, "enum/const value", &x, vb, sizeof vb) < 0) return -1;
  if (b.has_lo && (b.lo_excl ? dec_cmp(&x, &b.lo) <= 0 : dec_cmp(&x, &b.lo) < 0)) return 0;
  if (b.has_hi && (b.hi_excl ? dec_cmp(&x, &b.hi) >= 0 : dec_cmp(&x, &b.hi) > 0)) return 0;
  int k = b.has_mult ? dec_multiple(&x, &b.mult) : 1;
  if (k < 0) return UNSUP(c, "'multipleOf' %.60s cannot be checked exactly (more than 18 digits at this scale)",
                          b.mult.text);
  return k;
}

int mdl_js_num_is_int(mdl_js_ctx *c, const cJSON *v) {
  num_dec x;
  char vb[32];
  return dec_read(c, v, "enum/const value", &x, vb, sizeof vb) < 0 ? -1 : dec_is_int(&x);
}

// ---- the digit automaton ----

typedef struct num_dfa {
  mdl_js_ctx *c;
  int m;      // multipleOf (1: none)
  int *free;  // (owned) ((NUM_DIGITS + 1) * m) the free state (digits left, remainder): rule, DEAD, or -1 not yet
  int decimals; // the most fraction digits a number may have (multipleOf 0.01: 2)
  int fixed;    // decimals is multipleOf's, not the default
  int empty;  // the rule "" (-1 not yet)
} num_dfa;

static int empty_rule(num_dfa *d) {
  if (d->empty < 0) {
    mdl_grammar_seq s = {0};
    d->empty = mdl_js_rule_of(d->c, &s);
  }
  return d->empty;
}

// A digit automaton's state as a rule: "" when it may end here, then one alternative per distinct next state t of
// target (by digit; DEAD: that digit cannot come): the set of digits that lead to t, then t. DEAD when the state has
// no alternative, -1 when out of memory.
static int digit_rule(mdl_js_ctx *c, int target[10], int may_end) {
  int rule = DEAD;
  mdl_grammar_seq s = {0};
  if (may_end && (rule = mdl_grammar_rule_new(c->b)) >= 0) mdl_grammar_alt(c->b, rule, &s);
  for (int k = 0; k < 10 && rule != -1; k++) {
    if (target[k] == DEAD || target[k] == -2) continue;
    uint8_t set[32] = {0};
    int t = target[k];
    for (int j = k; j < 10; j++)
      if (target[j] == t) {
        set[('0' + j) >> 3] |= (uint8_t)(1u << (('0' + j) & 7));
        target[j] = -2; // taken
      }
    if (rule == DEAD && (rule = mdl_grammar_rule_new(c->b)) < 0) break;
    s.n = 0;
    mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(c->b, set));
    mdl_js_ref(&s, t);
    mdl_grammar_alt(c->b, rule, &s);
  }
  mdl_grammar_seq_free(&s);
  return rule;
}

// The rule of the n-digit strings that continue remainder r, at least lo and at most hi (their remaining n digits;
// NULL: free on that side) and end at remainder 0; DEAD when there is none, -1 on failure.
static int dfa_state(num_dfa *d, const char *lo, const char *hi, int n, int r) {
  if (n == 0) return r == 0 ? empty_rule(d) : DEAD;
  int *memo = !lo && !hi ? &d->free[n * d->m + r] : NULL;
  if (memo && *memo != -1) return *memo;
  int target[10], dlo = lo ? lo[0] - '0' : 0, dhi = hi ? hi[0] - '0' : 9;
  for (int k = 0; k < 10; k++) {
    target[k] = k < dlo || k > dhi ? DEAD
                                   : dfa_state(d, lo && k == dlo ? lo + 1 : NULL, hi && k == dhi ? hi + 1 : NULL, n - 1,
                                               (int)((10L * r + k) % d->m));
    if (target[k] == -1) return -1;
  }
  int rule = digit_rule(d->c, target, 0);
  if (memo) *memo = rule;
  return rule;
}

static int n_digits(int64_t v) {
  int n = 1;
  while (v >= 10) v /= 10, n++;
  return n;
}

// Adds to rule the decimal strings (no leading zeros; sign "-" in front when neg) of the values in [lo, hi]
// (0 <= lo <= hi <= NUM_MAX) that are multiples of d->m. Returns how many alternatives it added, or -1.
static int add_range(num_dfa *d, int rule, int64_t lo, int64_t hi, int neg) {
  int added = 0;
  int64_t p = 1;
  for (int len = 1; len <= NUM_DIGITS; len++, p *= 10) {
    int64_t a = len == 1 ? 0 : p, b = p * 10 - 1; // this length's values
    if (a < lo) a = lo;
    if (b > hi) b = hi;
    if (a > b) continue;
    char sa[24], sb[24];
    snprintf(sa, sizeof sa, "%0*lld", len, (long long)a);
    snprintf(sb, sizeof sb, "%0*lld", len, (long long)b);
    if (n_digits(a) != len || n_digits(b) != len) continue;
    int t = dfa_state(d, sa, sb, len, 0);
    if (t == -1) return -1;
    if (t == DEAD) continue;
    mdl_grammar_seq s = {0};
    if (neg) mdl_js_lit(d->c, &s, "-");
    mdl_js_ref(&s, t);
    mdl_grammar_alt(d->c->b, rule, &s);
    mdl_grammar_seq_free(&s);
    added++;
  }
  return added;
}

// Adds the integers in [lo, hi] (within +-NUM_MAX) that are multiples of d->m to rule; how many alternatives, or -1.
static int add_ints(num_dfa *d, int rule, int64_t lo, int64_t hi) {
  int n = 0, k;
  if (hi >= 0 && lo <= hi) {
    if ((k = add_range(d, rule, lo > 0 ? lo : 0, hi, 0)) < 0) return -1;
    n += k;
  }
  if (lo < 0 && lo <= hi) { // -x for x in [max(1, -hi), -lo]
    if ((k = add_range(d, rule, hi < -1 ? -hi : 1, -lo, 1)) < 0) return -1;
    n += k;
  }
  return n;
}

// The least integer at or above d (above when excl), or with down the greatest at or below (below when excl),
// exactly; a value beyond +-NUM_MAX gives +-(NUM_MAX + 1), which the caller clamps or refuses.
static int64_t dec_round(const num_dec *d, int excl, int down) {
  int64_t w;
  char frac[FRAC_MAX + 1];
  int sp = dec_split(d, &w, frac), has_frac = !dec_is_int(d) && !(sp & 1);
  int64_t v = d->neg ? -w : w; // toward zero
  if (!has_frac) return v + (excl ? (down ? -1 : 1) : 0);
  if (down) return d->neg ? v - 1 : v;
  return d->neg ? v : v + 1;
}

// The integer bounds of b: [*lo, *hi] within +-NUM_MAX. 0, or -1 with the error when a bound lies beyond them.
static int int_bounds(mdl_js_ctx *c, const num_bounds *b, int64_t *lo, int64_t *hi) {
  int64_t l = b->has_lo ? dec_round(&b->lo, b->lo_excl, 0) : -NUM_MAX, h = b->has_hi ? dec_round(&b->hi, b->hi_excl, 1) : NUM_MAX;
  if (l > NUM_MAX || h < -NUM_MAX)
    return UNSUP(c, "a bound beyond %d digits is not supported (the grammar writes at most %d integer digits)",
                 NUM_DIGITS, NUM_DIGITS);
  *lo = l < -NUM_MAX ? -NUM_MAX : l;
  *hi = h > NUM_MAX ? NUM_MAX : h;
  return 0;
}

// ---- fractions ----

// The fraction digits F after a number's '.' (1..16 of them, the last nonzero, so 0.F is strictly between 0 and 1)
// with 0.F at least lo and at most hi (digit strings as num_dec's; NULL: no bound), compared digit by digit: a state
// is (digits so far, still equal to lo's first digits, still equal to hi's, the last digit nonzero).
typedef struct frac_dfa {
  mdl_js_ctx *c;
  const char *lo, *hi;
  int lo_incl, hi_incl;
  int max_len;                 // the most digits F may have
  int free[FRAC_MAX + 1][2];   // the states with neither bound left to meet: rule, DEAD, or -1 not yet
  int empty;                   // the rule "" (-1 not yet)
} frac_dfa;

static void frac_init(frac_dfa *f, const num_dfa *d) {
  memset(f, 0, sizeof *f);
  f->c = d->c;
  f->max_len = d->decimals; // add_fracs raises it for a bound with more
  f->empty = -1;
  for (int i = 0; i <= FRAC_MAX; i++) f->free[i][0] = f->free[i][1] = -1;
}

static int frac_state(frac_dfa *f, int i, int tlo, int thi, int nz) {
  int *memo = !tlo && !thi ? &f->free[i][nz] : NULL;
  if (memo && *memo != -1) return *memo;
  int nlo = f->lo ? (int)strlen(f->lo) : 0, nhi = f->hi ? (int)strlen(f->hi) : 0;
  // ending here: F equal to lo's first i digits is below lo unless that is all of lo; F a proper prefix of hi is
  // below hi, F equal to hi is hi
  int end = i > 0 && nz && (!tlo || (i == nlo && f->lo_incl)) && (!thi || i < nhi || f->hi_incl);
  int target[10];
  for (int k = 0; k < 10; k++) {
    target[k] = DEAD;
    if (i == f->max_len || (thi && (i >= nhi || k > f->hi[i] - '0')) || (tlo && i < nlo && k < f->lo[i] - '0'))
      continue;
    target[k] = frac_state(f, i + 1, tlo && i < nlo && k == f->lo[i] - '0', thi && k == f->hi[i] - '0', k != 0);
    if (target[k] == -1) return -1;
  }
  int rule = digit_rule(f->c, target, end);
  if (memo) *memo = rule;
  return rule;
}

// Adds "[-]W.F" to rule for the whole parts W in [a, b] and the fractions f allows. How many alternatives, or -1.
static int add_unit(num_dfa *d, int rule, int64_t a, int64_t b, int neg, frac_dfa *f) {
  int fr = frac_state(f, 0, f->lo != NULL, f->hi != NULL, 0), whole = fr >= 0 ? mdl_grammar_rule_new(d->c->b) : -1;
  if (fr == DEAD) return 0;
  int k = whole < 0 ? -1 : add_range(d, whole, a, b, 0);
  if (k <= 0) return k;
  mdl_grammar_seq s = {0};
  if (neg) mdl_js_lit(d->c, &s, "-");
  mdl_js_ref(&s, whole);
  mdl_js_lit(d->c, &s, ".");
  mdl_js_ref(&s, fr);
  mdl_grammar_alt(d->c->b, rule, &s);
  mdl_grammar_seq_free(&s);
  return 1;
}

// Adds the non-integers of one sign whose magnitude m lies between mlo and mhi (NULL: no bound above): units
// (W, W + 1) wholly inside with any fraction, and the units where a bound falls with the fractions on its side.
// How many alternatives, or -1 (the error recorded for a bound with over 16 decimals).
static int add_fracs(num_dfa *d, int rule, const num_dec *mlo, int lo_excl, const num_dec *mhi, int hi_excl, int neg) {
  int64_t lw, hw = 0;
  char lf[FRAC_MAX + 1], hf[FRAC_MAX + 1] = "";
  int ls = dec_split(mlo, &lw, lf), hs = mhi ? dec_split(mhi, &hw, hf) : 0, has_hi = mhi && !(hs & 1);
  if ((ls & 2) || (has_hi && (hs & 2)))
    return UNSUP(d->c, "a bound with more than %d decimals is not supported", FRAC_MAX);
  if (ls & 1) return 0; // beyond every number the grammar writes (int_bounds has refused a lower bound there)
  int n = 0, k;
  int64_t a = lw + (lf[0] ? 1 : 0), b = has_hi ? hw - 1 : NUM_MAX; // units wholly inside
  frac_dfa f;
  // a number may have as many decimals as the longer bound (0.30000000000000004 has 17), unless multipleOf caps them
  size_t need = strlen(lf) > strlen(hf) ? strlen(lf) : strlen(hf);
  int max_len = d->fixed || need <= (size_t)d->decimals ? d->decimals : (int)need;
  if (a <= b) {
    frac_init(&f, d);
    f.max_len = max_len;
    if ((k = add_unit(d, rule, a, b, neg, &f)) < 0) return -1;
    n += k;
  }
  if (lf[0]) { // the unit where the lower bound falls (and the upper one too when it is the same unit)
    frac_init(&f, d);
    f.max_len = max_len;
    f.lo = lf, f.lo_incl = !lo_excl;
    if (has_hi && hw == lw) f.hi = hf, f.hi_incl = !hi_excl;
    if ((k = add_unit(d, rule, lw, lw, neg, &f)) < 0) return -1;
    n += k;
  }
  if (has_hi && hf[0] && hw >= a) { // the unit where the upper bound falls
    frac_init(&f, d);
    f.max_len = max_len;
    f.hi = hf, f.hi_incl = !hi_excl;
    if ((k = add_unit(d, rule, hw, hw, neg, &f)) < 0) return -1;
    n += k;
  }
  return n;
}

static int compile_bounded(mdl_js_ctx *c, const num_bounds *b, int integer) {
  num_dfa d = {.c = c, .m = 1, .empty = -1, .decimals = NUM_DIGITS};
  int64_t lo = 0, hi = 0;
  if (int_bounds(c, b, &lo, &hi) < 0) return -1;
  const num_dec *m = &b->mult;
  if (b->has_mult && !dec_is_int(m)) { // 10^-k: at most k decimals (every integer is a multiple)
    long k = m->n == 1 && m->dig[0] == '1' && m->point <= 0 ? 1 - m->point : 0;
    if (!k || k > NUM_DIGITS)
      return UNSUP(c, "'multipleOf' %.60s is not supported: a whole number up to %d or a power of ten (0.1, 0.01, ..., "
                   "1e-%d) can be enforced exactly", m->text, MULT_MAX, NUM_DIGITS);
    d.decimals = (int)k;
    d.fixed = 1;
  } else if (b->has_mult) {
    int64_t mv;
    char mf[FRAC_MAX + 1];
    if (dec_split(m, &mv, mf) || mv > MULT_MAX) return UNSUP(c, "'multipleOf' over %d is not supported", MULT_MAX);
    d.m = (int)mv;
    integer = 1; // a number that is a whole multiple of a whole number: written as an integer
  }
  d.free = malloc((size_t)(NUM_DIGITS + 1) * (size_t)d.m * sizeof *d.free);
  if (!d.free) return INVALID(c, "out of memory");
  for (size_t i = 0; i < (size_t)(NUM_DIGITS + 1) * (size_t)d.m; i++) d.free[i] = -1;
  int rule = mdl_grammar_rule_new(c->b), n = rule < 0 ? -1 : add_ints(&d, rule, lo, hi);
  if (n >= 0 && !integer) { // the non-integers: positive ones, then negative ones by their magnitude
    static const num_dec zero = {0};
    int k = 0, slo = b->has_lo ? dec_sign(&b->lo) : -1, shi = b->has_hi ? dec_sign(&b->hi) : 1;
    num_dec alo = dec_abs(&b->lo), ahi = dec_abs(&b->hi);
    if (shi > 0)
      k = add_fracs(&d, rule, slo > 0 ? &b->lo : &zero, slo > 0 && b->lo_excl, b->has_hi ? &b->hi : NULL, b->hi_excl,
                    0);
    n = k < 0 ? -1 : n + k;
    k = 0;
    if (n >= 0 && slo < 0)
      k = add_fracs(&d, rule, shi < 0 ? &ahi : &zero, shi < 0 && b->hi_excl, b->has_lo ? &alo : NULL, b->lo_excl, 1);
    n = k < 0 ? -1 : n + k;
  }
  free(d.free);
  if (n < 0 || mdl_grammar_builder_failed(c->b)) return c->status ? -1 : INVALID(c, "out of memory");
  if (n == 0) {
    if (b->has_mult)
      return INVALID(c, "no %s between the bounds is a multiple of %.60s: nothing can satisfy it",
                     integer ? "integer" : "number", m->text);
    return INVALID(c, "no %s lies between the bounds: nothing can satisfy it", integer ? "integer" : "number");
  }
  return rule;
}

int mdl_js_number_bounded(mdl_js_ctx *c, const cJSON *s, int integer) {
  num_bounds b;
  char bufs[5][32];
  if (read_bounds(c, s, &b, bufs) < 0) return -1;
  if (!b.has_lo && !b.has_hi && !b.has_mult) return mdl_js_number(c, integer);
  return compile_bounded(c, &b, integer);
}
