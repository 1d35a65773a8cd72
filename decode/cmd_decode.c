// decode/cmd_decode.c: subcommands of this module (not yet written: issue 6).
#include <stdio.h>

#include "server/cmds.h"

int dec_cmd_decode(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 6)\n", argv[0]);
  return 3;
}

int dec_cmd_both(int argc, char **argv) {
  (void)argc;
  fprintf(stderr, "dserve %s: not yet (issue 6)\n", argv[0]);
  return 3;
}

