// kernels/cpu/backend_amx.c: the "amx" backend (the avx512 table with prefill matmuls on AMX int8 tiles; select.c offers it only where the CPU has AMX and Linux lets this process use tile data).
#define KRN_W512 1
#define KRN_AMX_NAME "amx"
#define KRN_AMX_TABLE krn_cpu_amx_table
#include "kernels/cpu/amx_matmul.h"
