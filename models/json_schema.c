// models/json_schema.c: JSON Schema (the subset in docs/openai.md) to a byte grammar of the JSON texts it accepts.
//
// The grammar generates a subset of the valid texts, never an invalid one: properties come in schema order (every
// required one; optional ones may be left out) and no others, whitespace is bounded (models/json_rules.c), numbers
// have at most 16 integer digits, enum and const values are written as the schema wrote them (a number's literal
// kept exactly: models/json_lit.h). So what a small
// model can write is narrower than what the schema allows, and always valid.
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/json_lit.h"
#include "models/json_schema_int.h"
#include "util/json.h"
#include "util/vec.h"

#define MAX_DEPTH 64         // subschemas inside subschemas
#define MAX_LEN_EXPAND 4096  // a larger maxLength is generated as this (shorter strings are still valid)
#define MAX_ITEMS_EXPAND 1024

#define INVALID(c, ...) mdl_js_fail(c, -1, __VA_ARGS__)
#define UNSUP(c, ...) mdl_js_fail(c, MDL_GRAMMAR_UNSUPPORTED, __VA_ARGS__)

// Keywords that constrain and are compiled; annotations that constrain nothing and are ignored. Anything else is
// refused, named.
static const char *const KNOWN[] = {"type", "properties", "required", "additionalProperties", "enum", "const", "items",
                                    "minItems", "maxItems", "anyOf", "oneOf", "allOf", "$ref", "format", "pattern",
                                    "minLength", "maxLength", "$defs", "definitions", NULL};
static const char *const ANNOTATIONS[] = {"title", "description", "default", "examples", "$schema", "$id",
                                          "$comment", "deprecated", "readOnly", "writeOnly", "$anchor", NULL};

static int in_list(const char *const *l, const char *s) {
  for (; *l; l++)
    if (!strcmp(*l, s)) return 1;
  return 0;
}

static size_t path_push(mdl_js_ctx *c, const char *a, const char *b) {
  size_t n = strlen(c->path);
  snprintf(c->path + n, sizeof c->path - n, "/%s%s%s", a, b ? "/" : "", b ? b : "");
  return n;
}
static void path_pop(mdl_js_ctx *c, size_t n) { c->path[n] = 0; }

static int compile(mdl_js_ctx *c, const cJSON *s);

// A non-negative integer keyword into *out; 0 when absent, 1 when read, -1 on error.
static int get_count(mdl_js_ctx *c, const cJSON *s, const char *k, long *out) {
  const cJSON *v = cJSON_GetObjectItemCaseSensitive(s, k);
  if (!v) return 0;
  if (!cJSON_IsNumber(v) || v->valuedouble < 0 || v->valuedouble != floor(v->valuedouble) || v->valuedouble > 1e9)
    return INVALID(c, "'%s' must be a non-negative integer", k);
  *out = (long)v->valuedouble;
  return 1;
}

// The constraining keywords of s other than those in allowed (NULL-terminated); the first one, or NULL.
static const char *other_keyword(const cJSON *s, const char *const *allowed) {
  for (const cJSON *k = s->child; k; k = k->next)
    if (!in_list(ANNOTATIONS, k->string) && !in_list(allowed, k->string) && strcmp(k->string, "$defs") &&
        strcmp(k->string, "definitions"))
      return k->string;
  return NULL;
}

// ---- $ref ----

// A local reference: "#" or a JSON pointer "#/a/b" (~0 and ~1 unescaped) into the root schema.
static const cJSON *resolve(mdl_js_ctx *c, const char *ref) {
  if (ref[0] != '#' || (ref[1] && ref[1] != '/')) {
    UNSUP(c, "'$ref' \"%.80s\": only local references (\"#\", \"#/$defs/...\") are supported", ref);
    return NULL;
  }
  const cJSON *at = c->root;
  const char *p = ref + 1;
  char tok[256];
  while (*p == '/') {
    p++;
    size_t n = 0;
    for (; *p && *p != '/'; p++) {
      char ch = *p;
      if (ch == '~' && (p[1] == '0' || p[1] == '1')) ch = *++p == '0' ? '~' : '/';
      if (n + 1 < sizeof tok) tok[n++] = ch;
    }
    tok[n] = 0;
    if (cJSON_IsObject(at)) at = cJSON_GetObjectItemCaseSensitive(at, tok);
    else if (cJSON_IsArray(at)) {
      char *end;
      long i = strtol(tok, &end, 10);
      at = *end || !n ? NULL : cJSON_GetArrayItem(at, (int)i);
    } else
      at = NULL;
    if (!at) {
      INVALID(c, "'$ref' \"%.80s\" points at nothing", ref);
      return NULL;
    }
  }
  return at;
}

