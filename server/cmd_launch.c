// server/cmd_launch.c: subcommands of this module (not yet written: issue 6).
#include <stdio.h>

#include "server/cmds.h"

int srv_cmd_launch(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 6)\n", argv[0]);
  return 3;
}

