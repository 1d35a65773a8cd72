// kvxfer/cmd_bench.c: subcommands of this module (not yet written: issue 4).
#include <stdio.h>

#include "server/cmds.h"

int kvx_cmd_bench(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 4)\n", argv[0]);
  return 3;
}

