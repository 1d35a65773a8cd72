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
  int ctx;                         // -c/--ctx-size (0: not given, or the model's)
  int np;                          // -np (0: not given)
  int unified;                     // --kv-unified 1, --no-kv-unified 0, neither -1 (set by cmd_overrides_init)
  char nums[2][24];                // the values cmd_overrides_finish sets
} cmd_overrides;

#define CMD_OVERRIDES_INIT {.unified = -1}

// Tries argv[*i] as one of the shared flags; its value is argv[*i + 1]. Returns 1 (taken: *i advanced past the
// value), 0 (not one of them) or -1 (a bad or missing value: the message is printed to stderr with prog).
int cmd_overrides_take(cmd_overrides *o, const char *prog, int argc, char **argv, int *i);

// After the last flag, before cmd_overrides_finish, where the model is known: -np N without -c (or with -c 0) and no
// --kv-unified splits the model's context_length among the slots, as llama-server's n_ctx 0 does (-c takes that
// context then). model: a GGUF path or "null". 0, or -1 after a message on stderr (an unreadable GGUF).
int cmd_overrides_model_ctx(cmd_overrides *o, const char *model, const char *prog);

// After the last flag: -c, -np and --kv-unified into the pool size (workers.*.kv_budget_tokens) and the per-request
// bound (max_model_len), as llama-server sizes its context and slots. 0, or -1 after a message on stderr.
int cmd_overrides_finish(cmd_overrides *o, const char *prog);

// An option neither the shared flags nor prog's own take: one line on stderr, what to use instead for a
// llama-server flag dserve does not have, else "unknown option" (never the usage).
void cmd_overrides_refuse(const char *prog, const char *a);

// Prints the flags with their config keys and defaults (for --help).
void cmd_overrides_usage(FILE *f);

#endif
