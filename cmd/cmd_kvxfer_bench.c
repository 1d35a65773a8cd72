// cmd/cmd_kvxfer_bench.c: `dserve kvxfer-bench`: bandwidth and latency of kvxfer between two processes, beside the raw baseline (loopback socket, memcpy, or a CUDA peer copy for nccl) measured in the same run.
#include <arpa/inet.h>
#include <errno.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include "cmd/cmds.h"
#include "kvxfer/kvx.h"
#include "util/clock.h"

#ifdef DSERVE_HAVE_CUDA // defined by the kernels library when the CUDA backend is built (it links cudart)
#include <cuda_runtime.h>
#endif

#define BENCH_INFLIGHT 4

// bench_sort: v[n] in ascending order (an insertion sort: n <= 64 latency samples), so v[n / 2] is the median.
static void bench_sort(double *v, int n) {
  for (int i = 1; i < n; i++)
    for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
      double t = v[j];
      v[j] = v[j - 1];
      v[j - 1] = t;
    }
}

static int parse_size(const char *s, size_t *out) {
  char *end;
  errno = 0;
  double v = strtod(s, &end);
  if (errno || end == s || v <= 0) return -1;
  if (*end == 'k' || *end == 'K') v *= 1024, end++;
  else if (*end == 'm' || *end == 'M') v *= 1024 * 1024, end++;
  else if (*end == 'g' || *end == 'G') v *= 1024.0 * 1024 * 1024, end++;
  if (*end == 'i' || *end == 'B') end++;
  if (*end == 'B') end++;
  if (*end) return -1;
  *out = (size_t)v;
  return 0;
}

static void fmt_size(size_t n, char *buf, size_t cap) {
  if (n >= (1u << 20) && n % (1u << 20) == 0)
    snprintf(buf, cap, "%zu MiB", n >> 20);
  else if (n >= 1024 && n % 1024 == 0)
    snprintf(buf, cap, "%zu KiB", n >> 10);
  else
    snprintf(buf, cap, "%zu B", n);
}

static int io_all(int fd, void *p, size_t n, int wr) {
  uint8_t *b = p;
  while (n) {
    ssize_t r = wr ? send(fd, b, n, MSG_NOSIGNAL) : recv(fd, b, n, 0);
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) return -1;
    b += r;
    n -= (size_t)r;
  }
  return 0;
}

// Block layout of one message of m bytes: nb blocks of bs bytes at permuted slots of a 2*m area: `blocks` blocks
// (at least 256 bytes each), or with a fixed block size (block > 0) m / block blocks of that size.
typedef struct layout {
  size_t nb, bs;
  size_t *slot_src, *slot_dst;  // (nb) (owned)
} layout;

static void layout_make(layout *L, size_t m, size_t blocks, size_t block, unsigned seed) {
  L->nb = block ? m / block : blocks;
  if (!block && m / L->nb < 256) L->nb = m / 256 ? m / 256 : 1;
  L->bs = block ? block : m / L->nb;
  L->slot_src = malloc(L->nb * sizeof(size_t));
  L->slot_dst = malloc(L->nb * sizeof(size_t));
  size_t ns = 2 * L->nb;
  size_t *perm = malloc(ns * sizeof(size_t));
  for (int k = 0; k < 2; k++) {
    for (size_t i = 0; i < ns; i++) perm[i] = i;
    for (size_t i = ns - 1; i > 0; i--) {
      seed = seed * 1103515245u + 12345u;
      size_t j = (seed >> 8) % (i + 1), t = perm[i];
      perm[i] = perm[j];
      perm[j] = t;
    }
    memcpy(k ? L->slot_dst : L->slot_src, perm, L->nb * sizeof(size_t));
  }
  free(perm);
}

static void layout_free(layout *L) {
  free(L->slot_src);
  free(L->slot_dst);
}

