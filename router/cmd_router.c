// router/cmd_router.c: subcommands of this module (not yet written: issue 5).
#include <stdio.h>

#include "server/cmds.h"

int rtr_cmd_router(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 5)\n", argv[0]);
  return 3;
}

