// prefill/worker.h: the prefill worker: computes prompts and pushes their KV, layer by layer, to decode workers.
#ifndef DSERVE_PFL_WORKER_H
#define DSERVE_PFL_WORKER_H

#include <stddef.h>

#include "config/config.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Serves worker w of cfg until SIGTERM/SIGINT. Returns 0 on a clean stop, -1 with err when it cannot start.
int pfl_worker_run(const cfg_cluster *cfg, const cfg_worker *w, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
