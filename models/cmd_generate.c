// models/cmd_generate.c: subcommands of this module (not yet written: issue 3).
#include <stdio.h>

#include "server/cmds.h"

int mdl_cmd_generate(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 3)\n", argv[0]);
  return 3;
}

