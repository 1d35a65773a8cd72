// kvxfer/kvx_host.c: shareable host memory: kvx_host_alloc's memfd-backed allocations, and finding the memfd behind one (the shm backend passes it to peers).
#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "kvxfer/kvx_int.h"

// ---- shareable host memory ----
// Layout: [header page | len bytes], one memfd mapped MAP_SHARED; the header says which fd backs it.
#define HOST_MAGIC 0x54534f48585643ull  // "CVXHOST"
typedef struct host_hdr {
  uint64_t magic, size, fd;
} host_hdr;

void *kvx_host_alloc(size_t len, char *err, size_t errlen) {
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  if (len == 0 || len > ((size_t)1 << 46)) {
    utl_seterr(err, errlen, "kvx_host_alloc: bad length %zu", len);
    return NULL;
  }
  size_t sz = (len + pg - 1) / pg * pg;
  int fd = memfd_create("kvx-host", MFD_CLOEXEC);
  if (fd < 0) {
    utl_seterr(err, errlen, "memfd_create: %s", strerror(errno));
    return NULL;
  }
  if (ftruncate(fd, (off_t)(sz + pg)) < 0) {
    utl_seterr(err, errlen, "ftruncate %zu: %s", sz + pg, strerror(errno));
    close(fd);
    return NULL;
  }
  uint8_t *m = mmap(NULL, sz + pg, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
  if (m == MAP_FAILED) {
    utl_seterr(err, errlen, "mmap %zu: %s", sz + pg, strerror(errno));
    close(fd);
    return NULL;
  }
  host_hdr *h = (host_hdr *)m;
  h->magic = HOST_MAGIC;
  h->size = len;
  h->fd = (uint64_t)fd;
  return m + pg;
}

void kvx_host_free(void *p, size_t len) {
  if (!p) return;
  size_t pg = (size_t)sysconf(_SC_PAGESIZE);
  uint8_t *m = (uint8_t *)p - pg;
  host_hdr *h = (host_hdr *)m;
  int fd = (int)h->fd;
  if (h->magic != HOST_MAGIC) return;  // not from kvx_host_alloc: leave it alone
  (void)len;  // the header knows the size
  size_t sz = (h->size + pg - 1) / pg * pg;
  munmap(m, sz + pg);
  close(fd);
}

int kvx_host_lookup(uint64_t addr, uint64_t len, int *fd, uint64_t *off) {
  FILE *f = fopen("/proc/self/maps", "re");
  if (!f) return 0;
  char line[512];
  uint64_t pg = (uint64_t)sysconf(_SC_PAGESIZE);
  int found = 0;
  while (fgets(line, sizeof line, f)) {
    unsigned long long lo, hi, foff;
    int name_at = 0;
    if (sscanf(line, "%llx-%llx %*s %llx %*s %*s %n", &lo, &hi, &foff, &name_at) < 3 || !name_at) continue;
    if (addr - pg != lo || foff != 0) continue;
    if (strncmp(line + name_at, "/memfd:kvx-host", 15)) break;
    host_hdr *h = (host_hdr *)(uintptr_t)lo;
    if (h->magic == HOST_MAGIC && h->size == len && hi - lo >= len + pg) {
      *fd = (int)h->fd;
      *off = pg;  // the header page comes first
      found = 1;
    }
    break;
  }
  fclose(f);
  return found;
}
