// server/cmds.h: the dserve subcommands; each module implements its own in its cmd_*.c file.
#ifndef DSERVE_CMDS_H
#define DSERVE_CMDS_H

// Each returns the process exit status; argv[0] is the subcommand name.
int mdl_cmd_inspect(int argc, char **argv);   // models/cmd_inspect.c
int mdl_cmd_tokenize(int argc, char **argv);  // models/cmd_inspect.c
int mdl_cmd_generate(int argc, char **argv);  // models/cmd_generate.c
int kvx_cmd_bench(int argc, char **argv);     // kvxfer/cmd_bench.c
int rtr_cmd_router(int argc, char **argv);    // router/cmd_router.c
int pfl_cmd_prefill(int argc, char **argv);   // prefill/cmd_prefill.c
int dec_cmd_decode(int argc, char **argv);    // decode/cmd_decode.c
int dec_cmd_both(int argc, char **argv);      // decode/cmd_decode.c
int srv_cmd_launch(int argc, char **argv);    // server/cmd_launch.c

#endif