// The rule for a $ref's target, compiled once: the rule is registered before its body is compiled, so a recursive
// schema refers to itself.
static int compile_ref(mdl_js_ctx *c, const cJSON *s, const cJSON *r) {
  const char *const allowed[] = {"$ref", NULL};
  const char *other = other_keyword(s, allowed);
  if (other) return UNSUP(c, "'$ref' together with '%s' is not supported", other);
  if (!cJSON_IsString(r)) return INVALID(c, "'$ref' must be a string");
  const cJSON *t = resolve(c, r->valuestring);
  if (!t) return -1;
  for (int i = 0; i < c->n_refs; i++)
    if (c->refs[i].node == t) return c->refs[i].rule;
  if (utl_vec_reserve((void **)&c->refs, &c->cap_refs, c->n_refs + 1, sizeof *c->refs))
    return INVALID(c, "out of memory");
  int rule = mdl_grammar_rule_new(c->b);
  c->refs[c->n_refs++] = (mdl_js_target){t, rule};
  char saved[sizeof c->path];
  memcpy(saved, c->path, sizeof saved);
  snprintf(c->path, sizeof c->path, "%s", r->valuestring);
  int body = compile(c, t);
  memcpy(c->path, saved, sizeof saved);
  if (body < 0) return -1;
  mdl_grammar_seq q = {0};
  mdl_js_ref(&q, body);
  mdl_grammar_alt(c->b, rule, &q);
  mdl_grammar_seq_free(&q);
  return rule;
}

// ---- types ----

enum { T_OBJECT = 1, T_ARRAY = 2, T_STRING = 4, T_NUMBER = 8, T_INTEGER = 16, T_BOOLEAN = 32, T_NULL = 64 };
static const char *const TYPE_NAMES[] = {"object", "array", "string", "number", "integer", "boolean", "null", NULL};

// The type keyword as a bit set; 0 when absent, -1 on error.
static int get_types(mdl_js_ctx *c, const cJSON *s) {
  const cJSON *t = cJSON_GetObjectItemCaseSensitive(s, "type");
  if (!t) return 0;
  int mask = 0;
  const cJSON *it = cJSON_IsArray(t) ? t->child : t;
  if (cJSON_IsArray(t) && !it) return INVALID(c, "'type' must not be an empty list");
  for (; it; it = cJSON_IsArray(t) ? it->next : NULL) {
    int bit = 0;
    for (int i = 0; cJSON_IsString(it) && TYPE_NAMES[i]; i++)
      if (!strcmp(it->valuestring, TYPE_NAMES[i])) bit = 1 << i;
    if (!bit) return INVALID(c, "'type' must be one of object, array, string, number, integer, boolean, null");
    mask |= bit;
  }
  return mask;
}

// Whether JSON value v has one of the types in mask (0: any); -1 with the error recorded.
static int type_ok(mdl_js_ctx *c, const cJSON *v, int mask) {
  if (!mask) return 1;
  if (cJSON_IsObject(v)) return mask & T_OBJECT;
  if (cJSON_IsArray(v)) return mask & T_ARRAY;
  if (cJSON_IsString(v)) return mask & T_STRING;
  if (cJSON_IsBool(v)) return mask & T_BOOLEAN;
  if (cJSON_IsNull(v)) return mask & T_NULL;
  if (cJSON_IsNumber(v)) return (mask & T_NUMBER) ? 1 : (mask & T_INTEGER) ? mdl_js_num_is_int(c, v) : 0;
  return 0;
}