// ---- buffers: host memory (kvx_host_alloc), or CUDA device memory for nccl (dev >= 0) ----
static uint8_t *buf_alloc(int dev, size_t n, char *err, size_t errlen) {
  if (dev < 0) return kvx_host_alloc(n, err, errlen);
#ifdef DSERVE_HAVE_CUDA
  void *p = NULL;
  cudaError_t e = cudaSetDevice(dev);
  if (e == cudaSuccess) e = cudaMalloc(&p, n);
  if (e != cudaSuccess) {
    snprintf(err, errlen, "cuda:%d: cudaMalloc of %zu bytes: %s", dev, n, cudaGetErrorString(e));
    return NULL;
  }
  return p;
#else
  snprintf(err, errlen, "this dserve was built without CUDA");
  return NULL;
#endif
}

static void buf_free(int dev, void *p, size_t n) {
  if (dev < 0) {
    kvx_host_free(p, n);
    return;
  }
#ifdef DSERVE_HAVE_CUDA
  if (p) cudaFree(p);
#endif
}

// dst[0, n) = byte v (device memory: cudaMemset, which also makes the pages resident before timing).
static int buf_fill(int dev, uint8_t *dst, int v, size_t n) {
  if (dev < 0) {
    memset(dst, v, n);
    return 0;
  }
#ifdef DSERVE_HAVE_CUDA
  return cudaSetDevice(dev) == cudaSuccess && cudaMemset(dst, v, n) == cudaSuccess &&
                 cudaDeviceSynchronize() == cudaSuccess
             ? 0
             : -1;
#else
  return -1;
#endif
}

// The number of CUDA devices, counted in a short-lived child: the CUDA runtime must not be initialized in this
// process before it forks the receiver (a forked child cannot use its parent's CUDA state). -1 with err when
// this build has no CUDA or the runtime reports an error.
static int cuda_devices(char *err, size_t errlen) {
#ifdef DSERVE_HAVE_CUDA
  int fd[2];
  if (pipe(fd)) {
    snprintf(err, errlen, "pipe: %s", strerror(errno));
    return -1;
  }
  pid_t p = fork();
  if (p == 0) {
    close(fd[0]);
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    char msg[200];
    int len = e == cudaSuccess ? snprintf(msg, sizeof msg, "%d", n) : snprintf(msg, sizeof msg, "E%s", cudaGetErrorString(e));
    _exit(write(fd[1], msg, (size_t)len) == len ? 0 : 1);
  }
  close(fd[1]);
  char msg[200] = "";
  ssize_t r = p > 0 ? read(fd[0], msg, sizeof msg - 1) : -1;
  close(fd[0]);
  if (p > 0) waitpid(p, NULL, 0);
  if (r <= 0) {
    snprintf(err, errlen, "could not count CUDA devices");
    return -1;
  }
  msg[r] = 0;
  if (msg[0] == 'E') {
    snprintf(err, errlen, "no usable CUDA device (cudaGetDeviceCount: %s)", msg + 1);
    return -1;
  }
  return atoi(msg);
#else
  snprintf(err, errlen, "this dserve was built without CUDA (no CUDA toolkit at build time)");
  return -1;
#endif
}

// ---- receiver process ----
static int receiver_main(const char *backend, int dev, int plaintext, size_t cap, int md_fd) {
  char err[256];
  kvx_opts o = {.backend = backend, .secret = "kvxfer-bench", .timeout_ms = 30000, .cuda_device = dev < 0 ? 0 : dev,
                .plaintext = plaintext};
  kvx_agent *b = kvx_agent_new("bench-recv", &o, err, sizeof err);
  if (!b) {
    fprintf(stderr, "kvxfer-bench receiver: %s\n", err);
    return 1;
  }
  uint8_t *dst = buf_alloc(dev, cap, err, sizeof err);
  kvx_region *r;
  if (!dst || kvx_register(b, dst, cap, dev < 0 ? KVX_MEM_HOST : KVX_MEM_CUDA, &r, err, sizeof err)) {
    fprintf(stderr, "kvxfer-bench receiver: %s\n", err);
    return 1;
  }
  if (buf_fill(dev, dst, 1, cap)) {  // touch every page before timing
    fprintf(stderr, "kvxfer-bench receiver: cuda:%d: cudaMemset failed\n", dev);
    return 1;
  }
  void *blob;
  size_t len;
  if (kvx_pack_md(b, &blob, &len, err, sizeof err)) return 1;
  uint64_t l = len, base = (uint64_t)(uintptr_t)dst;
  if (write(md_fd, &l, 8) != 8 || write(md_fd, blob, len) != (ssize_t)len || write(md_fd, &base, 8) != 8) return 1;
  free(blob);
  for (;;) {
    kvx_notif n[8];
    int k = kvx_get_notifs(b, n, 8);
    int stop = 0;
    for (int i = 0; i < k; i++) {
      if (n[i].len == 4 && !memcmp(n[i].msg, "exit", 4)) stop = 1;
      free(n[i].msg);
    }
    if (stop) break;
    if (!k) kvx_progress(b, 200);
  }
  kvx_deregister(b, r);
  kvx_agent_free(b);
  buf_free(dev, dst, cap);
  return 0;
}

