// kernels/cpu/amx_tile.h: the AMX tile vocabulary amx_matmul.h is written over: the real instructions, or (with
// KRN_AMX_EMULATE) plain C with the same semantics (Intel SDM: LDTILECFG, TILELOADD, TILESTORED, TILEZERO, TDPBSSD),
// so that the kernel's repacking, tiling and scaling are tested on CPUs without AMX. The emulation is a test
// instrument: its table is reachable from tests only (cpu.h), never by name.
#ifndef DSERVE_KRN_CPU_AMX_TILE_H
#define DSERVE_KRN_CPU_AMX_TILE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

// LDTILECFG's 64-byte memory operand, palette 1: 8 tiles of at most 16 rows of at most 64 bytes.
typedef struct amx_cfg {
  uint8_t palette;     // 1
  uint8_t start_row;   // 0 (restart point after a fault)
  uint8_t reserved[14];
  uint16_t colsb[16];  // bytes per row of tile i (i < 8)
  uint8_t rows[16];    // rows of tile i (i < 8)
} amx_cfg;
#ifdef __cplusplus
static_assert(sizeof(amx_cfg) == 64, "LDTILECFG reads 64 bytes");
#else
_Static_assert(sizeof(amx_cfg) == 64, "LDTILECFG reads 64 bytes");
#endif

#ifdef KRN_AMX_EMULATE
// The tile registers of one thread, as the emulation keeps them (the hardware keeps them per thread too).
typedef struct amx_regs {
  amx_cfg cfg;
  uint8_t t[8][16][64];
} amx_regs;

// What real AMX raises #UD (or a fault) for: a kernel bug, which the emulation must not let pass.
static inline void amx_emu_fault(const char *what) {
  fprintf(stderr, "amx emulation: %s (real AMX faults here)\n", what);
  abort();
}

static inline void amx_emu_config(amx_regs *R, const amx_cfg *c) {
  if (c->palette != 1) amx_emu_fault("LDTILECFG: palette other than 1");
  for (int i = 0; i < 8; i++)
    if (c->rows[i] > 16 || c->colsb[i] > 64) amx_emu_fault("LDTILECFG: a tile over 16 rows of 64 bytes");
  memset(R, 0, sizeof *R); // LDTILECFG zeroes every tile
  R->cfg = *c;
}

// TILELOADD: rows[t] rows of colsb[t] bytes from p, rows stride bytes apart; the rest of the tile zeroed.
static inline void amx_emu_load(amx_regs *R, int t, const void *p, size_t stride) {
  memset(R->t[t], 0, sizeof R->t[t]);
  for (int r = 0; r < R->cfg.rows[t]; r++) memcpy(R->t[t][r], (const char *)p + (size_t)r * stride, R->cfg.colsb[t]);
}

static inline void amx_emu_store(const amx_regs *R, int t, void *p, size_t stride) {
  for (int r = 0; r < R->cfg.rows[t]; r++) memcpy((char *)p + (size_t)r * stride, R->t[t][r], R->cfg.colsb[t]);
}

// TDPBSSD c, a, b: c[m][n] += sum over k < colsb[a] / 4, i < 4 of a[m][4k + i] * b[k][4n + i], both bytes signed,
// int32 lanes wrapping (no saturation); lanes past colsb[c] and rows past rows[c] zeroed.
static inline void amx_emu_dpbssd(amx_regs *R, int c, int a, int b) {
  const amx_cfg *g = &R->cfg;
  if (g->rows[c] != g->rows[a] || g->colsb[a] / 4 != g->rows[b] || g->colsb[c] != g->colsb[b] || g->colsb[a] % 4 ||
      g->colsb[c] % 4)
    amx_emu_fault("TDPBSSD: tile shapes that do not chain (rows c = rows a, colsb a / 4 = rows b, colsb c = colsb b)");
  uint8_t out[16][64] = {{0}};
  for (int m = 0; m < g->rows[c]; m++)
    for (int n = 0; n < g->colsb[c] / 4; n++) {
      uint32_t acc;
      memcpy(&acc, &R->t[c][m][4 * n], 4);
      for (int k = 0; k < g->colsb[a] / 4; k++)
        for (int i = 0; i < 4; i++)
          acc += (uint32_t)((int32_t)(int8_t)R->t[a][m][4 * k + i] * (int32_t)(int8_t)R->t[b][k][4 * n + i]);
      memcpy(&out[m][4 * n], &acc, 4);
    }
  memcpy(R->t[c], out, sizeof out);
}

#define AMX_CONFIG(R, cfg) amx_emu_config(R, cfg)
#define AMX_RELEASE(R) memset(R, 0, sizeof *(R))
#define AMX_ZERO(R, tl) memset((R)->t[tl], 0, sizeof (R)->t[tl])
#define AMX_LOAD(R, t, p, stride) amx_emu_load(R, t, p, stride)
#define AMX_STORE(R, t, p, stride) amx_emu_store(R, t, p, stride)
#define AMX_DPBSSD(R, c, a, b) amx_emu_dpbssd(R, c, a, b)
#else
#include <immintrin.h>
// The hardware holds the tiles; R only keeps the one vocabulary's calls alike. Tile numbers must be constants.
typedef struct amx_regs {
  int unused;
} amx_regs;
#define AMX_CONFIG(R, cfg) do { (void)(R); _tile_loadconfig(cfg); } while (0)
#define AMX_RELEASE(R) do { (void)(R); _tile_release(); } while (0)
#define AMX_ZERO(R, t) do { (void)(R); _tile_zero(t); } while (0)
#define AMX_LOAD(R, t, p, stride) do { (void)(R); _tile_loadd(t, p, stride); } while (0)
#define AMX_STORE(R, t, p, stride) do { (void)(R); _tile_stored(t, p, stride); } while (0)
#define AMX_DPBSSD(R, c, a, b) do { (void)(R); _tile_dpbssd(c, a, b); } while (0)
#endif

#endif
