// prefill/cmd_prefill.c: subcommands of this module (not yet written: issue 6).
#include <stdio.h>

#include "server/cmds.h"

int pfl_cmd_prefill(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 6)\n", argv[0]);
  return 3;
}