// ---- raw baselines ----
static int raw_tcp_server(int lfd, size_t max) {
  int fd = accept(lfd, NULL, NULL);
  if (fd < 0) return 1;
  int one = 1;
  setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  uint8_t *buf = malloc(max);
  memset(buf, 0, max);
  for (;;) {
    uint64_t m;
    if (io_all(fd, &m, 8, 0) || m == 0 || m > max) break;
    if (io_all(fd, buf, m, 0)) break;
    uint8_t ack = 1;
    if (io_all(fd, &ack, 1, 1)) break;
  }
  free(buf);
  close(fd);
  return 0;
}

// Sends iters messages of m bytes with up to BENCH_INFLIGHT unacknowledged; returns seconds, and p50 latency of lone
// round trips in *lat.
static double raw_tcp_run(int fd, uint8_t *buf, size_t m, int iters, double *lat) {
  uint64_t mm = m;
  uint8_t ack;
  double ls[64];
  int nl = iters < 64 ? iters : 64;
  for (int i = 0; i < nl; i++) {
    double t = utl_now_s();
    if (io_all(fd, &mm, 8, 1) || io_all(fd, buf, m, 1) || io_all(fd, &ack, 1, 0)) return -1;
    ls[i] = utl_now_s() - t;
  }
  bench_sort(ls, nl);
  *lat = ls[nl / 2];
  double t0 = utl_now_s();
  int out = 0;
  for (int i = 0; i < iters; i++) {
    if (out == BENCH_INFLIGHT) {
      if (io_all(fd, &ack, 1, 0)) return -1;
      out--;
    }
    if (io_all(fd, &mm, 8, 1) || io_all(fd, buf, m, 1)) return -1;
    out++;
  }
  while (out--)
    if (io_all(fd, &ack, 1, 0)) return -1;
  return utl_now_s() - t0;
}

static double memcpy_run(uint8_t *dst, const uint8_t *src, const layout *L, int iters, double *lat) {
  double ls[64];
  int nl = iters < 64 ? iters : 64;
  double t0 = utl_now_s();
  for (int i = 0; i < iters; i++) {
    double t = utl_now_s();
    for (size_t b = 0; b < L->nb; b++) memcpy(dst + L->slot_dst[b] * L->bs, src + L->slot_src[b] * L->bs, L->bs);
    __asm__ volatile("" ::: "memory");
    if (i < nl) ls[i] = utl_now_s() - t;
  }
  double dt = utl_now_s() - t0;
  bench_sort(ls, nl);
  *lat = ls[nl / 2];
  return dt;
}

// The nccl baseline: the CUDA runtime copying the same scattered blocks from cuda:src to cuda:dst inside one
// process (peer-to-peer where the devices allow it), one stream, synchronized per message. -1 on a CUDA error.
static double peer_copy_run(uint8_t *dst, int ddev, const uint8_t *src, int sdev, const layout *L, int iters,
                            double *lat) {
#ifdef DSERVE_HAVE_CUDA
  double ls[64];
  int nl = iters < 64 ? iters : 64;
  cudaSetDevice(sdev);
  double t0 = utl_now_s();
  for (int i = 0; i < iters; i++) {
    double t = utl_now_s();
    for (size_t b = 0; b < L->nb; b++)
      if (cudaMemcpyPeerAsync(dst + L->slot_dst[b] * L->bs, ddev, src + L->slot_src[b] * L->bs, sdev, L->bs, 0) !=
          cudaSuccess)
        return -1;
    if (cudaStreamSynchronize(0) != cudaSuccess) return -1;
    if (i < nl) ls[i] = utl_now_s() - t;
  }
  double dt = utl_now_s() - t0;
  bench_sort(ls, nl);
  *lat = ls[nl / 2];
  return dt;
#else
  (void)dst, (void)ddev, (void)src, (void)sdev, (void)L, (void)iters, (void)lat;
  return -1;
#endif
}

