// models/chat.c: ChatML rendering, with the default system prompt read from the model's own chat template.
#include "models/chat.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

static void seterr(char *err, size_t errlen, const char *fmt, ...) {
  if (!err || errlen == 0) return;
  va_list ap;
  va_start(ap, fmt);
  vsnprintf(err, errlen, fmt, ap);
  va_end(ap);
}

static const char *find_in(const char *p, size_t n, const char *needle) {
  return memmem(p, n, needle, strlen(needle));
}

// Default system prompt of a ChatML template: the text of a literal "<|im_start|>system\n...<|im_end|>" block that the
// template emits when messages[0] is not a system message. *def is NULL when the template has none.
static int template_default_system(const mdl_gguf *g, char **def, char *err, size_t errlen) {
  *def = NULL;
  mdl_str tpl;
  if (!g || mdl_gguf_get_str(g, "tokenizer.chat_template", &tpl) != 0) {
    *def = strdup(SMOLLM2_SYSTEM); // no template: SmolLM2's is assumed
    if (!*def) goto oom;
    return 0;
  }
  size_t n = (size_t)tpl.n;
  if (!find_in(tpl.p, n, "<|im_start|>") || !find_in(tpl.p, n, "<|im_end|>")) {
    seterr(err, errlen, "the model's chat template is not ChatML (only ChatML is supported)");
    return -1;
  }
  if (!find_in(tpl.p, n, "!= 'system'") && !find_in(tpl.p, n, "!= \"system\"")) return 0;
  const char *open = "<|im_start|>system";
  const char *s = find_in(tpl.p, n, open);
  if (!s) return 0;
  s += strlen(open);
  size_t rest = n - (size_t)(s - tpl.p);
  if (rest >= 1 && *s == '\n') s++, rest--;
  else if (rest >= 2 && s[0] == '\\' && s[1] == 'n') s += 2, rest -= 2;
  else return 0;
  const char *e = find_in(s, rest, "<|im_end|>");
  if (!e) return 0;
  size_t len = (size_t)(e - s);
  if (memchr(s, '\'', len) || memchr(s, '"', len) || find_in(s, len, "{{") || find_in(s, len, "{%")) return 0; // not literal
  *def = malloc(len + 1);
  if (!*def) goto oom;
  // unescape \n as jinja would in a string literal
  size_t o = 0;
  for (size_t i = 0; i < len; i++) {
    if (s[i] == '\\' && i + 1 < len && s[i + 1] == 'n') {
      (*def)[o++] = '\n';
      i++;
    } else {
      (*def)[o++] = s[i];
    }
  }
  (*def)[o] = 0;
  return 0;
oom:
  seterr(err, errlen, "out of memory");
  return -1;
}

int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen) {
  return template_default_system(g, out, err, errlen);
}

typedef struct sbuf { char *p; size_t n, cap; int oom; } sbuf;

static void sb_add(sbuf *b, const char *s) {
  size_t k = strlen(s);
  if (b->oom) return;
  if (b->n + k + 1 > b->cap) {
    size_t nc = (b->n + k + 1) * 2;
    char *np = realloc(b->p, nc);
    if (!np) {
      b->oom = 1;
      return;
    }
    b->p = np;
    b->cap = nc;
  }
  memcpy(b->p + b->n, s, k + 1);
  b->n += k;
}

static void block(sbuf *b, const char *role, const char *content) {
  sb_add(b, "<|im_start|>");
  sb_add(b, role);
  sb_add(b, "\n");
  sb_add(b, content);
  sb_add(b, "<|im_end|>\n");
}

int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen) {
  *out = NULL;
  if (n > 0 && !msgs) {
    seterr(err, errlen, "no messages");
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    const char *r = msgs[i].role;
    if (!r) {
      seterr(err, errlen, "message %zu has no role", i);
      return -1;
    }
    if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
      seterr(err, errlen, "message %zu has role '%.40s' (system, user and assistant are accepted)", i, r);
      return -1;
    }
    if (!msgs[i].content) {
      seterr(err, errlen, "message %zu has no content", i);
      return -1;
    }
  }
  char *def = NULL;
  if (template_default_system(g, &def, err, errlen) != 0) return -1;
  sbuf b = {0};
  sb_add(&b, "");
  for (size_t i = 0; i < n; i++) {
    if (i == 0 && def && strcmp(msgs[0].role, "system") != 0) block(&b, "system", def);
    block(&b, msgs[i].role, msgs[i].content);
  }
  if (add_generation_prompt) sb_add(&b, "<|im_start|>assistant\n");
  free(def);
  if (b.oom) {
    free(b.p);
    seterr(err, errlen, "out of memory");
    return -1;
  }
  *out = b.p;
  return 0;
}
