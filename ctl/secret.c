// ctl/secret.c: the cluster's shared secret: resolution (file, environment, inline), strength checks, generation.
#include "ctl/secret.h"

#include <ctype.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <unistd.h>

const char *ctl_secret_from_name(int from) {
  switch (from) {
    case CTL_SECRET_CONFIG_FILE: return "secret_file";
    case CTL_SECRET_ENV_FILE: return CTL_SECRET_FILE_ENV;
    case CTL_SECRET_ENV: return CTL_SECRET_ENV_VAR;
    case CTL_SECRET_INLINE: return "secret";
  }
  return "none";
}

int ctl_host_is_loopback(const char *h) {
  if (!h) return 0;
  if (!strcmp(h, "localhost") || !strcmp(h, "::1") || !strcmp(h, "ip6-localhost")) return 1;
  // 127.a.b.c, numeric
  if (strncmp(h, "127.", 4)) return 0;
  int dots = 0;
  for (const char *p = h + 4; *p; p++) {
    if (*p == '.') dots++;
    else if (*p < '0' || *p > '9') return 0;
  }
  return dots == 2;
}

static int all_in(const char *s, const char *set) {
  for (; *s; s++)
    if (!strchr(set, *s)) return 0;
  return 1;
}

double ctl_secret_bits(const char *s) {
  size_t n = strlen(s);
  if (all_in(s, "0123456789abcdefABCDEF")) return 4.0 * (double)n;
  if (all_in(s, "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=-_")) return 6.0 * (double)n;
  return 6.5 * (double)n;
}

// Lowercase letters and digits of s only ("Change-Me!" -> "changeme"), at most cap-1 of them.
static void normalize(const char *s, char *out, size_t cap) {
  size_t k = 0;
  for (; *s && k + 1 < cap; s++)
    if (isalnum((unsigned char)*s)) out[k++] = (char)tolower((unsigned char)*s);
  out[k] = 0;
}

static const char *const PLACEHOLDERS[] = {
    "changeme", "secret", "password", "passw0rd", "example", "s3cret", "test", "testing", "default", "dserve",
    "admin", "letmein", "topsecret", "mysecret", "yoursecret", "clustersecret", "sharedsecret", "qwerty",
    "secretkey", "token", "none", "null", NULL};
// Any secret containing one of these is a placeholder someone forgot to replace.
static const char *const MARKERS[] = {"changeme", "replaceme", "placeholder", "example", "yoursecret",
                                      "secrethere", "insertsecret", "fixme", "todo", NULL};

int ctl_secret_check(const char *s, int remote, char *why, size_t cap) {
  size_t n = strlen(s);
  for (size_t i = 0; i < n; i++)
    if ((unsigned char)s[i] < 0x21 || (unsigned char)s[i] > 0x7e) {
      snprintf(why, cap, "must be printable ASCII without spaces (e.g. hex: head -c 32 /dev/urandom | xxd -p -c 64)");
      return -1;
    }
  char norm[CTL_SECRET_MAX_LEN + 1];
  normalize(s, norm, sizeof norm);
  for (const char *const *p = PLACEHOLDERS; *p; p++)
    if (!strcmp(norm, *p)) {
      snprintf(why, cap, "\"%.40s\" is a placeholder, not a secret", s);
      return -1;
    }
  for (const char *const *p = MARKERS; *p; p++)
    if (strstr(norm, *p)) {
      snprintf(why, cap, "looks like a placeholder (contains \"%s\"), not a secret", *p);
      return -1;
    }
  if (n < CTL_SECRET_MIN_LEN) {
    snprintf(why, cap, "too short (%zu bytes; at least %d)", n, CTL_SECRET_MIN_LEN);
    return -1;
  }
  if (n > CTL_SECRET_MAX_LEN) {
    snprintf(why, cap, "too long (%zu bytes; at most %d)", n, CTL_SECRET_MAX_LEN);
    return -1;
  }
  // one character repeated, or a shorter pattern repeated ("abcabcabc...")
  for (size_t period = 1; period <= n / 2; period++) {
    size_t i = period;
    while (i < n && s[i] == s[i - period]) i++;
    if (i == n) {
      snprintf(why, cap, "is a repeated pattern of %zu character%s, not a secret", period, period == 1 ? "" : "s");
      return -1;
    }
  }
  // a run with a constant step ("abcdefgh...", "98765...")
  int step = (int)(unsigned char)s[1] - (int)(unsigned char)s[0], run = 1;
  for (size_t i = 2; i < n && run; i++) run = (int)(unsigned char)s[i] - (int)(unsigned char)s[i - 1] == step;
  if (run) {
    snprintf(why, cap, "is a run of consecutive characters, not a secret");
    return -1;
  }
  if (remote && ctl_secret_bits(s) < CTL_SECRET_REMOTE_BITS) {
    snprintf(why, cap,
             "too weak for a cluster reachable from other hosts (%zu characters hold at most %.0f bits; needs %d: "
             "64 hex digits, e.g. head -c 32 /dev/urandom | xxd -p -c 64)",
             n, ctl_secret_bits(s), CTL_SECRET_REMOTE_BITS);
    return -1;
  }
  return 0;
}