static int wait_done(kvx_agent *a, kvx_xfer *x) {
  int st;
  while ((st = kvx_xfer_poll(x)) == KVX_PENDING) kvx_progress(a, 100);
  return st;
}

static void usage(FILE *f) {
  fprintf(f,
          "usage: dserve kvxfer-bench --backend tcp|shm|nixl|nccl [--size S] [--blocks N | --block B] [--iters K]\n"
          "                           [--devices S,R] [--encrypt on|off]\n"
          "  Forks a receiver process and measures kvxfer WRITE bandwidth and latency for message sizes\n"
          "  4 KiB .. S (default 64M), each split into N scattered blocks (default 16), beside the raw\n"
          "  baseline measured in the same run (loopback socket send/recv for tcp and nixl, memcpy for shm,\n"
          "  for nccl the CUDA runtime's peer copy of the same blocks between the same two devices).\n"
          "  nixl: NIXL over UCX (UCX_TLS picks its transports); needs libnixl_capi.so (docs/kvxfer.md).\n"
          "  nccl: device memory to device memory, sender on cuda:S, receiver on cuda:R (--devices, default 0,1);\n"
          "  needs a CUDA build with NCCL and two GPUs (NCCL refuses two ranks of one communicator on one device).\n"
          "  --block B: blocks of B bytes instead (a message of m bytes is m / B of them; sizes under B are\n"
          "  skipped), e.g. a model's KV block, to compare with other engines at the same block size.\n"
          "  K: iterations per size (default: enough to move ~512 MiB, 8..2000).\n"
          "  --encrypt: seal the kvxfer tcp connection (on, the default, as kvxfer.encrypt) or not (off).\n");
}

