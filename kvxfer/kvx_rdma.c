// kvxfer/kvx_rdma.c: the rdma backend (placeholder while the core is brought up).
#include "kvxfer/kvx_int.h"
int kvx_rdma_serve_qp(kvx_agent *a, const char *peer, int fd, const kvx_hdr *h, char *why, size_t cap) { (void)a,(void)peer,(void)fd,(void)h; kvx_set_err(why, cap, "rdma: not enabled"); return -1; }
const kvx_backend kvx_rdma_backend = {"rdma", kvx_no_init, kvx_no_stop, kvx_no_fini, kvx_no_reg, kvx_no_dereg, kvx_no_post, kvx_no_drop};