// enum / const: the values (of the allowed types; numbers within s's bounds) written as the schema wrote them.
static int compile_enum(mdl_js_ctx *c, const cJSON *s, const cJSON *values, int single, int types) {
  int r = mdl_grammar_rule_new(c->b), n = 0;
  for (const cJSON *v = single ? values : values->child; v; v = single ? NULL : v->next) {
    int ok = type_ok(c, v, types);
    if (ok > 0 && cJSON_IsNumber(v)) ok = mdl_js_num_in_bounds(c, s, v);
    if (ok < 0) return -1;
    if (!ok) continue;
    char *text = mdl_json_print(v);
    if (!text) return INVALID(c, "out of memory");
    mdl_grammar_seq s = {0};
    mdl_js_lit(c, &s, text);
    mdl_grammar_alt(c->b, r, &s);
    mdl_grammar_seq_free(&s);
    free(text);
    n++;
  }
  if (!n) return INVALID(c, "no value of '%s' has the schema's type: nothing can satisfy it", single ? "const" : "enum");
  return r;
}

// A property list in schema order; required ones must appear, optional ones may be left out, no others.
//   F_i: properties i.. when none was written yet (at least one must be): KV_i R_(i+1) | F_(i+1) (i optional)
//   R_i: properties i.. after one was written: ws "," ws KV_i R_(i+1) | R_(i+1) (i optional); R_n: ""
// The value of a required property that 'properties' does not list: what additionalProperties allows (any value when
// it is absent or true). -1 with the error when it is false: no object can satisfy the schema.
static int required_value(mdl_js_ctx *c, const cJSON *add, const char *name) {
  if (cJSON_IsFalse(add))
    return INVALID(c, "'required' names '%.60s', which 'properties' does not list and 'additionalProperties': false "
                   "forbids: nothing can satisfy it", name);
  if (!cJSON_IsObject(add)) return mdl_js_any(c);
  size_t at = path_push(c, "additionalProperties", NULL);
  int v = compile(c, add);
  path_pop(c, at);
  return v;
}

static int compile_props(mdl_js_ctx *c, const cJSON *props, const cJSON *req, const cJSON *add, int *any_required) {
  int n = 0;
  for (const cJSON *p = props ? props->child : NULL; p; p = p->next) n++;
  for (const cJSON *q = req ? req->child : NULL; q; q = q->next)
    if (!cJSON_GetObjectItemCaseSensitive(props, q->valuestring)) n++; // required without a schema of its own
  int *kv = malloc(((size_t)n + 1) * sizeof *kv), *opt = malloc(((size_t)n + 1) * sizeof *opt), i = 0, rc = -1;
  if (!kv || !opt) {
    free(kv);
    free(opt);
    return INVALID(c, "out of memory");
  }
  int ws = mdl_js_ws(c);
  *any_required = 0;
  for (int pass = 0; pass < 2; pass++) {
    const cJSON *p = pass == 0 ? (props ? props->child : NULL) : (req ? req->child : NULL);
    for (; p; p = p->next) {
      const char *name = pass == 0 ? p->string : p->valuestring;
      if (pass == 1 && cJSON_GetObjectItemCaseSensitive(props, name)) continue;
      int required = 0;
      for (const cJSON *q = req ? req->child : NULL; q && !required; q = q->next) required = !strcmp(q->valuestring, name);
      size_t at = path_push(c, pass == 0 ? "properties" : "required", name);
      int v = pass == 0 ? compile(c, p) : required_value(c, add, name);
      path_pop(c, at);
      if (v < 0) goto done;
      cJSON *key = cJSON_CreateString(name);
      char *ktext = key ? cJSON_PrintUnformatted(key) : NULL;
      cJSON_Delete(key);
      if (!ktext) {
        INVALID(c, "out of memory");
        goto done;
      }
      mdl_grammar_seq s = {0};
      mdl_js_lit(c, &s, ktext);
      free(ktext);
      mdl_js_ref(&s, ws);
      mdl_js_lit(c, &s, ":");
      mdl_js_ref(&s, ws);
      mdl_js_ref(&s, v);
      kv[i] = mdl_js_rule_of(c, &s);
      opt[i++] = !required;
      *any_required |= required;
    }
  }
  int f_next = mdl_grammar_rule_new(c->b), r_next = mdl_grammar_rule_new(c->b); // F_n: no alternative; R_n: ""
  mdl_grammar_seq s = {0};
  mdl_grammar_alt(c->b, r_next, &s);
  for (int k = n - 1; k >= 0; k--) {
    int f = mdl_grammar_rule_new(c->b), r = mdl_grammar_rule_new(c->b);
    s.n = 0;
    mdl_js_ref(&s, kv[k]);
    mdl_js_ref(&s, r_next);
    mdl_grammar_alt(c->b, f, &s);
    s.n = 0;
    mdl_js_ref(&s, ws);
    mdl_js_lit(c, &s, ",");
    mdl_js_ref(&s, ws);
    mdl_js_ref(&s, kv[k]);
    mdl_js_ref(&s, r_next);
    mdl_grammar_alt(c->b, r, &s);
    if (opt[k]) {
      s.n = 0;
      mdl_js_ref(&s, f_next);
      mdl_grammar_alt(c->b, f, &s);
      s.n = 0;
      mdl_js_ref(&s, r_next);
      mdl_grammar_alt(c->b, r, &s);
    }
    f_next = f;
    r_next = r;
  }
  mdl_grammar_seq_free(&s);
  rc = f_next;
done:
  free(kv);
  free(opt);
  return rc;
}

