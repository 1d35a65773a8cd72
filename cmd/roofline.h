// cmd/roofline.h: what bounds decode on this machine: its memory read bandwidth and the weight bytes a step reads.
#ifndef DSERVE_CMD_ROOFLINE_H
#define DSERVE_CMD_ROOFLINE_H

#include <stddef.h>

#include "kernels/krn.h"
#include "models/gguf.h"

// Bytes of weights one batch-1 decode step reads: every tensor but the token embedding, of which a step reads one row
// per token, unless the output projection is tied to it (no output.weight); of a mixture of experts' 3-D expert
// tensors (*_exps.weight), only the expert_used_count slices of expert_count that the token is routed to. A dense
// model's step reads each weight once whatever the batch; an MoE's larger batches read more of its experts.
size_t cmd_decode_weight_bytes(const mdl_gguf *g);

// The best of 10 timed passes of pool's threads reading a fresh buffer of `bytes` (far larger than the caches), in
// GB/s (1e9 bytes), 5 with 8-byte loads and 5 with the widest vector loads and software prefetch (the decode
// matmuls' prefetch beat the 8-byte reader on some runs); 0 when the buffer cannot be allocated.
double cmd_read_gbps(krn_pool *pool, size_t bytes);

#endif
