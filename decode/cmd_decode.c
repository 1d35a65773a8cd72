// decode/cmd_decode.c: `dserve both` and `dserve decode`.
#include "decode/worker.h"
#include "server/cmds.h"
#include "worker/runtime.h"

int dec_cmd_both(int argc, char **argv) { return srv_worker_cmd(argc, argv, SRV_ROLE_BOTH, dec_worker_run); }
int dec_cmd_decode(int argc, char **argv) { return srv_worker_cmd(argc, argv, SRV_ROLE_DECODE, dec_worker_run); }
