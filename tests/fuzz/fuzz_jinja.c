// tests/fuzz/fuzz_jinja.c: libFuzzer target: mdl_jinja_parse and mdl_jinja_render on a template and a context.
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/jinja.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

// A conversation for templates whose input carries no context of its own.
static const char CTX[] =
    "{\"bos_token\": \"<s>\", \"eos_token\": \"</s>\", \"add_generation_prompt\": true, \"messages\": ["
    "{\"role\": \"system\", \"content\": \"Be brief.\"}, {\"role\": \"user\", \"content\": \"Hi <|im_end|> {{ x }}\"},"
    "{\"role\": \"assistant\", \"content\": \"<think>t</think>ok\", \"tool_calls\": [{\"id\": \"call12345\", \"type\":"
    " \"function\", \"function\": {\"name\": \"f\", \"arguments\": {\"a\": [1, 2.5, null, true]}}}]},"
    "{\"role\": \"tool\", \"tool_call_id\": \"call12345\", \"content\": \"42\"}],"
    "\"tools\": [{\"type\": \"function\", \"function\": {\"name\": \"f\", \"parameters\": {\"type\": \"object\","
    " \"properties\": {\"a\": {\"type\": \"array\"}}}}}]}";

// Checks what the header promises of a successful render: NUL-terminated output, spans ascending, disjoint, inside.
static void check(const char *out, size_t len, const size_t *sp, size_t nsp) {
  if (out[len] != 0) abort();
  size_t end = 0;
  for (size_t i = 0; i < nsp; i++) {
    if (sp[2 * i] < end || sp[2 * i + 1] == 0 || sp[2 * i] + sp[2 * i + 1] > len) abort();
    end = sp[2 * i] + sp[2 * i + 1];
  }
}

// Input: the template, then (after the first NUL byte, if any) the context JSON; without one, CTX.
int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  const uint8_t *nul = memchr(data, 0, size);
  size_t tn = nul ? (size_t)(nul - data) : size;
  const char *ctx = nul ? (const char *)nul + 1 : CTX;
  size_t cn = nul ? size - tn - 1 : sizeof CTX - 1;
  char err[256];
  mdl_jinja *t;
  if (mdl_jinja_parse((const char *)data, tn, &t, err, sizeof err) != 0) {
    if (strncmp(err, "line ", 5) != 0 && strncmp(err, "template of", 11) != 0) abort(); // errors name the line
    return 0;
  }
  (void)mdl_jinja_uses_var(t, "tools");
  mdl_jinja_opts o = {0};
  char *out;
  size_t len, *sp, nsp;
  int rc = mdl_jinja_render(t, ctx, cn, &o, &out, &len, &sp, &nsp, err, sizeof err);
  if (rc == 0) {
    check(out, len, sp, nsp);
    free(out);
    free(sp);
  } else if (out || sp) {
    abort();
  }
  mdl_jinja_free(t);
  return 0;
}
