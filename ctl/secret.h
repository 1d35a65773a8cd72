// ctl/secret.h: the cluster's shared secret: what is strong enough, reading it from a file, per-launch secrets (where
// a role finds it: config/secret.c).
#ifndef DSERVE_CTL_SECRET_H
#define DSERVE_CTL_SECRET_H

#include <stddef.h>

#include "util/err.h"


#ifdef __cplusplus
extern "C" {
#endif

// Where a cluster's secret came from, in the order config/secret.c's cfg_resolve_secret looks.
typedef enum ctl_secret_from {
  CTL_SECRET_NONE = 0,        // nowhere: only `dserve launch` may start (it makes a per-launch secret)
  CTL_SECRET_CONFIG_FILE = 1, // the config's "secret_file"
  CTL_SECRET_ENV_FILE = 2,    // the file named by $DSERVE_SECRET_FILE
  CTL_SECRET_ENV = 3,         // $DSERVE_SECRET
  CTL_SECRET_INLINE = 4,      // the config's "secret" (loopback-only clusters)
} ctl_secret_from;

#define CTL_SECRET_FILE_ENV "DSERVE_SECRET_FILE"
#define CTL_SECRET_ENV_VAR "DSERVE_SECRET"
#define CTL_SECRET_MIN_LEN 16    // bytes, everywhere
#define CTL_SECRET_MAX_LEN 127   // bytes (the config's secret)
#define CTL_SECRET_REMOTE_BITS 256 // estimated bits a cluster with a non-loopback host needs (64 hex digits)

const char *ctl_secret_from_name(int from); // "secret_file", "DSERVE_SECRET_FILE", "DSERVE_SECRET", "secret", "none"

// 1 for 127.0.0.0/8, ::1 and "localhost"; 0 for everything else (0.0.0.0 and :: listen on every interface).
int ctl_host_is_loopback(const char *host);

// Bits of entropy a secret can hold at most, from its length and alphabet: 4 per character when it is all hex
// digits, 6 when all base64/base64url, 6.5 otherwise (printable ASCII).
double ctl_secret_bits(const char *s);

// 0 when s may be used; -1 with why: not printable ASCII (0x21..0x7e), shorter than CTL_SECRET_MIN_LEN, longer than
// CTL_SECRET_MAX_LEN, a known placeholder ("change-me", "secret", "password", "example", ...), one character
// repeated, a repeated pattern or a run ("abcdef..."); with remote, fewer than CTL_SECRET_REMOTE_BITS bits.
int ctl_secret_check(const char *s, int remote, char *why, size_t cap) UTL_WARN_UNUSED;

// Reads a secret file into out (cap bytes): a regular file, not accessible by group or others (chmod 600), whose
// text without trailing whitespace is the secret. 0, or -1 with err.
int ctl_secret_read_file(const char *path, char *out, size_t cap, char *err, size_t errlen) UTL_WARN_UNUSED;

// 32 bytes from getrandom(2) as 64 lowercase hex digits (out: 65 bytes). 0, or -1 with err.
int ctl_secret_generate(char out[65], char *err, size_t errlen) UTL_WARN_UNUSED;

// Zeroes n bytes at p in a way the compiler keeps.
void ctl_secret_wipe(void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
