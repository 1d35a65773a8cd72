// models/json_lit.c: numbers that keep their literal text through a cJSON tree (models/json_lit.h).
#include "models/json_lit.h"

#include <stdlib.h>
#include <string.h>

#include "util/json.h"

typedef struct lit_cursor {
  const char *p, *end; // (borrowed) the text not yet searched for the next number literal
} lit_cursor;

// The next number literal at or after cur->p, outside strings; its length in *n. NULL when none is left.
static const char *next_number(lit_cursor *cur, size_t *n) {
  const char *p = cur->p;
  while (p < cur->end) {
    if (*p == '"') { // skip the string, its escapes too
      for (p++; p < cur->end && *p != '"'; p++)
        if (*p == '\\') p++;
      p++;
    } else if ((*n = utl_json_number_len(p, (size_t)(cur->end - p)))) {
      cur->p = p + *n;
      return p;
    } else {
      p++;
    }
  }
  cur->p = cur->end;
  return NULL;
}

// Gives the number nodes under v, in document order (the order cJSON built them in), the literals in turn.
static int attach(cJSON *v, lit_cursor *cur) {
  for (; v; v = v->next) {
    if (cJSON_IsNumber(v)) {
      size_t n = 0;
      const char *lit = next_number(cur, &n);
      if (!lit || !(v->valuestring = malloc(n + 1))) return -1;
      memcpy(v->valuestring, lit, n);
      v->valuestring[n] = 0;
    } else if ((cJSON_IsObject(v) || cJSON_IsArray(v)) && attach(v->child, cur) < 0) {
      return -1;
    }
  }
  return 0;
}

cJSON *mdl_json_parse(const char *text, size_t len, const char **end) {
  const char *stop = NULL;
  cJSON *root = cJSON_ParseWithLengthOpts(text, len, &stop, 0);
  if (end) *end = stop;
  if (!root) return NULL;
  lit_cursor cur = {text, stop && stop >= text && stop <= text + len ? stop : text + len};
  cJSON *next = root->next; // attach walks siblings: the root has none
  root->next = NULL;
  if (attach(root, &cur) < 0) {
    cJSON_Delete(root);
    if (end) *end = NULL;
    return NULL;
  }
  root->next = next;
  return root;
}

const char *mdl_json_num_text(const cJSON *v) { return cJSON_IsNumber(v) ? v->valuestring : NULL; }

// Numbers that carry their literal become raw nodes, which cJSON prints verbatim.
static void to_raw(cJSON *v) {
  for (; v; v = v->next) {
    if (cJSON_IsNumber(v) && v->valuestring) v->type = cJSON_Raw | (v->type & cJSON_StringIsConst);
    else if (cJSON_IsObject(v) || cJSON_IsArray(v)) to_raw(v->child);
  }
}

char *mdl_json_print(const cJSON *v) {
  cJSON *d = cJSON_Duplicate(v, 1);
  if (!d) return NULL;
  to_raw(d);
  char *s = cJSON_PrintUnformatted(d);
  cJSON_Delete(d);
  return s;
}
