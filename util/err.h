// util/err.h: filling a caller's error buffer, the one way every module reports why a call failed, and the mark that
// makes a caller read the status that goes with it.
#ifndef DSERVE_UTL_ERR_H
#define DSERVE_UTL_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// On a function whose int result is a status (0 / -1, with the error buffer saying why): a caller that drops it does
// not compile (-Werror), since a failure nobody reads is a failure that happens silently.
#define UTL_WARN_UNUSED __attribute__((warn_unused_result))

// Drops a status on purpose, for the rare call whose failure has nowhere useful to go; the call says why in a
// comment. (gcc does not let a (void) cast silence UTL_WARN_UNUSED; handing the value on reads it.)
static inline void utl_ignore_status(long status) { (void)status; }

// printf into err (errlen bytes, always NUL-terminated, truncated when longer); a NULL err or errlen 0 is a no-op.
void utl_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif
