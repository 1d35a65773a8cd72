// models/chat.c: ChatML rendering, with the default system prompt read from the model's own chat template.
#include "models/chat.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util/buf.h"
#include "util/err.h"

#define SMOLLM2_SYSTEM "You are a helpful AI assistant named SmolLM, trained by Hugging Face"

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
    utl_seterr(err, errlen, "the model's chat template is not ChatML (only ChatML is supported)");
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
  utl_seterr(err, errlen, "out of memory");
  return -1;
}

int mdl_chat_default_system(const mdl_gguf *g, char **out, char *err, size_t errlen) {
  return template_default_system(g, out, err, errlen);
}

static void block(utl_buf *b, const char *role, const char *content) {
  utl_buf_printf(b, "<|im_start|>%s\n%s<|im_end|>\n", role, content);
}

int mdl_chat_apply(const mdl_gguf *g, const mdl_chat_msg *msgs, size_t n, int add_generation_prompt, char **out,
                   char *err, size_t errlen) {
  *out = NULL;
  if (n > 0 && !msgs) {
    utl_seterr(err, errlen, "no messages");
    return -1;
  }
  for (size_t i = 0; i < n; i++) {
    const char *r = msgs[i].role;
    if (!r) {
      utl_seterr(err, errlen, "message %zu has no role", i);
      return -1;
    }
    if (strcmp(r, "system") != 0 && strcmp(r, "user") != 0 && strcmp(r, "assistant") != 0) {
      utl_seterr(err, errlen, "message %zu has role '%.40s' (system, user and assistant are accepted)", i, r);
      return -1;
    }
    if (!msgs[i].content) {
      utl_seterr(err, errlen, "message %zu has no content", i);
      return -1;
    }
  }
  char *def = NULL;
  if (template_default_system(g, &def, err, errlen) != 0) return -1;
  utl_buf b = {0};
  for (size_t i = 0; i < n; i++) {
    if (i == 0 && def && strcmp(msgs[0].role, "system") != 0) block(&b, "system", def);
    block(&b, msgs[i].role, msgs[i].content);
  }
  if (add_generation_prompt) utl_buf_adds(&b, "<|im_start|>assistant\n");
  free(def);
  if (!(*out = utl_buf_take(&b))) {
    utl_seterr(err, errlen, "out of memory");
    return -1;
  }
  return 0;
}
