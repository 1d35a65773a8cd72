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

#include "models/json_schema_int.h"

#define INVALID(c, ...) mdl_js_fail(c, -1, __VA_ARGS__)
#define UNSUP(c, ...) mdl_js_fail(c, MDL_GRAMMAR_UNSUPPORTED, __VA_ARGS__)

#define NUM_MAX 9999999999999999LL // 16 digits: the unbounded grammar's largest magnitude (json_rules.c)
#define NUM_DIGITS 16
#define MULT_MAX 1000              // multipleOf above this is refused (the automaton has digits x m states: m 9999
                                   // made 2.5M grammar symbols, m 1000 makes a tenth of that)
#define DEAD (-3)                  // a state from which no accepted string continues

typedef struct num_bounds {
  int has_lo, has_hi, lo_excl, hi_excl, has_mult;
  double lo, hi, mult;
} num_bounds;

static const char *const NUM_KEYS[] = {"minimum", "maximum", "exclusiveMinimum", "exclusiveMaximum", "multipleOf",
                                       NULL};

int mdl_js_is_num_keyword(const char *k) {
  for (const char *const *p = NUM_KEYS; *p; p++)
    if (!strcmp(*p, k)) return 1;
  return 0;
}

// One side's bound from its inclusive keyword (minimum / maximum) and its exclusive one (a number, or draft 4's
// boolean that makes the inclusive one exclusive): the tighter of the two. 0, or -1 with the error.
static int read_side(mdl_js_ctx *c, const cJSON *s, const char *incl, const char *excl, int upper, int *has, double *v,
                     int *is_excl) {
  const cJSON *i = cJSON_GetObjectItemCaseSensitive(s, incl), *x = cJSON_GetObjectItemCaseSensitive(s, excl);
  *has = 0;
  *is_excl = 0;
  if (i) {
    if (!cJSON_IsNumber(i) || !isfinite(i->valuedouble)) return INVALID(c, "'%s' must be a number", incl);
    *has = 1;
    *v = i->valuedouble;
  }
  if (cJSON_IsBool(x)) {
    if (cJSON_IsTrue(x) && !i) return INVALID(c, "'%s': true needs '%s'", excl, incl);
    *is_excl = cJSON_IsTrue(x);
  } else if (x) {
    if (!cJSON_IsNumber(x) || !isfinite(x->valuedouble)) return INVALID(c, "'%s' must be a number", excl);
    double e = x->valuedouble;
    if (!*has || (upper ? e <= *v : e >= *v)) *v = e, *is_excl = 1;
    *has = 1;
  }
  return 0;
}

static int read_bounds(mdl_js_ctx *c, const cJSON *s, num_bounds *b) {
  memset(b, 0, sizeof *b);
  if (read_side(c, s, "minimum", "exclusiveMinimum", 0, &b->has_lo, &b->lo, &b->lo_excl) < 0 ||
      read_side(c, s, "maximum", "exclusiveMaximum", 1, &b->has_hi, &b->hi, &b->hi_excl) < 0)
    return -1;
  const cJSON *m = cJSON_GetObjectItemCaseSensitive(s, "multipleOf");
  if (m) {
    if (!cJSON_IsNumber(m) || !isfinite(m->valuedouble) || m->valuedouble <= 0)
      return INVALID(c, "'multipleOf' must be a number greater than 0");
    b->has_mult = 1;
    b->mult = m->valuedouble;
  }
  return 0;
}

int mdl_js_num_in_bounds(const cJSON *s, double v) {
  mdl_js_ctx c = {0};
  char err[8];
  c.err = err, c.errlen = sizeof err;
  num_bounds b;
  if (read_bounds(&c, s, &b) < 0) return 0;
  if (b.has_lo && (b.lo_excl ? v <= b.lo : v < b.lo)) return 0;
  if (b.has_hi && (b.hi_excl ? v >= b.hi : v > b.hi)) return 0;
  double q = b.has_mult ? v / b.mult : 0; // a whole quotient, within rounding (0.07 / 0.01 is 7.000000000000001)
  return !b.has_mult || fabs(q - nearbyint(q)) < 1e-9 * fmax(1, fabs(q));
}

// ---- the digit automaton ----

