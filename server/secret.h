// server/secret.h: the cluster's shared secret: where a role finds it, what is strong enough, per-launch secrets.
#ifndef DSERVE_SRV_SECRET_H
#define DSERVE_SRV_SECRET_H

#include <stddef.h>

#include "server/config.h"

#ifdef __cplusplus
extern "C" {
#endif

// Where srv_config.secret came from, in the order srv_config_resolve_secret looks.
typedef enum srv_secret_from {
  SRV_SECRET_NONE = 0,        // nowhere: only `dserve launch` may start (it makes a per-launch secret)
  SRV_SECRET_CONFIG_FILE = 1, // the config's "secret_file"
  SRV_SECRET_ENV_FILE = 2,    // the file named by $DSERVE_SECRET_FILE
  SRV_SECRET_ENV = 3,         // $DSERVE_SECRET
  SRV_SECRET_INLINE = 4,      // the config's "secret" (loopback-only clusters)
} srv_secret_from;

#define SRV_SECRET_FILE_ENV "DSERVE_SECRET_FILE"
#define SRV_SECRET_ENV_VAR "DSERVE_SECRET"
#define SRV_SECRET_MIN_LEN 16    // bytes, everywhere
#define SRV_SECRET_MAX_LEN 127   // bytes (srv_config.secret)
#define SRV_SECRET_REMOTE_BITS 256 // estimated bits a cluster with a non-loopback host needs (64 hex digits)

const char *srv_secret_from_name(int from); // "secret_file", "DSERVE_SECRET_FILE", "DSERVE_SECRET", "secret", "none"

// 1 for 127.0.0.0/8, ::1 and "localhost"; 0 for everything else (0.0.0.0 and :: listen on every interface).
int srv_host_is_loopback(const char *host);

// Bits of entropy a secret can hold at most, from its length and alphabet: 4 per character when it is all hex
// digits, 6 when all base64/base64url, 6.5 otherwise (printable ASCII).
double srv_secret_bits(const char *s);

// 0 when s may be used; -1 with why: not printable ASCII (0x21..0x7e), shorter than SRV_SECRET_MIN_LEN, longer than
// SRV_SECRET_MAX_LEN, a known placeholder ("change-me", "secret", "password", "example", ...), one character
// repeated, a repeated pattern or a run ("abcdef..."); with remote, fewer than SRV_SECRET_REMOTE_BITS bits.
int srv_secret_check(const char *s, int remote, char *why, size_t cap);

// Reads a secret file into out (cap bytes): a regular file, not accessible by group or others (chmod 600), whose
// text without trailing whitespace is the secret. 0, or -1 with err.
int srv_secret_read_file(const char *path, char *out, size_t cap, char *err, size_t errlen);

// Fills c->secret and c->secret_from: c->secret_file, then $DSERVE_SECRET_FILE, then $DSERVE_SECRET, then the
// inline "secret". Refuses (-1 with err naming the config file): "secret" and "secret_file" both given, an
// unreadable or weak secret, and, when c->remote_field names a non-loopback host, no secret, an inline one or one
// with fewer than SRV_SECRET_REMOTE_BITS bits. No secret on a loopback-only config is not an error here.
int srv_config_resolve_secret(srv_config *c, char *err, size_t errlen);

// What every role calls before it listens: 0 when c has a secret, else -1 with a message saying how to give one.
int srv_config_require_secret(const srv_config *c, char *err, size_t errlen);

// 32 bytes from getrandom(2) as 64 lowercase hex digits (out: 65 bytes). 0, or -1 with err.
int srv_secret_generate(char out[65], char *err, size_t errlen);

// Zeroes n bytes at p in a way the compiler keeps.
void srv_secret_wipe(void *p, size_t n);

#ifdef __cplusplus
}
#endif
#endif
