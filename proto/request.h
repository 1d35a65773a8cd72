// proto/request.h: a request's messages between the router and the workers: generate, token, done, error, cancel.
#ifndef DSERVE_PRT_REQUEST_H
#define DSERVE_PRT_REQUEST_H

#include "proto/proto.h"

#ifdef __cplusplus
extern "C" {
#endif

// Strings in decoded structs are borrowed from the decoded cJSON: they live as long as it does.
// Encoders return a new message (owned by the caller) or NULL on out of memory (err says so).

typedef struct prt_error {
  const char *id;      // (borrowed) the request's; NULL in a listener's refusal of a hello (protocol version)
  const char *message; // (borrowed) required
  const char *code;    // (borrowed) e.g. "worker_failure"; may be NULL
} prt_error;
cJSON *prt_error_encode(const prt_error *m, char *err, size_t errlen);
int prt_error_decode(const cJSON *j, prt_error *m, char *err, size_t errlen);

typedef struct prt_cancel {
  const char *id; // (borrowed) required
} prt_cancel;
cJSON *prt_cancel_encode(const prt_cancel *m, char *err, size_t errlen);
int prt_cancel_decode(const cJSON *j, prt_cancel *m, char *err, size_t errlen);

#ifdef __cplusplus
}
#endif
#endif
