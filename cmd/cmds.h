// cmd/cmds.h: the dserve subcommands, one cmd_*.c file each (cmd_worker.c serves three roles).
#ifndef DSERVE_CMD_CMDS_H
#define DSERVE_CMD_CMDS_H

// Each returns the process exit status; argv[0] is the subcommand name.
int cmd_inspect(int argc, char **argv);      // cmd_inspect.c
int cmd_tokenize(int argc, char **argv);     // cmd_inspect.c
int cmd_generate(int argc, char **argv);     // cmd_generate.c
int cmd_perplexity(int argc, char **argv);   // cmd_perplexity.c
int cmd_kvxfer_bench(int argc, char **argv); // cmd_kvxfer_bench.c
int cmd_router(int argc, char **argv);       // cmd_router.c
int cmd_prefill(int argc, char **argv);      // cmd_worker.c
int cmd_decode(int argc, char **argv);       // cmd_worker.c
int cmd_both(int argc, char **argv);         // cmd_worker.c
int cmd_launch(int argc, char **argv);       // cmd_launch.c
int cmd_serve(int argc, char **argv);        // cmd_serve.c
int cmd_members(int argc, char **argv);      // cmd_members.c

#endif
