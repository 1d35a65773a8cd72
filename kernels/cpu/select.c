// kernels/cpu/select.c: picks a cpu backend by CPU feature detection, by name, or by DSERVE_KERNELS.
#include <stdlib.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

#if defined(__x86_64__)
#include <cpuid.h>
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
#else
static int krn_has_avx2(void) { return 0; }
static int krn_has_avxvnni(void) { return 0; }
static int krn_has_avx512(void) { return 0; }
#endif

const krn_backend *krn_cpu_by_name(const char *name) {
  if (!name) return NULL;
  if (!strcmp(name, "scalar")) return krn_cpu_scalar();
#if defined(__x86_64__)
  if (!strcmp(name, "avx2")) return krn_has_avx2() ? krn_cpu_avx2_table() : NULL;
  if (!strcmp(name, "avx2vnni")) return krn_has_avxvnni() ? krn_cpu_avx2vnni_table() : NULL;
  if (!strcmp(name, "avx512")) return krn_has_avx512() ? krn_cpu_avx512_table() : NULL;
#endif
  return NULL;
}

const krn_backend *krn_cpu_best(void) {
  const char *env = getenv("DSERVE_KERNELS");
  if (env && *env) {
    const krn_backend *b = krn_cpu_by_name(env);
    if (b) return b; // an unknown or unsupported name falls back to detection
  }
  const krn_backend *b = krn_cpu_by_name("avx512");
  if (!b) b = krn_cpu_by_name("avx2vnni");
  if (!b) b = krn_cpu_by_name("avx2");
  return b ? b : krn_cpu_scalar();
}