static int compile_object(mdl_js_ctx *c, const cJSON *s) {
  const cJSON *props = cJSON_GetObjectItemCaseSensitive(s, "properties");
  const cJSON *req = cJSON_GetObjectItemCaseSensitive(s, "required");
  const cJSON *add = cJSON_GetObjectItemCaseSensitive(s, "additionalProperties");
  if (props && !cJSON_IsObject(props)) return INVALID(c, "'properties' must be an object");
  if (req && !cJSON_IsArray(req)) return INVALID(c, "'required' must be a list of property names");
  for (const cJSON *q = req ? req->child : NULL; q; q = q->next) {
    if (!cJSON_IsString(q)) return INVALID(c, "'required' must be a list of property names");
    for (const cJSON *o = req->child; o != q; o = o->next)
      if (!strcmp(o->valuestring, q->valuestring)) return INVALID(c, "'required' names '%.60s' twice", q->valuestring);
  }
  if (add && !cJSON_IsBool(add) && !cJSON_IsObject(add))
    return INVALID(c, "'additionalProperties' must be a boolean or a schema");
  if ((props && props->child) || (req && req->child)) {
    // Properties beyond the listed ones are never written: leaving them out is valid whatever
    // additionalProperties says.
    int any_required = 0, body = compile_props(c, props, req, add, &any_required), ws = mdl_js_ws(c);
    if (body < 0) return -1;
    int r = mdl_grammar_rule_new(c->b);
    mdl_grammar_seq q = {0};
    if (!any_required) {
      mdl_js_lit(c, &q, "{");
      mdl_js_ref(&q, ws);
      mdl_js_lit(c, &q, "}");
      mdl_grammar_alt(c->b, r, &q);
      q.n = 0;
    }
    mdl_js_lit(c, &q, "{");
    mdl_js_ref(&q, ws);
    mdl_js_ref(&q, body);
    mdl_js_ref(&q, ws);
    mdl_js_lit(c, &q, "}");
    mdl_grammar_alt(c->b, r, &q);
    mdl_grammar_seq_free(&q);
    return r;
  }
  if (cJSON_IsFalse(add)) return mdl_js_literal(c, "{}");
  if (!add || cJSON_IsTrue(add)) {
    mdl_js_any(c);
    return c->any_obj;
  }
  size_t at = path_push(c, "additionalProperties", NULL);
  int v = compile(c, add);
  path_pop(c, at);
  return v < 0 ? -1 : mdl_js_map(c, v);
}

static int compile_array(mdl_js_ctx *c, const cJSON *s) {
  const cJSON *items = cJSON_GetObjectItemCaseSensitive(s, "items");
  long min = 0, max = -1;
  if (get_count(c, s, "minItems", &min) < 0 || get_count(c, s, "maxItems", &max) < 0) return -1;
  if (max >= 0 && max < min) return INVALID(c, "'maxItems' is below 'minItems': nothing can satisfy it");
  if (cJSON_IsArray(items)) return UNSUP(c, "'items' as a list (tuples) is not supported");
  if (items && !cJSON_IsBool(items) && !cJSON_IsObject(items)) return INVALID(c, "'items' must be a schema");
  if (cJSON_IsFalse(items)) {
    if (min > 0) return INVALID(c, "'items': false with 'minItems' > 0: nothing can satisfy it");
    max = 0;
  }
  if (min > MAX_ITEMS_EXPAND) return UNSUP(c, "'minItems' over %d is not supported", MAX_ITEMS_EXPAND);
  if (max > MAX_ITEMS_EXPAND) max = MAX_ITEMS_EXPAND;
  int item;
  if (!items || cJSON_IsBool(items)) item = mdl_js_any(c);
  else {
    size_t at = path_push(c, "items", NULL);
    item = compile(c, items);
    path_pop(c, at);
    if (item < 0) return -1;
  }
  return mdl_js_list(c, item, (int)min, (int)max);
}

