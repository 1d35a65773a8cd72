// kernels/cpu/backend_amx_emulated.c: the amx kernel over amx_tile.h's plain-C tiles, so tests check its repacking, tiling and scaling on CPUs without AMX (a test instrument: never offered by name).
#define KRN_W512 1
#define KRN_AMX_EMULATE 1
#define KRN_AMX_NAME "amx-emulated"
#define KRN_AMX_TABLE krn_cpu_amx_emulated_table
#include "kernels/cpu/amx_matmul.h"
