// decode/stopstr.h: stop-string matching across token boundaries, holding back text that may begin a stop.
#ifndef DSERVE_DEC_STOPSTR_H
#define DSERVE_DEC_STOPSTR_H

#include <stddef.h>

#include "util/err.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct dec_stopstr {
  char **stops;   // (owned) (n) the stop strings, non-empty
  size_t *lens;   // (owned) (n)
  int n;
  size_t max_len; // longest stop string
  char *held;     // (owned) text not yet released: it may be the start of a stop string
  size_t n_held, cap;
} dec_stopstr;

int dec_stopstr_init(dec_stopstr *s, const char *const *stops, int n) UTL_WARN_UNUSED; // 0, or -1 on out of memory
void dec_stopstr_free(dec_stopstr *s);
// Adds text (whole UTF-8 characters). Writes to *out (malloc'ed, caller frees) the text that is now
// safe to send and sets *out_len. Returns 1 when a stop string matched: *out then holds the text before
// it and the choice is finished; 0 otherwise.
int dec_stopstr_push(dec_stopstr *s, const char *text, size_t len, char **out, size_t *out_len);
// At the end of a choice (length / eos): the held text is released.
void dec_stopstr_flush(dec_stopstr *s, char **out, size_t *out_len);

#ifdef __cplusplus
}
#endif
#endif
