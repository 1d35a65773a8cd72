// kvxfer/kvx_nccl.c: the nccl backend (placeholder while the core is brought up).
#include "kvxfer/kvx_int.h"
int kvx_nccl_serve(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, void **state, char *why, size_t cap) { (void)a,(void)peer,(void)fd,(void)h,(void)state; kvx_set_err(why, cap, "nccl: not enabled"); return -1; }
void kvx_nccl_serve_end(kvx_agent *a, void *state) { (void)a, (void)state; }
const kvx_backend kvx_nccl_backend = {"nccl", kvx_no_init, kvx_no_stop, kvx_no_fini, kvx_no_reg, kvx_no_dereg, kvx_no_post, kvx_no_drop};