// Formats as regular expressions (documented approximations: the shape, not every calendar rule).
static const char *format_regex(const char *f) {
#define DATE "\\d{4}-(0[1-9]|1[0-2])-(0[1-9]|[12]\\d|3[01])"
#define TIME "([01]\\d|2[0-3]):[0-5]\\d:([0-5]\\d|60)(\\.\\d{1,9})?([Zz]|[+-]([01]\\d|2[0-3]):[0-5]\\d)"
  if (!strcmp(f, "date")) return "^" DATE "$";
  if (!strcmp(f, "time")) return "^" TIME "$";
  if (!strcmp(f, "date-time")) return "^" DATE "[Tt]" TIME "$";
  if (!strcmp(f, "uuid")) return "^[0-9a-fA-F]{8}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{4}-[0-9a-fA-F]{12}$";
  // at most 4 labels before the top-level domain (mail.cs.example.co.uk has 4): the whole address stays under RFC
  // 5321's 254 bytes, so a model looping inside a label is forced to finish within a bounded length
  if (!strcmp(f, "email")) return "^[A-Za-z0-9._%+-]{1,64}@([A-Za-z0-9-]{1,38}\\.){1,4}[A-Za-z]{2,24}$";
  return NULL;
#undef DATE
#undef TIME
}

static int compile_string(mdl_js_ctx *c, const cJSON *s) {
  const cJSON *fmt = cJSON_GetObjectItemCaseSensitive(s, "format");
  const cJSON *pat = cJSON_GetObjectItemCaseSensitive(s, "pattern");
  long min = 0, max = -1;
  int hmin, hmax;
  if ((hmin = get_count(c, s, "minLength", &min)) < 0 || (hmax = get_count(c, s, "maxLength", &max)) < 0) return -1;
  if (max >= 0 && max < min) return INVALID(c, "'maxLength' is below 'minLength': nothing can satisfy it");
  if (fmt && !cJSON_IsString(fmt)) return INVALID(c, "'format' must be a string");
  if (pat && !cJSON_IsString(pat)) return INVALID(c, "'pattern' must be a string");
  if (fmt && pat) return UNSUP(c, "'format' together with 'pattern' is not supported");
  if ((fmt || pat) && (hmin || hmax))
    return UNSUP(c, "'%s' together with '%s' is not supported", hmin ? "minLength" : "maxLength", fmt ? "format" : "pattern");
  mdl_grammar_seq q = {0};
  mdl_js_lit(c, &q, "\"");
  if (fmt || pat) {
    const char *re = pat ? pat->valuestring : format_regex(fmt->valuestring);
    if (!re) {
      mdl_grammar_seq_free(&q);
      return UNSUP(c, "'format' \"%.40s\" is not supported (date, time, date-time, uuid, email)", fmt->valuestring);
    }
    if (mdl_js_regex(c, re, pat ? "pattern" : "format", &q)) {
      mdl_grammar_seq_free(&q);
      return -1;
    }
  } else if (hmin || hmax) {
    if (min > MAX_LEN_EXPAND) {
      mdl_grammar_seq_free(&q);
      return UNSUP(c, "'minLength' over %d is not supported", MAX_LEN_EXPAND);
    }
    if (max > MAX_LEN_EXPAND) max = MAX_LEN_EXPAND;
    mdl_grammar_seq ch = {0};
    mdl_js_ref(&ch, mdl_js_chr(c));
    mdl_js_ref(&q, mdl_grammar_repeat(c->b, &ch, NULL, (int)min, (int)max));
    mdl_grammar_seq_free(&ch);
  } else {
    mdl_grammar_seq_free(&q);
    return mdl_js_string(c);
  }
  mdl_js_lit(c, &q, "\"");
  return mdl_js_rule_of(c, &q);
}

