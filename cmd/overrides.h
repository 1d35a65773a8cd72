// cmd/overrides.h: the llama-server-style flags that `dserve serve` and `dserve launch` share, each one config key.
#ifndef DSERVE_CMD_OVERRIDES_H
#define DSERVE_CMD_OVERRIDES_H

#include <stdio.h>

#include "config/config.h"

#define CMD_MAX_OVERRIDES 64

typedef struct cmd_overrides {
  cfg_set sets[CMD_MAX_OVERRIDES]; // (n) in command-line order: a later flag wins
  int n;
  char paths[8][1024];             // flag values made absolute (against the working directory)
  int n_paths;
} cmd_overrides;

// Tries argv[*i] as one of the shared flags; its value is argv[*i + 1]. Returns 1 (taken: *i advanced past the
// value), 0 (not one of them) or -1 (a bad or missing value: the message is printed to stderr with prog).
int cmd_overrides_take(cmd_overrides *o, const char *prog, int argc, char **argv, int *i);

// Prints the flags with their config keys and defaults (for --help).
void cmd_overrides_usage(FILE *f);

#endif
