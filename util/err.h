// util/err.h: filling a caller's error buffer, the one way every module reports why a call failed.
#ifndef DSERVE_UTL_ERR_H
#define DSERVE_UTL_ERR_H

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

// printf into err (errlen bytes, always NUL-terminated, truncated when longer); a NULL err or errlen 0 is a no-op.
void utl_seterr(char *err, size_t errlen, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

#ifdef __cplusplus
}
#endif
#endif