static int compile_type(mdl_js_ctx *c, const cJSON *s, int type) {
  switch (type) {
  case T_OBJECT: return compile_object(c, s);
  case T_ARRAY: return compile_array(c, s);
  case T_STRING: return compile_string(c, s);
  case T_NUMBER: return mdl_js_number_bounded(c, s, 0);
  case T_INTEGER: return mdl_js_number_bounded(c, s, 1);
  case T_BOOLEAN: {
    int r = mdl_grammar_rule_new(c->b);
    mdl_grammar_seq q = {0};
    mdl_js_lit(c, &q, "true");
    mdl_grammar_alt(c->b, r, &q);
    q.n = 0;
    mdl_js_lit(c, &q, "false");
    mdl_grammar_alt(c->b, r, &q);
    mdl_grammar_seq_free(&q);
    return r;
  }
  default: return mdl_js_literal(c, "null");
  }
}

// anyOf / oneOf: one alternative per subschema. oneOf is generated as anyOf: a text matching two branches would
// break it, which disjoint branches (the usual use) never do.
static int compile_any_of(mdl_js_ctx *c, const cJSON *s, const char *k, const cJSON *list) {
  const char *const allowed[] = {k, NULL};
  const char *other = other_keyword(s, allowed);
  if (other) return UNSUP(c, "'%s' together with '%s' is not supported", k, other);
  if (!cJSON_IsArray(list) || !list->child) return INVALID(c, "'%s' must be a non-empty list of schemas", k);
  int r = mdl_grammar_rule_new(c->b), i = 0;
  for (const cJSON *b = list->child; b; b = b->next, i++) {
    char idx[16];
    snprintf(idx, sizeof idx, "%d", i);
    size_t at = path_push(c, k, idx);
    int v = compile(c, b);
    path_pop(c, at);
    if (v < 0) return -1;
    mdl_grammar_seq q = {0};
    mdl_js_ref(&q, v);
    mdl_grammar_alt(c->b, r, &q);
    mdl_grammar_seq_free(&q);
  }
  return r;
}

static int compile(mdl_js_ctx *c, const cJSON *s) {
  if (c->status) return -1;
  if (cJSON_IsTrue(s)) return mdl_js_any(c);
  if (cJSON_IsFalse(s)) return INVALID(c, "the schema false: nothing can satisfy it");
  if (!cJSON_IsObject(s)) return INVALID(c, "a schema must be an object or a boolean");
  if (c->depth >= MAX_DEPTH) return UNSUP(c, "schemas nested deeper than %d are not supported", MAX_DEPTH);
  for (const cJSON *k = s->child; k; k = k->next)
    if (!in_list(KNOWN, k->string) && !in_list(ANNOTATIONS, k->string) && !mdl_js_is_num_keyword(k->string))
      return UNSUP(c, "unsupported keyword '%.60s'", k->string);
  c->depth++;
  int r = -1, types = get_types(c, s);
  const cJSON *v;
  if (types < 0) goto done;
  if ((v = cJSON_GetObjectItemCaseSensitive(s, "$ref"))) r = compile_ref(c, s, v);
  else if ((v = cJSON_GetObjectItemCaseSensitive(s, "anyOf"))) r = compile_any_of(c, s, "anyOf", v);
  else if ((v = cJSON_GetObjectItemCaseSensitive(s, "oneOf"))) r = compile_any_of(c, s, "oneOf", v);
  else if ((v = cJSON_GetObjectItemCaseSensitive(s, "allOf"))) {
    const char *const allowed[] = {"allOf", NULL};
    const char *other = other_keyword(s, allowed);
    if (other) r = UNSUP(c, "'allOf' together with '%s' is not supported", other);
    else if (!cJSON_IsArray(v) || cJSON_GetArraySize(v) != 1)
      r = UNSUP(c, "'allOf' is supported only with one schema");
    else {
      size_t at = path_push(c, "allOf", "0");
      r = compile(c, v->child);
      path_pop(c, at);
    }
  } else if ((v = cJSON_GetObjectItemCaseSensitive(s, "const"))) r = compile_enum(c, s, v, 1, types);
  else if ((v = cJSON_GetObjectItemCaseSensitive(s, "enum"))) {
    if (!cJSON_IsArray(v) || !v->child) r = INVALID(c, "'enum' must be a non-empty list");
    else r = compile_enum(c, s, v, 0, types);
  } else {
    if (!types) { // the type the keywords imply; none: any value
      static const char *const obj[] = {"properties", "required", "additionalProperties", NULL};
      static const char *const arr[] = {"items", "minItems", "maxItems", NULL};
      static const char *const str[] = {"minLength", "maxLength", "pattern", "format", NULL};
      for (const cJSON *k = s->child; k; k = k->next)
        types |= in_list(obj, k->string)   ? T_OBJECT
                 : in_list(arr, k->string) ? T_ARRAY
                 : in_list(str, k->string) ? T_STRING
                 : mdl_js_is_num_keyword(k->string) ? T_NUMBER
                                                    : 0;
      if (!types) {
        r = mdl_js_any(c);
        goto done;
      }
    }
    if (types & T_NUMBER) types &= ~T_INTEGER; // every integer is a number
    int n = 0, one = -1;
    for (int t = 1; t <= T_NULL; t <<= 1) n += (types & t) != 0;
    if (n == 1) {
      for (int t = 1; t <= T_NULL; t <<= 1)
        if (types & t) one = compile_type(c, s, t);
      r = one;
    } else {
      r = mdl_grammar_rule_new(c->b);
      for (int t = 1; t <= T_NULL && r >= 0; t <<= 1) {
        if (!(types & t)) continue;
        int x = compile_type(c, s, t);
        if (x < 0) r = -1;
        mdl_grammar_seq q = {0};
        mdl_js_ref(&q, x);
        if (r >= 0) mdl_grammar_alt(c->b, r, &q);
        mdl_grammar_seq_free(&q);
      }
    }
  }
done:
  c->depth--;
  return c->status ? -1 : r;
}

// Freezes the grammar built from rule top (-1: the building ran out of memory) into *out. 0, or -1 with err saying
// that the schema or the tools (what) cannot be used and why (mdl_grammar_finish reports a builder that failed).
static int finish(mdl_js_ctx *c, int top, const char *what, mdl_grammar **out, char *err, size_t errlen) {
  char e2[256];
  if (top < 0 || mdl_grammar_finish(c->b, top, out, e2, sizeof e2)) {
    snprintf(err, errlen, "the %s cannot be used: %s", what, top < 0 ? "out of memory" : e2);
    return -1;
  }
  return 0;
}

// The schema or tools text (what) parsed with its numbers' literals kept (models/json_lit.h), after the one JSON
// pre-pass (util/json.h): a duplicate key, a lone surrogate or a malformed number is refused, named, never parsed
// into something else. NULL with err set.
static cJSON *parse_text(const char *text, size_t len, const char *what, char *err, size_t errlen) {
  utl_json_issue is;
  int rc = utl_json_check(text, len, CJSON_NESTING_LIMIT, &is);
  if (rc < 0) {
    snprintf(err, errlen, "out of memory");
    return NULL;
  }
  if (rc > 0) {
    snprintf(err, errlen, "the %s is not valid JSON: %s at byte %zu%s%.100s", what, utl_json_problem_name(is.what),
             is.at, is.path[0] ? ", at " : "", is.path);
    return NULL;
  }
  cJSON *root = mdl_json_parse(text, len, NULL);
  if (!root) snprintf(err, errlen, "the %s is not valid JSON", what);
  return root;
}

int mdl_grammar_from_json_schema(const char *schema, size_t len, mdl_grammar **out, char *err, size_t errlen) {
  *out = NULL;
  cJSON *root = NULL;
  if (schema && !(root = parse_text(schema, len, "schema", err, errlen))) return -1;
  mdl_js_ctx c = {.root = root, .err = err, .errlen = errlen, .ws = -1, .chr = -1, .chars = -1, .string = -1,
                  .number = -1, .integer = -1, .any = -1, .any_obj = -1};
  snprintf(c.path, sizeof c.path, "#");
  c.b = mdl_grammar_builder_new();
  int rc = -1;
  if (!c.b) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  int top;
  if (root) top = compile(&c, root);
  else {
    mdl_js_any(&c);
    top = c.any_obj;
  }
  if (c.status) {
    rc = c.status;
    goto done;
  }
  rc = finish(&c, top, "schema", out, err, errlen);
done:
  mdl_grammar_builder_free(c.b);
  free(c.refs);
  cJSON_Delete(root);
  return rc;
}