typedef struct num_dfa {
  mdl_js_ctx *c;
  int m;      // multipleOf (1: none)
  int *free;  // (owned) ((NUM_DIGITS + 1) * m) the free state (digits left, remainder): rule, DEAD, or -1 not yet
  int decimals; // the most fraction digits a number may have (multipleOf 0.01: 2)
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

// The integer bounds of b: [*lo, *hi] within +-NUM_MAX. 0, or -1 with the error when a bound lies beyond them.
static int int_bounds(mdl_js_ctx *c, const num_bounds *b, int64_t *lo, int64_t *hi) {
  double l = -(double)NUM_MAX, h = (double)NUM_MAX;
  if (b->has_lo) l = b->lo_excl ? floor(b->lo) + 1 : ceil(b->lo);
  if (b->has_hi) h = b->hi_excl ? ceil(b->hi) - 1 : floor(b->hi);
  if (l > (double)NUM_MAX || h < -(double)NUM_MAX)
    return UNSUP(c, "a bound beyond %d digits is not supported (the grammar writes at most %d integer digits)",
                 NUM_DIGITS, NUM_DIGITS);
  *lo = l < -(double)NUM_MAX ? -NUM_MAX : (int64_t)l;
  *hi = h > (double)NUM_MAX ? NUM_MAX : (int64_t)h;
  return 0;
}

// ---- fractions ----

// A bound's magnitude as an exact decimal: its whole part and its fraction digits without trailing zeros ("" for a
// whole number). -1 when it needs more than 16 fraction digits.
typedef struct num_dec {
  int64_t whole;
  char frac[NUM_DIGITS + 1];
} num_dec;

static int dec_of(double v, num_dec *out) {
  for (int prec = 0; prec <= NUM_DIGITS; prec++) {
    char s[64];
    snprintf(s, sizeof s, "%.*f", prec, v);
    if (strtod(s, NULL) != v) continue;
    char *dot = strchr(s, '.');
    out->whole = (int64_t)strtoll(s, NULL, 10);
    snprintf(out->frac, sizeof out->frac, "%s", dot ? dot + 1 : "");
    size_t n = strlen(out->frac);
    while (n && out->frac[n - 1] == '0') out->frac[--n] = 0;
    return 0;
  }
  return -1;
}

// The fraction digits F after a number's '.' (1..16 of them, the last nonzero, so 0.F is strictly between 0 and 1)
// with 0.F at least lo and at most hi (digit strings as num_dec's; NULL: no bound), compared digit by digit: a state
// is (digits so far, still equal to lo's first digits, still equal to hi's, the last digit nonzero).
typedef struct frac_dfa {
  mdl_js_ctx *c;
  const char *lo, *hi;
  int lo_incl, hi_incl;
  int max_len;                 // the most digits F may have
  int free[NUM_DIGITS + 1][2]; // the states with neither bound left to meet: rule, DEAD, or -1 not yet
  int empty;                   // the rule "" (-1 not yet)
} frac_dfa;

static void frac_init(frac_dfa *f, const num_dfa *d) {
  memset(f, 0, sizeof *f);
  f->c = d->c;
  f->max_len = d->decimals;
  f->empty = -1;
  for (int i = 0; i <= NUM_DIGITS; i++) f->free[i][0] = f->free[i][1] = -1;
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

// Adds the non-integers of one sign whose magnitude m lies between mlo and mhi (has_hi 0: no bound above): units
// (W, W + 1) wholly inside with any fraction, and the units where a bound falls with the fractions on its side.
// How many alternatives, or -1 (the error recorded for a bound with over 16 decimals).
static int add_fracs(num_dfa *d, int rule, double mlo, int lo_excl, int has_hi, double mhi, int hi_excl, int neg) {
  num_dec L, H = {0};
  if (has_hi && mhi > (double)NUM_MAX) has_hi = 0;
  if (dec_of(mlo, &L) < 0 || (has_hi && dec_of(mhi, &H) < 0))
    return UNSUP(d->c, "a bound with more than %d decimals is not supported", NUM_DIGITS);
  int n = 0, k;
  int64_t a = L.whole + (L.frac[0] ? 1 : 0), b = has_hi ? H.whole - 1 : NUM_MAX; // units wholly inside
  frac_dfa f;
  if (a <= b) {
    frac_init(&f, d);
    if ((k = add_unit(d, rule, a, b, neg, &f)) < 0) return -1;
    n += k;
  }
  if (L.frac[0]) { // the unit where the lower bound falls (and the upper one too when it is the same unit)
    frac_init(&f, d);
    f.lo = L.frac, f.lo_incl = !lo_excl;
    if (has_hi && H.whole == L.whole) f.hi = H.frac, f.hi_incl = !hi_excl;
    if ((k = add_unit(d, rule, L.whole, L.whole, neg, &f)) < 0) return -1;
    n += k;
  }
  if (has_hi && H.frac[0] && H.whole >= a) { // the unit where the upper bound falls
    frac_init(&f, d);
    f.hi = H.frac, f.hi_incl = !hi_excl;
    if ((k = add_unit(d, rule, H.whole, H.whole, neg, &f)) < 0) return -1;
    n += k;
  }
  return n;
}

static int compile_bounded(mdl_js_ctx *c, const num_bounds *b, int integer) {
  num_dfa d = {.c = c, .m = 1, .empty = -1, .decimals = NUM_DIGITS};
  int64_t lo = 0, hi = 0;
  num_dec md;
  if (int_bounds(c, b, &lo, &hi) < 0) return -1;
  if (b->has_mult && b->mult != floor(b->mult)) { // 10^-k: at most k decimals (every integer is a multiple)
    size_t k = dec_of(b->mult, &md) == 0 && md.whole == 0 ? strlen(md.frac) : 0;
    if (!k || md.frac[k - 1] != '1' || strspn(md.frac, "0") != k - 1)
      return UNSUP(c, "'multipleOf' %g is not supported: a whole number up to %d or a power of ten (0.1, 0.01, ...) "
                   "can be enforced exactly", b->mult, MULT_MAX);
    d.decimals = (int)k;
  } else if (b->has_mult) {
    if (b->mult > MULT_MAX) return UNSUP(c, "'multipleOf' over %d is not supported", MULT_MAX);
    d.m = (int)b->mult;
    integer = 1; // a number that is a whole multiple of a whole number: written as an integer
  }
  d.free = malloc((size_t)(NUM_DIGITS + 1) * (size_t)d.m * sizeof *d.free);
  if (!d.free) return INVALID(c, "out of memory");
  for (size_t i = 0; i < (size_t)(NUM_DIGITS + 1) * (size_t)d.m; i++) d.free[i] = -1;
  int rule = mdl_grammar_rule_new(c->b), n = rule < 0 ? -1 : add_ints(&d, rule, lo, hi);
  if (n >= 0 && !integer) { // the non-integers: positive ones, then negative ones by their magnitude
    int k = 0;
    if (!b->has_hi || b->hi > 0)
      k = add_fracs(&d, rule, b->has_lo && b->lo > 0 ? b->lo : 0, b->has_lo && b->lo > 0 && b->lo_excl, b->has_hi,
                    b->hi, b->hi_excl, 0);
    n = k < 0 ? -1 : n + k;
    k = 0;
    if (n >= 0 && (!b->has_lo || b->lo < 0))
      k = add_fracs(&d, rule, b->has_hi && b->hi < 0 ? -b->hi : 0, b->has_hi && b->hi < 0 && b->hi_excl, b->has_lo,
                    -b->lo, b->lo_excl, 1);
    n = k < 0 ? -1 : n + k;
  }
  free(d.free);
  if (n < 0 || mdl_grammar_builder_failed(c->b)) return c->status ? -1 : INVALID(c, "out of memory");
  if (n == 0) {
    if (b->has_mult)
      return INVALID(c, "no %s between the bounds is a multiple of %g: nothing can satisfy it",
                     integer ? "integer" : "number", b->mult);
    return INVALID(c, "no %s lies between the bounds: nothing can satisfy it", integer ? "integer" : "number");
  }
  return rule;
}

int mdl_js_number_bounded(mdl_js_ctx *c, const cJSON *s, int integer) {
  num_bounds b;
  if (read_bounds(c, s, &b) < 0) return -1;
  if (!b.has_lo && !b.has_hi && !b.has_mult) return mdl_js_number(c, integer);
  return compile_bounded(c, &b, integer);
}
