// tests/models/jinja/jinja_render.c: renders a Jinja chat template with a JSON context through models/jinja.c, for
// the jinja2 oracle test (test_jinja_oracle.py). Not installed.
//   jinja_render TEMPLATE CONTEXT.json [NOW] : the output on stdout; then, on stderr, one line "spans o,l o,l ..."
//   exit 0 rendered, 3 the template raised (its message on stderr), 2 a parse error, 1 a render error or bad usage
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "models/jinja.h"

static char *slurp(const char *path, size_t *n) {
  FILE *f = fopen(path, "rb");
  if (!f) return NULL;
  size_t cap = 1 << 16, len = 0;
  char *p = malloc(cap);
  for (size_t k; p && (k = fread(p + len, 1, cap - len, f)) > 0;) {
    len += k;
    if (len == cap) {
      char *q = realloc(p, cap *= 2);
      if (!q) free(p);
      p = q;
    }
  }
  fclose(f);
  *n = len;
  return p;
}

int main(int argc, char **argv) {
  if (argc < 3) {
    fprintf(stderr, "usage: jinja_render TEMPLATE CONTEXT.json [NOW]\n");
    return 1;
  }
  size_t tn, cn;
  char *tpl = slurp(argv[1], &tn), *ctx = slurp(argv[2], &cn);
  if (!tpl || !ctx) {
    fprintf(stderr, "jinja_render: cannot read %s\n", tpl ? argv[2] : argv[1]);
    free(tpl);
    free(ctx);
    return 1;
  }
  char err[512];
  mdl_jinja *t;
  if (mdl_jinja_parse(tpl, tn, &t, err, sizeof err) != 0) {
    fprintf(stderr, "parse error: %s\n", err);
    free(tpl);
    free(ctx);
    return 2;
  }
  mdl_jinja_opts o = {.now = argc > 3 ? strtoll(argv[3], NULL, 10) : 0};
  char *out;
  size_t len, *sp, nsp;
  int rc = mdl_jinja_render(t, ctx, cn, &o, &out, &len, &sp, &nsp, err, sizeof err);
  mdl_jinja_free(t);
  free(tpl);
  free(ctx);
  if (rc == MDL_JINJA_RAISED) {
    fprintf(stderr, "raised: %s\n", err);
    return 3;
  }
  if (rc != 0) {
    fprintf(stderr, "render error: %s\n", err);
    return 1;
  }
  fwrite(out, 1, len, stdout);
  fprintf(stderr, "spans");
  for (size_t i = 0; i < nsp; i++) fprintf(stderr, " %zu,%zu", sp[2 * i], sp[2 * i + 1]);
  fprintf(stderr, "\n");
  free(out);
  free(sp);
  return 0;
}
