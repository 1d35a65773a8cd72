// tests/fuzz/fuzz_config.c: libFuzzer target: cfg_parse (the cluster config) on arbitrary bytes.
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "config/config.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
  char *buf = malloc(size ? size : 1); // exactly size bytes, not NUL-terminated: the parser must honour len
  if (!buf) return 0;
  if (size) memcpy(buf, data, size);
  cfg_cluster *c = NULL;
  char err[512];
  if (cfg_parse(buf, size, "fuzz.json", &c, err, sizeof err) == 0) {
    for (int i = 0; i < c->n_workers; i++) {
      const cfg_worker *w = &c->workers[i];
      if (cfg_find_worker(c, w->name) == NULL) abort(); // every parsed worker is found by its name
      if (!cfg_has_node(c, w->node)) abort();      // and its node is one of the nodes
      (void)cfg_role_name(w->role);
    }
    for (int i = 0; i < c->n_nodes; i++) (void)cfg_has_node(c, c->nodes[i]);
    cfg_free(c);
  } else if (c != NULL || err[0] == 0) {
    abort(); // a failure leaves *out empty and says why
  }
  free(buf);
  return 0;
}
