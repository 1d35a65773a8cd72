// models/json_schema_num.c: JSON Schema's numeric keywords (minimum, maximum, exclusiveMinimum, exclusiveMaximum,
// multipleOf) as digit grammars, so an integer or number the grammar writes is always within its bounds.
//
// An integer range is written digit by digit: for each length L, the L-digit strings between the range's two ends
// at that length; a position still equal to an end's digit is "tight" on that side (its next digit is bounded by the
// end's next one), a position past it is free ([0-9] onwards). multipleOf m adds the remainder mod m to the state
// (the value so far times 10 plus the digit, mod m), which must be 0 at the end: one automaton, the range's states
// times m. Free states depend only on (digits left, remainder), so they are shared by every length and both signs.
// A number with bounds is an integer of the range, or k.F (F: fraction digits ending in a nonzero digit, so the value
// lies strictly inside (k, k+1)) for the k whose whole unit interval is inside the range, or -k.F likewise; no
// exponent. A subset of the valid numbers, never an invalid one.
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
#define MULT_MAX 10000             // multipleOf above this is refused (the automaton has digits x m states)
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
  return !b.has_mult || fmod(v, b.mult) == 0;
}

// ---- the digit automaton ----

typedef struct num_dfa {
  mdl_js_ctx *c;
  int m;      // multipleOf (1: none)
  int *free;  // (owned) ((NUM_DIGITS + 1) * m) the free state (digits left, remainder): rule, DEAD, or -1 not yet
  int empty;  // the rule "" (-1 not yet)
} num_dfa;

static int empty_rule(num_dfa *d) {
  if (d->empty < 0) {
    mdl_grammar_seq s = {0};
    d->empty = mdl_js_rule_of(d->c, &s);
  }
  return d->empty;
}

