// models/cmd_inspect.c: subcommands of this module (not yet written: issue 2).
#include <stdio.h>

#include "server/cmds.h"

int mdl_cmd_inspect(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 2)\n", argv[0]);
  return 3;
}

int mdl_cmd_tokenize(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 2)\n", argv[0]);
  return 3;
}