int cmd_kvxfer_bench(int argc, char **argv) {
  const char *backend = NULL;
  size_t size = 64u << 20, blocks = 16, block = 0;
  int iters = 0, sdev = 0, rdev = 1, devices_set = 0, plaintext = 0;
  for (int i = 1; i < argc; i++) {
    const char *v = i + 1 < argc ? argv[i + 1] : NULL;
    if (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")) {
      usage(stdout);
      return 0;
    } else if (!strcmp(argv[i], "--backend") && v) {
      backend = v, i++;
    } else if (!strcmp(argv[i], "--size") && v) {
      if (parse_size(v, &size) || size < 4096 || size > (1ull << 32)) {
        fprintf(stderr, "kvxfer-bench: --size '%s': want 4K..4G (suffix K, M, G)\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(argv[i], "--blocks") && v) {
      char *e;
      long n = strtol(v, &e, 10);
      if (*e || n < 1 || n > 65536) {
        fprintf(stderr, "kvxfer-bench: --blocks '%s': want 1..65536\n", v);
        return 2;
      }
      blocks = (size_t)n, i++;
    } else if (!strcmp(argv[i], "--block") && v) {
      if (parse_size(v, &block) || block < 1 || block > (1ull << 30)) {
        fprintf(stderr, "kvxfer-bench: --block '%s': want 1..1G bytes (suffix K, M, G)\n", v);
        return 2;
      }
      i++;
    } else if (!strcmp(argv[i], "--iters") && v) {
      char *e;
      long n = strtol(v, &e, 10);
      if (*e || n < 1 || n > 1000000) {
        fprintf(stderr, "kvxfer-bench: --iters '%s': want 1..1000000\n", v);
        return 2;
      }
      iters = (int)n, i++;
    } else if (!strcmp(argv[i], "--encrypt") && v) {
      if (strcmp(v, "on") && strcmp(v, "off")) {
        fprintf(stderr, "kvxfer-bench: --encrypt '%s': want on or off\n", v);
        return 2;
      }
      plaintext = !strcmp(v, "off");
      i++;
    } else if (!strcmp(argv[i], "--devices") && v) {
      char *e, *e2 = NULL;
      long a = strtol(v, &e, 10), b = *e == ',' ? strtol(e + 1, &e2, 10) : -1;
      if (e == v || *e != ',' || e[1] == 0 || e2 == e + 1 || *e2 || a < 0 || b < 0 || a > 1024 || b > 1024) {
        fprintf(stderr, "kvxfer-bench: --devices '%s': want S,R (two CUDA device indexes, e.g. 0,1)\n", v);
        return 2;
      }
      sdev = (int)a, rdev = (int)b, devices_set = 1, i++;
    } else {
      fprintf(stderr, "kvxfer-bench: unknown or incomplete argument '%s'\n", argv[i]);
      usage(stderr);
      return 2;
    }
  }
  if (!backend || (strcmp(backend, "tcp") && strcmp(backend, "shm") && strcmp(backend, "nixl") && strcmp(backend, "nccl"))) {
    fprintf(stderr, "kvxfer-bench: --backend tcp|shm|nixl|nccl is required\n");
    usage(stderr);
    return 2;
  }
  const int nccl = !strcmp(backend, "nccl");
  if (devices_set && !nccl) {
    fprintf(stderr, "kvxfer-bench: --devices goes with --backend nccl (the other backends move host memory)\n");
    return 2;
  }
  if (nccl && sdev == rdev) {
    fprintf(stderr, "kvxfer-bench: --devices %d,%d: NCCL refuses two ranks of one communicator on one device; "
                    "name two GPUs\n", sdev, rdev);
    return 2;
  }
  if (nccl) {
    char why[256];
    int n = cuda_devices(why, sizeof why);
    if (n < 0) {
      fprintf(stderr, "kvxfer-bench: --backend nccl: %s\n", why);
      return 1;
    }
    if (sdev >= n || rdev >= n) {
      fprintf(stderr, "kvxfer-bench: --backend nccl: cuda:%d and cuda:%d wanted, %d CUDA device%s here%s\n", sdev, rdev,
              n, n == 1 ? "" : "s", n < 2 ? " (the nccl push needs two GPUs: NCCL refuses two ranks on one device)" : "");
      return 1;
    }
  }
  const int send_dev = nccl ? sdev : -1, recv_dev = nccl ? rdev : -1;
  if (block && (size < block || size / block > (1u << 20))) {
    fprintf(stderr, "kvxfer-bench: --size %zu / --block %zu: want 1..1048576 blocks in the largest message\n", size,
            block);
    return 2;
  }
  size_t cap = 2 * size;
  int md[2];
  if (pipe(md)) {
    perror("kvxfer-bench: pipe");
    return 1;
  }
  fflush(stdout);
  pid_t rpid = fork();
  if (rpid < 0) {
    perror("kvxfer-bench: fork");
    return 1;
  }
  if (rpid == 0) {
    close(md[0]);
    _exit(receiver_main(backend, recv_dev, plaintext, cap, md[1]));
  }
  close(md[1]);
  int rc = 1;
  char err[256];
  kvx_agent *a = NULL;
  uint8_t *src = NULL, *raw_dst = NULL;
  kvx_region *rs = NULL;
  int raw_lfd = -1, raw_fd = -1;
  pid_t raw_pid = -1;
  uint64_t blen = 0;
  uint8_t *blob = NULL;
  struct pollfd pf = {md[0], POLLIN, 0};
  if (poll(&pf, 1, 20000) <= 0 || read(md[0], &blen, 8) != 8 || blen == 0 || blen > (1u << 24) ||
      !(blob = malloc(blen))) {
    fprintf(stderr, "kvxfer-bench: the receiver did not start\n");
    goto out;
  }
  uint64_t dst_base = 0;  // where the receiver's region starts (sent after its metadata)
  for (size_t got = 0; got < blen + 8;) {
    ssize_t r = got < blen ? read(md[0], blob + got, blen - got) : read(md[0], (uint8_t *)&dst_base + (got - blen), blen + 8 - got);
    if (r <= 0) goto out;
    got += (size_t)r;
  }
  kvx_opts o = {.backend = backend, .secret = "kvxfer-bench", .timeout_ms = 30000, .cuda_device = nccl ? sdev : 0,
                .plaintext = plaintext};
  char peer[KVX_MAX_NAME];
  if (!(a = kvx_agent_new("bench-send", &o, err, sizeof err)) ||
      kvx_load_remote_md(a, blob, blen, peer, sizeof peer, err, sizeof err)) {
    fprintf(stderr, "kvxfer-bench: %s\n", err);
    goto out;
  }
  // nccl: the source on the sender's device, the baseline's destination on the receiver's (peer copies).
  src = buf_alloc(send_dev, cap, err, sizeof err);
  raw_dst = src ? buf_alloc(recv_dev, cap, err, sizeof err) : NULL;
  if (!src || !raw_dst || kvx_register(a, src, cap, nccl ? KVX_MEM_CUDA : KVX_MEM_HOST, &rs, err, sizeof err)) {
    fprintf(stderr, "kvxfer-bench: %s\n", err);
    goto out;
  }
  if (nccl) {
    if (buf_fill(send_dev, src, 7, cap) || buf_fill(recv_dev, raw_dst, 1, cap)) {
      fprintf(stderr, "kvxfer-bench: cudaMemset of the sender's buffers failed\n");
      goto out;
    }
  } else {
    for (size_t i = 0; i < cap; i++) src[i] = (uint8_t)(i * 131 + 7);
    memset(raw_dst, 1, cap);
  }
  uint8_t *raw_buf = src;
  int sock_base = strcmp(backend, "shm") != 0 && !nccl;  // tcp and nixl: against a plain loopback socket
  if (sock_base) {  // raw loopback peer: a plain process doing recv loops
    raw_lfd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t sl = sizeof sa;
    if (raw_lfd < 0 || bind(raw_lfd, (struct sockaddr *)&sa, sizeof sa) || listen(raw_lfd, 1) ||
        getsockname(raw_lfd, (struct sockaddr *)&sa, &sl)) {
      perror("kvxfer-bench: raw socket");
      goto out;
    }
    raw_pid = fork();
    if (raw_pid == 0) _exit(raw_tcp_server(raw_lfd, size));
    raw_fd = socket(AF_INET, SOCK_STREAM, 0);
    int one = 1;
    setsockopt(raw_fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    if (connect(raw_fd, (struct sockaddr *)&sa, sizeof sa)) {
      perror("kvxfer-bench: raw connect");
      goto out;
    }
  }
  if (block)
    printf("kvxfer-bench: backend %s, blocks of %zu bytes (scattered), %d requests in flight, receiver pid %d, "
           "encrypt %s\n", backend, block, BENCH_INFLIGHT, (int)rpid, plaintext ? "off" : "on");
  else
    printf("kvxfer-bench: backend %s, %zu blocks per message (scattered), %d requests in flight, receiver pid %d, "
           "encrypt %s\n", backend, blocks, BENCH_INFLIGHT, (int)rpid, plaintext ? "off" : "on");
  if (nccl) printf("devices: sender cuda:%d, receiver cuda:%d (device memory on both sides)\n", sdev, rdev);
  printf("baseline: %s\n\n", sock_base ? "plain loopback socket send/recv loop (contiguous, 1-byte ack per message)"
                               : nccl    ? "cudaMemcpyPeerAsync of the same scattered blocks, sender's device to receiver's, one process"
                                         : "single-thread memcpy of the same scattered blocks");
  printf("%-9s %6s %9s | %10s %10s | %10s %10s | %6s\n", "size", "blocks", "block", "kvx GB/s", "kvx p50 us",
         "raw GB/s", "raw p50 us", "ratio");
  for (size_t m = 4096; m <= size; m *= 4) {
    if (m < block) continue;
    layout L;
    layout_make(&L, m, blocks, block, (unsigned)m);
    int it = iters ? iters : (int)((512u << 20) / m);
    if (it < 8) it = 8;
    if (it > 2000) it = 2000;
    kvx_desc *ld = malloc(L.nb * sizeof *ld), *rd = malloc(L.nb * sizeof *rd);
    for (size_t b = 0; b < L.nb; b++) {
      ld[b] = (kvx_desc){(uint64_t)(uintptr_t)src + L.slot_src[b] * L.bs, L.bs};
      rd[b] = (kvx_desc){dst_base + L.slot_dst[b] * L.bs, L.bs};
    }
    kvx_xfer *x[BENCH_INFLIGHT];
    for (int k = 0; k < BENCH_INFLIGHT; k++)
      if (kvx_xfer_new(a, KVX_WRITE, ld, L.nb, rd, L.nb, peer, NULL, 0, &x[k], err, sizeof err)) {
        fprintf(stderr, "kvxfer-bench: %s\n", err);
        goto out;
      }
    // Latency: lone requests.
    double ls[64];
    int nl = it < 64 ? it : 64, bad = 0;
    for (int i = 0; i < nl + 2 && !bad; i++) {
      double t = utl_now_s();
      if (kvx_xfer_post(x[0]) || wait_done(a, x[0]) != KVX_DONE) bad = 1;
      if (i >= 2) ls[i - 2] = utl_now_s() - t;
    }
    bench_sort(ls, nl);
    // Bandwidth: BENCH_INFLIGHT requests kept in flight.
    double t0 = utl_now_s();
    for (int i = 0; i < it && !bad; i++) {
      kvx_xfer *q = x[i % BENCH_INFLIGHT];
      if (i >= BENCH_INFLIGHT && wait_done(a, q) != KVX_DONE) bad = 1;
      if (!bad && kvx_xfer_post(q)) bad = 1;
    }
    for (int k = 0; k < BENCH_INFLIGHT && !bad; k++)
      if (wait_done(a, x[k]) != KVX_DONE) bad = 1;
    double dt = utl_now_s() - t0;
    if (bad) {
      fprintf(stderr, "kvxfer-bench: transfer failed: %s\n", kvx_xfer_error(x[0])[0] ? kvx_xfer_error(x[0]) : "see above");
      goto out;
    }
    double bw = (double)(L.nb * L.bs) * it / dt / 1e9;
    double raw_lat = 0, raw_dt;
    if (raw_fd >= 0)
      raw_dt = raw_tcp_run(raw_fd, raw_buf, L.nb * L.bs, it, &raw_lat);
    else if (nccl)
      raw_dt = peer_copy_run(raw_dst, rdev, src, sdev, &L, it, &raw_lat);
    else
      raw_dt = memcpy_run(raw_dst, src, &L, it, &raw_lat);
    if (raw_dt <= 0) {
      fprintf(stderr, "kvxfer-bench: raw baseline failed\n");
      goto out;
    }
    double raw_bw = (double)(L.nb * L.bs) * it / raw_dt / 1e9;
    char s1[32], s2[32];
    fmt_size(L.nb * L.bs, s1, sizeof s1);
    fmt_size(L.bs, s2, sizeof s2);
    printf("%-9s %6zu %9s | %10.2f %10.1f | %10.2f %10.1f | %5.0f%%\n", s1, L.nb, s2, bw, ls[nl / 2] * 1e6, raw_bw,
           raw_lat * 1e6, 100.0 * bw / raw_bw);
    fflush(stdout);
    for (int k = 0; k < BENCH_INFLIGHT; k++) kvx_xfer_free(x[k]);
    free(ld);
    free(rd);
    layout_free(&L);
  }
  rc = 0;
out:
  if (a) {
    char e2[128];
    if (kvx_notify(a, "bench-recv", "exit", 4, e2, sizeof e2)) // the loop below stops it then
      fprintf(stderr, "kvxfer-bench: cannot tell the receiver to exit: %s\n", e2);
  }
  if (raw_fd >= 0) {
    uint64_t z = 0;
    io_all(raw_fd, &z, 8, 1);
    close(raw_fd);
  }
  if (raw_lfd >= 0) close(raw_lfd);
  if (raw_pid > 0) waitpid(raw_pid, NULL, 0);
  // Give the receiver a moment to see "exit", then make sure it is gone.
  for (int i = 0; i < 100; i++) {
    if (waitpid(rpid, NULL, WNOHANG) == rpid) {
      rpid = -1;
      break;
    }
    usleep(20000);
  }
  if (rpid > 0) {
    kill(rpid, SIGKILL);
    waitpid(rpid, NULL, 0);
  }
  kvx_deregister(a, rs);
  kvx_agent_free(a);
  buf_free(send_dev, src, cap);
  buf_free(recv_dev, raw_dst, cap);
  free(blob);
  close(md[0]);
  return rc;
}