// The rule of the n-digit strings that continue remainder r, at least lo and at most hi (their remaining n digits;
// NULL: free on that side) and end at remainder 0; DEAD when there is none, -1 on failure.
static int dfa_state(num_dfa *d, const char *lo, const char *hi, int n, int r) {
  if (n == 0) return r == 0 ? empty_rule(d) : DEAD;
  int *memo = !lo && !hi ? &d->free[n * d->m + r] : NULL;
  if (memo && *memo != -1) return *memo;
  int target[10], dlo = lo ? lo[0] - '0' : 0, dhi = hi ? hi[0] - '0' : 9;
  for (int k = dlo; k <= dhi; k++) {
    target[k] = dfa_state(d, lo && k == dlo ? lo + 1 : NULL, hi && k == dhi ? hi + 1 : NULL, n - 1,
                          (int)((10L * r + k) % d->m));
    if (target[k] == -1) return -1;
  }
  int rule = DEAD;
  mdl_grammar_seq s = {0};
  for (int k = dlo; k <= dhi; k++) { // one alternative per distinct next state: the set of digits that lead there
    if (target[k] == DEAD || target[k] == -2) continue;
    uint8_t set[32] = {0};
    int t = target[k];
    for (int j = k; j <= dhi; j++)
      if (target[j] == t) {
        set[('0' + j) >> 3] |= (uint8_t)(1u << (('0' + j) & 7));
        target[j] = -2; // taken
      }
    if (rule == DEAD && (rule = mdl_grammar_rule_new(d->c->b)) < 0) break;
    s.n = 0;
    mdl_grammar_seq_push(&s, (uint32_t)mdl_grammar_set(d->c->b, set));
    mdl_js_ref(&s, t);
    mdl_grammar_alt(d->c->b, rule, &s);
  }
  mdl_grammar_seq_free(&s);
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

// ".D*N": a fraction that ends in a nonzero digit (so k.F lies strictly between k and k + 1), at most 16 digits.
static int fraction_rule(mdl_js_ctx *c) {
  mdl_grammar_seq d = {0}, s = {0};
  mdl_grammar_seq_range(c->b, &d, '0', '9');
  mdl_js_lit(c, &s, ".");
  mdl_js_ref(&s, mdl_grammar_repeat(c->b, &d, NULL, 0, NUM_DIGITS - 1));
  mdl_grammar_seq_range(c->b, &s, '1', '9');
  mdl_grammar_seq_free(&d);
  return mdl_js_rule_of(c, &s);
}

static int compile_bounded(mdl_js_ctx *c, const num_bounds *b, int integer) {
  num_dfa d = {.c = c, .m = 1, .empty = -1};
  int64_t lo = 0, hi = 0;
  if (int_bounds(c, b, &lo, &hi) < 0) return -1;
  if (b->has_mult) {
    if (b->mult != floor(b->mult))
      return UNSUP(c, "'multipleOf' %g is not supported: only a whole number can be enforced exactly (the output "
                   "is then an integer)", b->mult);
    if (b->mult > MULT_MAX) return UNSUP(c, "'multipleOf' over %d is not supported", MULT_MAX);
    d.m = (int)b->mult;
    integer = 1; // a number that is a whole multiple of a whole number: written as an integer
  }
  d.free = malloc((size_t)(NUM_DIGITS + 1) * (size_t)d.m * sizeof *d.free);
  if (!d.free) return INVALID(c, "out of memory");
  for (size_t i = 0; i < (size_t)(NUM_DIGITS + 1) * (size_t)d.m; i++) d.free[i] = -1;
  int rule = mdl_grammar_rule_new(c->b), n = rule < 0 ? -1 : add_ints(&d, rule, lo, hi);
  if (n >= 0 && !integer) { // k.F with [k, k + 1] inside the range, and -k.F with [-(k + 1), -k] inside it
    double l = b->has_lo ? b->lo : -(double)NUM_MAX - 1, h = b->has_hi ? b->hi : (double)NUM_MAX + 1;
    double plo = fmax(0, ceil(l)), phi = fmin((double)NUM_MAX, floor(h) - 1);
    double nlo = fmax(0, ceil(-h)), nhi = fmin((double)NUM_MAX, floor(-l) - 1);
    int frac = (plo <= phi || nlo <= nhi) ? fraction_rule(c) : -1;
    if ((plo <= phi || nlo <= nhi) && frac < 0) n = -1;
    for (int neg = 0; neg < 2 && n >= 0; neg++) {
      double a = neg ? nlo : plo, z = neg ? nhi : phi;
      if (a > z) continue;
      int whole = mdl_grammar_rule_new(c->b), k = whole < 0 ? -1 : add_range(&d, whole, (int64_t)a, (int64_t)z, 0);
      if (k <= 0) {
        n = k < 0 ? -1 : n;
        continue;
      }
      mdl_grammar_seq s = {0};
      if (neg) mdl_js_lit(c, &s, "-");
      mdl_js_ref(&s, whole);
      mdl_js_ref(&s, frac);
      mdl_grammar_alt(c->b, rule, &s);
      mdl_grammar_seq_free(&s);
      n++;
    }
  }
  free(d.free);
  if (n < 0 || mdl_grammar_builder_failed(c->b)) return INVALID(c, "out of memory");
  if (n == 0) {
    if (b->has_mult)
      return INVALID(c, "no integer between the bounds is a multiple of %g: nothing can satisfy it", b->mult);
    int empty = b->has_lo && b->has_hi && (b->lo > b->hi || (b->lo == b->hi && (b->lo_excl || b->hi_excl)));
    if (integer || empty)
      return INVALID(c, "no %s lies between the bounds: nothing can satisfy it", integer ? "integer" : "number");
    return UNSUP(c, "a number range that holds no integer and no whole interval (k, k+1) is not supported");
  }
  return rule;
}

int mdl_js_number_bounded(mdl_js_ctx *c, const cJSON *s, int integer) {
  num_bounds b;
  if (read_bounds(c, s, &b) < 0) return -1;
  if (!b.has_lo && !b.has_hi && !b.has_mult) return mdl_js_number(c, integer);
  return compile_bounded(c, &b, integer);
}
