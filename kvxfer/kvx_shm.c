// kvxfer/kvx_shm.c: the shm backend (placeholder while the core is brought up).
#include "kvxfer/kvx_int.h"
const char *kvx_shm_path(kvx_agent *a);
const char *kvx_shm_path(kvx_agent *a) { (void)a; return ""; }
const kvx_backend kvx_shm_backend = {"shm", kvx_no_init, kvx_no_stop, kvx_no_fini, kvx_no_reg, kvx_no_dereg, kvx_no_post, kvx_no_drop};
