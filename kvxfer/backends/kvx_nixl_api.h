// kvxfer/backends/kvx_nixl_api.h: our own declarations of the few functions of NIXL's C API (libnixl_capi.so) the nixl backend calls, resolved with dlopen/dlsym into one table per agent.
//
// NIXL ships no C header in its wheel; these follow the C API's documented shapes (NIXL 1.5: opaque handles,
// functions returning a status: 0 success, 1 in progress, < 0 errors). Only what kvx_nixl.c uses is declared.
#ifndef DSERVE_KVX_NIXL_API_H
#define DSERVE_KVX_NIXL_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

// Statuses (nixl_capi_status_t).
enum {
  NXA_OK = 0,
  NXA_IN_PROG = 1,
  NXA_E_PARAM = -1,
  NXA_E_BACKEND = -2,
  NXA_E_STATE = -3,
  NXA_E_EXCEPTION = -4,
  NXA_E_TELEMETRY = -5,
  NXA_E_NOT_FOUND = -6,
};
enum { NXA_MEM_DRAM = 0, NXA_MEM_VRAM = 1 };   // nixl_capi_mem_type_t
enum { NXA_OP_READ = 0, NXA_OP_WRITE = 1 };    // nixl_capi_xfer_op_t

// Opaque handles: each a pointer to a NIXL-owned object.
typedef struct nxa_agent_s *nxa_agent;
typedef struct nxa_params_s *nxa_params;
typedef struct nxa_mems_s *nxa_mems;
typedef struct nxa_backend_s *nxa_backend;
typedef struct nxa_opt_s *nxa_opt;
typedef struct nxa_xlist_s *nxa_xlist;  // transfer descriptor list
typedef struct nxa_rlist_s *nxa_rlist;  // registration descriptor list
typedef struct nxa_req_s *nxa_req;

// nixl_capi_agent_config_t: the agent's threads (NIXL 1.5 layout).
typedef struct nxa_config {
  bool prog_thread;    // NIXL's progress thread (it progresses UCX when this process only receives)
  bool listen_thread;  // NIXL's own metadata listener: never (metadata travels in kvxfer's blob)
  int listen_port;
  int thread_sync;     // 0 = NIXL's default
  unsigned int num_workers;
  uint64_t pthr_delay_us;  // the progress thread's poll timeout between UCX wakeups (0 = it never sleeps)
  uint64_t lthr_delay_us;
  bool capture_telemetry;
} nxa_config;

// The table: one field per symbol, named after it without the nixl_capi_ prefix.
typedef struct kvx_nixl_api {
  void *lib;  // dlopen handle (never closed: see kvx_nixl.c)
  int (*create_configured_agent)(const char *name, const nxa_config *cfg, nxa_agent *out);
  int (*destroy_agent)(nxa_agent a);
  int (*get_plugin_params)(nxa_agent a, const char *plugin, nxa_mems *mems, nxa_params *params);
  int (*destroy_mem_list)(nxa_mems m);
  int (*destroy_params)(nxa_params p);
  int (*params_add)(nxa_params p, const char *key, const char *value);
  int (*create_backend)(nxa_agent a, const char *plugin, nxa_params p, nxa_backend *out);
  int (*destroy_backend)(nxa_backend b);
  int (*create_opt_args)(nxa_opt *out);
  int (*destroy_opt_args)(nxa_opt o);
  int (*opt_args_add_backend)(nxa_opt o, nxa_backend b);
  int (*get_local_md)(nxa_agent a, void **data, size_t *len);  // *data: malloc'ed, the caller frees
  int (*load_remote_md)(nxa_agent a, const void *data, size_t len, char **name);  // *name: malloc'ed
  int (*invalidate_remote_md)(nxa_agent a, const char *name);
  int (*create_reg_dlist)(int mem, nxa_rlist *out);
  int (*destroy_reg_dlist)(nxa_rlist l);
  int (*reg_dlist_add_desc)(nxa_rlist l, uintptr_t addr, size_t len, uint64_t dev, const void *md, size_t md_len);
  int (*register_mem)(nxa_agent a, nxa_rlist l, nxa_opt o);
  int (*deregister_mem)(nxa_agent a, nxa_rlist l, nxa_opt o);
  int (*create_xfer_dlist)(int mem, nxa_xlist *out);
  int (*destroy_xfer_dlist)(nxa_xlist l);
  int (*xfer_dlist_add_desc)(nxa_xlist l, uintptr_t addr, size_t len, uint64_t dev);
  int (*create_xfer_req)(nxa_agent a, int op, nxa_xlist local, nxa_xlist remote, const char *peer, nxa_req *out,
                         nxa_opt o);
  int (*post_xfer_req)(nxa_agent a, nxa_req r, nxa_opt o);
  int (*get_xfer_status)(nxa_agent a, nxa_req r);
  int (*release_xfer_req)(nxa_agent a, nxa_req r);
  int (*destroy_xfer_req)(nxa_req r);
} kvx_nixl_api;

#endif
