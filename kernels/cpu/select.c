// kernels/cpu/select.c: picks a cpu backend by CPU feature detection, by name, or by DSERVE_KERNELS.
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
#include <pthread.h>
#include <sys/syscall.h>
#include <unistd.h>
// XCR0 says which register states the OS saves on context switch (AVX: ymm; AVX-512: opmask and zmm).
static unsigned long long krn_xgetbv0(void) {
  unsigned eax, edx;
  __asm__ volatile("xgetbv" : "=a"(eax), "=d"(edx) : "c"(0));
  return ((unsigned long long)edx << 32) | eax;
}
static int krn_os_xsave(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid(1, &a, &b, &c, &d)) return 0;
  return (c & bit_OSXSAVE) != 0;
}
static int krn_has_avx2(void) {
  __builtin_cpu_init();
  if (!krn_os_xsave() || (krn_xgetbv0() & 0x6) != 0x6) return 0;
  unsigned a, b, c, d; // f16c from CPUID leaf 1 (clang 14's __builtin_cpu_supports does not know "f16c")
  if (!__get_cpuid(1, &a, &b, &c, &d) || !(c & bit_F16C)) return 0;
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
}
// AVX-VNNI (256-bit vpdpbusd without AVX-512): CPUID leaf 7 subleaf 1, EAX bit 4.
static int krn_has_avxvnni(void) {
  unsigned a, b, c, d;
  if (!krn_has_avx2() || !__get_cpuid_count(7, 1, &a, &b, &c, &d)) return 0;
  return (a & (1u << 4)) != 0;
}
static int krn_has_avx512(void) {
  if (!krn_has_avx2() || (krn_xgetbv0() & 0xe6) != 0xe6) return 0;
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") &&
         __builtin_cpu_supports("avx512vnni");
}

// AMX: CPUID leaf 7 EDX amx-tile (bit 24) and amx-int8 (25); XCR0's tile config (17) and tile data (18) states
// enabled by the OS; and Linux's permission for this process to use tile data (arch_prctl ARCH_REQ_XCOMP_PERM with
// XFEATURE_XTILEDATA; without it the first tile load faults). The amx table is the avx512 one plus tiles, so AVX-512
// too. The permission belongs to the process, so the probe runs once per process: amx_why is written only by
// amx_probe under amx_once and read-only after (NULL: usable).
#define KRN_ARCH_REQ_XCOMP_PERM 0x1023
#define KRN_XFEATURE_XTILEDATA 18
static pthread_once_t amx_once = PTHREAD_ONCE_INIT;
static const char *amx_why;
static void amx_probe(void) {
  unsigned a, b, c, d;
  if (!__get_cpuid_count(7, 0, &a, &b, &c, &d) || !(d & (1u << 24)) || !(d & (1u << 25))) amx_why = "not on this CPU";
  else if (!krn_has_avx512()) amx_why = "AVX-512 (which the amx kernels build on) is not usable";
  else if ((krn_xgetbv0() & (3ull << 17)) != (3ull << 17)) amx_why = "the OS does not enable tile state (XCR0)";
  else if (syscall(SYS_arch_prctl, KRN_ARCH_REQ_XCOMP_PERM, KRN_XFEATURE_XTILEDATA) != 0)
    amx_why = "Linux refused tile data (arch_prctl ARCH_REQ_XCOMP_PERM)";
  else amx_why = NULL;
}
const char *krn_cpu_amx_absent(void) {
  pthread_once(&amx_once, amx_probe);
  return amx_why;
}
#else
static int krn_has_avx2(void) { return 0; }
static int krn_has_avxvnni(void) { return 0; }
static int krn_has_avx512(void) { return 0; }
const char *krn_cpu_amx_absent(void) { return "not on this CPU (not x86-64)"; }
#endif

const krn_backend *krn_cpu_by_name(const char *name) {
  if (!name) return NULL;
  if (!strcmp(name, "scalar")) return krn_cpu_scalar();
#if defined(__x86_64__)
  if (!strcmp(name, "avx2")) return krn_has_avx2() ? krn_cpu_avx2_table() : NULL;
  if (!strcmp(name, "avx2vnni")) return krn_has_avxvnni() ? krn_cpu_avx2vnni_table() : NULL;
  if (!strcmp(name, "avx512")) return krn_has_avx512() ? krn_cpu_avx512_table() : NULL;
  if (!strcmp(name, "amx")) return krn_cpu_amx_absent() ? NULL : krn_cpu_amx_table();
#endif
  return NULL;
}

const krn_backend *krn_cpu_best(void) {
  const char *env = getenv("DSERVE_KERNELS");
  if (env && *env) {
    const krn_backend *b = krn_cpu_by_name(env);
    if (b) return b; // an unknown or unsupported name falls back to detection
  }
  // not "amx" (asked for by name only): its prefill rows round differently from the avx512 decode rows, so on it a
  // sequence's logits depend on whether its step had 32 rows or more (amx_matmul.h)
  const krn_backend *b = krn_cpu_by_name("avx512");
  if (!b) b = krn_cpu_by_name("avx2vnni");
  if (!b) b = krn_cpu_by_name("avx2");
  return b ? b : krn_cpu_scalar();
}

void krn_describe(const krn_backend *be, char *out, size_t outlen) {
  if (!be) {
    snprintf(out, outlen, "none");
    return;
  }
  const char *why = krn_cpu_amx_absent();
  if (be == krn_cuda() || !strcmp(be->name, "amx")) snprintf(out, outlen, "%s", be->name);
  else snprintf(out, outlen, "%s (amx: %s)", be->name, why ? why : "present, not chosen");
}
