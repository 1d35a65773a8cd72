// cmd/main.c: the dserve binary: the command table, and dispatch to each subcommand (cmd_*.c).
#include <stdio.h>
#include <string.h>

#include "cmd/cmds.h"

typedef struct cmd {
  const char *name;
  int (*run)(int argc, char **argv);
  const char *args; // the usage line after the name
  const char *help;
} cmd;

static const cmd CMDS[] = {
    {"inspect", cmd_inspect, "MODEL.gguf", "print architecture, hyper-parameters and tensors"},
    {"tokenize", cmd_tokenize, "MODEL.gguf TEXT", "print token ids"},
    {"generate", cmd_generate, "--model M --prompt P ...", "generate text on this machine"},
    {"perplexity", cmd_perplexity, "--model M --file TEXT ...", "perplexity and KL divergence vs llama.cpp"},
    {"launch", cmd_launch, "--config F --node N", "start the roles a cluster config gives this node"},
    {"router", cmd_router, "--config F", "run the OpenAI-compatible HTTP router"},
    {"both", cmd_both, "--config F --name W", "run a colocated prefill+decode worker"},
    {"prefill", cmd_prefill, "--config F --name W", "run a prefill worker"},
    {"decode", cmd_decode, "--config F --name W", "run a decode worker"},
    {"kvxfer-bench", cmd_kvxfer_bench, "--backend B ...", "KV transfer bandwidth and latency"},
};

static void usage(FILE *f) {
  fprintf(f, "usage: dserve COMMAND [ARGS]\n\ncommands:\n");
  for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++) fprintf(f, "  %-13s %-25s %s\n", CMDS[i].name, CMDS[i].args, CMDS[i].help);
}

int main(int argc, char **argv) {
  if (argc < 2 || !strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
    usage(argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  for (size_t i = 0; i < sizeof CMDS / sizeof CMDS[0]; i++)
    if (!strcmp(argv[1], CMDS[i].name)) return CMDS[i].run(argc - 1, argv + 1);
  fprintf(stderr, "dserve: unknown command '%s'\n", argv[1]);
  usage(stderr);
  return 2;
}