// ---- tool calls ----

// One tool's call: {"name": NAME, "ARGS_KEY": ARGS} as models/chat.c writes it. The rule, or -1 with the error set.
static int tool_call_rule(mdl_js_ctx *c, const cJSON *tool, int i, const char *args_key) {
  const cJSON *name = cJSON_GetObjectItemCaseSensitive(tool, "name");
  const cJSON *params = cJSON_GetObjectItemCaseSensitive(tool, "parameters");
  if (!cJSON_IsObject(tool) || !cJSON_IsString(name) || !name->valuestring[0])
    return INVALID(c, "tools[%d] must be an object with a non-empty string 'name'", i);
  char *lit = cJSON_PrintUnformatted(name);
  if (!lit) return mdl_js_fail(c, -1, "out of memory");
  c->root = params;
  snprintf(c->path, sizeof c->path, "#");
  int args;
  if (params && !cJSON_IsNull(params)) args = compile(c, params);
  else {
    mdl_js_any(c);
    args = c->any_obj;
  }
  mdl_grammar_seq q = {0};
  mdl_js_lit(c, &q, "{\"name\": ");
  mdl_js_lit(c, &q, lit);
  char key[80];
  snprintf(key, sizeof key, ", \"%.64s\": ", args_key ? args_key : "arguments");
  mdl_js_lit(c, &q, key);
  mdl_js_ref(&q, args);
  mdl_js_lit(c, &q, "}");
  free(lit);
  if (c->status || args < 0) {
    mdl_grammar_seq_free(&q);
    if (c->status) { // say which tool: the compiler's message names the keyword and its place in the schema
      char m[400];
      snprintf(m, sizeof m, "%s", c->err);
      snprintf(c->err, c->errlen, "tool '%.64s' parameters: %s", name->valuestring, m);
    }
    return -1;
  }
  return mdl_js_rule_of(c, &q);
}

int mdl_grammar_from_tool_calls(const char *tools, size_t len, const char *open, const char *close, const char *sep,
                                const char *args_key, int parallel, mdl_grammar **out, char *err, size_t errlen) {
  *out = NULL;
  if (!tools || !open || !close || (parallel && !sep)) {
    snprintf(err, errlen, "tool calls need tools and the call markup");
    return -1;
  }
  cJSON *arr = parse_text(tools, len, "tools", err, errlen);
  if (!arr) return -1;
  if (!cJSON_IsArray(arr) || !arr->child) {
    cJSON_Delete(arr);
    snprintf(err, errlen, "tools must be a non-empty JSON array");
    return -1;
  }
  mdl_js_ctx c = {.err = err, .errlen = errlen, .ws = -1, .chr = -1, .chars = -1, .string = -1, .number = -1,
                  .integer = -1, .any = -1, .any_obj = -1};
  c.b = mdl_grammar_builder_new();
  int rc = -1;
  if (!c.b) {
    snprintf(err, errlen, "out of memory");
    goto done;
  }
  int call = mdl_grammar_rule_new(c.b), i = 0; // any one of the tools' calls
  const cJSON *t;
  cJSON_ArrayForEach(t, arr) {
    int r = tool_call_rule(&c, t, i++, args_key);
    if (r < 0 || call < 0) {
      if (!c.status) snprintf(err, errlen, "out of memory");
      rc = c.status ? c.status : -1;
      goto done;
    }
    mdl_grammar_seq q = {0};
    mdl_js_ref(&q, r);
    mdl_grammar_alt(c.b, call, &q);
    mdl_grammar_seq_free(&q);
  }
  mdl_grammar_seq item = {0}, gap = {0};
  mdl_js_lit(&c, &item, open);
  mdl_js_ref(&item, call);
  mdl_js_lit(&c, &item, close);
  int top;
  if (parallel) {
    mdl_js_lit(&c, &gap, sep);
    top = mdl_grammar_repeat(c.b, &item, &gap, 1, -1);
    mdl_grammar_seq_free(&item);
  } else {
    top = mdl_js_rule_of(&c, &item);
  }
  mdl_grammar_seq_free(&gap);
  rc = finish(&c, top, "tools", out, err, errlen);
done:
  mdl_grammar_builder_free(c.b);
  free(c.refs);
  cJSON_Delete(arr);
  return rc;
}
