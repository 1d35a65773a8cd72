// router/router.h: the HTTP router: serves the OpenAI API over libmicrohttpd and relays to worker links.
#ifndef DSERVE_RTR_ROUTER_H
#define DSERVE_RTR_ROUTER_H

#include <stddef.h>

#include "config/config.h"
#include "models/gguf.h"
#include "models/tokenizer.h"
#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct rtr_server rtr_server;

typedef struct rtr_server_opts {
  const cfg_cluster *cfg; // (borrowed; must outlive the server) router section, workers, secret, model_name
  const mdl_gguf *gguf;  // (borrowed, may be NULL) for the chat template
  const mdl_tok *tok;    // (borrowed) prompt tokenizer, token texts for logprobs
  int n_ctx;             // the model's context length
  const char *model_name; // the id served ("" or NULL: cfg->model_name)
} rtr_server_opts;

// Binds cfg->router.host:port (port 0 = ephemeral; rtr_server_port tells which), starts the HTTP threads and one
// link per configured worker (connects with back-off). 0, or -1 with err.
int rtr_server_new(const rtr_server_opts *o, rtr_server **out, char *err, size_t errlen) UTL_WARN_UNUSED;
int rtr_server_port(const rtr_server *s);
int rtr_server_links_up(rtr_server *s); // links connected and past hello_ok
// Of those, the links that can finish a generation: decode and both workers up and not draining (a prefill
// worker alone serves nothing). /health and /ready answer 503 while it is 0.
int rtr_server_serving_up(rtr_server *s);
// Graceful stop: from now on new generation requests get 503 `shutting_down` (GET /health too), queued ones are
// failed the same way, and running ones go on; returns once none is left, or after timeout_ms having failed the
// ones still running (503 shutting_down; a stream gets an SSE error event) with the number it failed.
int rtr_server_drain(rtr_server *s, int timeout_ms);
void rtr_server_free(rtr_server *s);    // stops HTTP, fails what is in flight, closes links; NULL is a no-op

#ifdef __cplusplus
}
#endif
#endif
