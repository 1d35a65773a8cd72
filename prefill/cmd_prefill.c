// prefill/cmd_prefill.c: `dserve prefill`.
#include "prefill/worker.h"
#include "server/cmds.h"
#include "worker/runtime.h"

int pfl_cmd_prefill(int argc, char **argv) { return srv_worker_cmd(argc, argv, SRV_ROLE_PREFILL, pfl_worker_run); }