int ctl_secret_read_file(const char *path, char *out, size_t cap, char *err, size_t errlen) {
  out[0] = 0;
  // O_NONBLOCK: a FIFO (or a device) must be refused, not waited on: opening one for reading blocks for a writer.
  int fd = open(path, O_RDONLY | O_CLOEXEC | O_NOCTTY | O_NONBLOCK);
  if (fd < 0) {
    snprintf(err, errlen, "cannot open %s: %s", path, strerror(errno));
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) || !S_ISREG(st.st_mode)) {
    snprintf(err, errlen, "%s is not a regular file", path);
    close(fd);
    return -1;
  }
  if (st.st_mode & 077) {
    snprintf(err, errlen, "%s is accessible by group or others (mode %03o): chmod 600 %s", path,
             (unsigned)(st.st_mode & 0777), path);
    close(fd);
    return -1;
  }
  char buf[1024];
  size_t len = 0;
  for (;;) {
    ssize_t r = read(fd, buf + len, sizeof buf - 1 - len);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) {
      snprintf(err, errlen, "cannot read %s: %s", path, strerror(errno));
      close(fd);
      ctl_secret_wipe(buf, sizeof buf);
      return -1;
    }
    if (r == 0 || (len += (size_t)r) == sizeof buf - 1) break;
  }
  close(fd);
  while (len && (buf[len - 1] == '\n' || buf[len - 1] == '\r' || buf[len - 1] == ' ' || buf[len - 1] == '\t')) len--;
  int rc = 0;
  if (!len) {
    snprintf(err, errlen, "%s is empty", path);
    rc = -1;
  } else if (memchr(buf, 0, len)) {
    snprintf(err, errlen, "%s holds binary data: write the secret as text (e.g. hex: xxd -p -c 64)", path);
    rc = -1;
  } else if (len >= cap) {
    snprintf(err, errlen, "%s: secret too long (%zu bytes; at most %zu)", path, len, cap - 1);
    rc = -1;
  } else {
    memcpy(out, buf, len);
    out[len] = 0;
  }
  ctl_secret_wipe(buf, sizeof buf);
  return rc;
}

int ctl_secret_generate(char out[65], char *err, size_t errlen) {
  unsigned char r[32];
  size_t got = 0;
  while (got < sizeof r) {
    ssize_t k = getrandom(r + got, sizeof r - got, 0);
    if (k < 0 && errno == EINTR) continue;
    if (k < 0) {
      snprintf(err, errlen, "getrandom: %s", strerror(errno));
      return -1;
    }
    got += (size_t)k;
  }
  for (int i = 0; i < 32; i++) snprintf(out + 2 * i, 3, "%02x", r[i]);
  ctl_secret_wipe(r, sizeof r);
  return 0;
}

void ctl_secret_wipe(void *p, size_t n) {
  volatile unsigned char *v = p;
  while (n--) *v++ = 0;
}
