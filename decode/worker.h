// decode/worker.h: the generation worker: continuous batching over a paged KV cache (roles both and decode).
#ifndef DSERVE_DEC_WORKER_H
#define DSERVE_DEC_WORKER_H

#include <stddef.h>

#include "config/config.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

// Serves worker w of cfg until SIGTERM/SIGINT (then drains: running requests finish within the drain
// bound, new ones are refused). Returns 0 on a clean stop, -1 with err when it cannot start.
int dec_worker_run(const cfg_cluster *cfg, const cfg_worker *w, char *err, size_t errlen) UTL_WARN_UNUSED;

#ifdef __cplusplus
}
#endif
#endif
