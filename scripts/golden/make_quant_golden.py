#!/usr/bin/env python3
"""scripts/golden/make_quant_golden.py: writes tests/kernels/golden/quants.txt, a few real weight blocks of each
weight type with the gguf Python package's dequantization of them, for tests/kernels/test_golden.cc.

Where the blocks come from:
- Q5_0, Q8_0, Q4_K, Q6_K: raw blocks of gemma-3-270m-q4_k_m.gguf (scripts/fetch_gemma.sh), taken as stored.
- Q4_1: raw blocks of SmolLM2-135M-Instruct.Q4_1.gguf (scripts/setup.sh), taken as stored.
- Q5_1, BF16: real F32 values (gemma's norm weights, stored as F32) quantized by gguf.quants.quantize.
- Q5_K: gguf.quants has no Q5_K quantizer, so quantize_q5_k below (documented there) makes blocks from the floats
  of a SmolLM2 tensor (its Q4_1 blocks dequantized by gguf.quants); the script checks that gguf.quants dequantizes
  them back within the quantizer's error bound, and that they decode to what this script packed.
Every "deq" line is gguf.quants.dequantize of the "raw" bytes: the reference dserve's scalar kernels must match.

Run: python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy
     /tmp/gguf-venv/bin/python scripts/golden/make_quant_golden.py > tests/kernels/golden/quants.txt
"""
import os
import sys

import numpy as np
from gguf import GGUFReader, GGMLQuantizationType as T
from gguf import quants
from gguf.constants import GGML_QUANT_SIZES

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
GEMMA = os.path.join(ROOT, "models/weights/gemma-3-270m-q4_k_m.gguf")
SMOL = os.path.join(ROOT, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")


def raw_blocks(reader, name, picks):
    """Raw bytes of the blocks at indices picks (negative: from the end) of tensor name, and its type."""
    t = next(t for t in reader.tensors if t.name == name)
    bsize, tsize = GGML_QUANT_SIZES[t.tensor_type]
    data = np.asarray(t.data).view(np.uint8).reshape(-1)
    nblk = data.size // tsize
    rows = [data[(p % nblk) * tsize:(p % nblk + 1) * tsize] for p in picks]
    return t.tensor_type, np.concatenate(rows)


def floats_of(reader, name):
    t = next(t for t in reader.tensors if t.name == name)
    data = np.asarray(t.data)
    if t.tensor_type == T.F32:
        return data.astype(np.float32).reshape(-1)
    return quants.dequantize(data.view(np.uint8), t.tensor_type).astype(np.float32).reshape(-1)


def pack_k_scales(sc, m):
    """The 12 bytes holding 8 six-bit scales and mins, in ggml's Q4_K/Q5_K layout."""
    out = np.zeros(12, np.uint8)
    for j in range(4):
        out[j] = (sc[j] & 63) | ((sc[j + 4] >> 4) << 6)
        out[j + 4] = (m[j] & 63) | ((m[j + 4] >> 4) << 6)
        out[j + 8] = (sc[j + 4] & 15) | ((m[j + 4] & 15) << 4)
    return out


def quantize_q5_k(x):
    """One Q5_K super-block from 256 floats: each 32-element sub-block s is x ~= d_s q - m_s with q in 0..31,
    min_s = min(0, min x_s), step_s = (max x_s - min_s) / 31; the 8 steps and the 8 (-min_s) are then themselves
    quantized to 6 bits against super-block scales d = max step / 63 and dmin = max(-min) / 63 (round to nearest),
    and every q is chosen again, to nearest, against the 6-bit scales it will be decoded with. Simpler than
    ggml's (no iterative refinement of the scales); the layout is ggml's. Returns the 176 bytes and the bound on
    |dequantized - x| per element."""
    x = x.astype(np.float32).reshape(8, 32)
    mins = np.minimum(0.0, x.min(axis=1))
    steps = (x.max(axis=1) - mins) / 31
    d = np.float16(steps.max() / 63)
    dmin = np.float16((-mins).max() / 63)
    df, dminf = np.float32(d), np.float32(dmin)
    sc = np.clip(np.rint(steps / df), 1, 63).astype(np.int32) if df > 0 else np.ones(8, np.int32)
    m = np.clip(np.rint(-mins / dminf), 0, 63).astype(np.int32) if dminf > 0 else np.zeros(8, np.int32)
    ds = df * sc.astype(np.float32)
    ms = dminf * m.astype(np.float32)
    q = np.clip(np.rint((x + ms[:, None]) / ds[:, None]), 0, 31).astype(np.int32)
    qs = np.zeros(128, np.uint8)
    qh = np.zeros(32, np.uint8)
    for s in range(8):
        for l in range(32):
            qs[32 * (s // 2) + l] |= (q[s, l] & 15) << (4 * (s & 1))
            qh[l] |= (q[s, l] >> 4) << s
    blk = np.concatenate([np.array([d, dmin], np.float16).view(np.uint8), pack_k_scales(sc, m), qh, qs])
    # what the decoder gives, by the layout's formula, and how far that may be from x
    mine = (ds[:, None] * q.astype(np.float32) - ms[:, None]).reshape(-1)
    over = np.maximum(0, x - (ds * 31 - ms)[:, None]) + np.maximum(0, -ms[:, None] - x)  # clipped at either end
    bound = (ds[:, None] / 2 + over).reshape(-1) + 1e-6
    return blk, mine, bound


def emit(name, qtype, raw, source):
    deq = quants.dequantize(raw, qtype).astype(np.float32).reshape(-1)
    print(f"block {name} {deq.size} {source}")
    print("raw " + raw.tobytes().hex())
    print("deq " + "".join(f"{v:08x}" for v in deq.view(np.uint32)))
    return deq


def main():
    gemma = GGUFReader(GEMMA)
    smol = GGUFReader(SMOL)
    print("# tests/kernels/golden/quants.txt: real weight blocks and the gguf package's dequantization of them.")
    print("# Written by scripts/golden/make_quant_golden.py; read by tests/kernels/test_golden.cc.")
    print("# Records: block TYPE N_ELEMENTS SOURCE / raw BLOCK_BYTES_HEX / deq FLOATS (each the 8 hex digits of its IEEE bits)")
    # stored blocks of real tensors (Q6_K block 0 has negative scales and a negative d; Q4_K block 0 uses the top
    # bits of every 6-bit scale and min)
    for name, tensor, picks in [
        ("Q5_0", "blk.0.attn_k.weight", [0, -1]),
        ("Q8_0", "blk.0.attn_v.weight", [-1]),
        ("Q4_K", "blk.0.attn_output.weight", [0]),
        ("Q6_K", "blk.0.ffn_down.weight", [0]),
    ]:
        qtype, raw = raw_blocks(gemma, tensor, picks)
        assert qtype.name == name, (tensor, qtype.name)
        emit(name, qtype, raw, f"gemma-3-270m-q4_k_m:{tensor}")
    qtype, raw = raw_blocks(smol, "blk.0.ffn_down.weight", [777])
    assert qtype == T.Q4_1
    emit("Q4_1", qtype, raw, "SmolLM2-135M-Instruct.Q4_1:blk.0.ffn_down.weight")

    # quantized here from real F32 values by gguf.quants
    norms = np.concatenate([floats_of(gemma, "blk.0.attn_norm.weight"), floats_of(gemma, "blk.3.ffn_norm.weight")])
    x = np.concatenate([norms[:32], norms[640:672]])  # 2 blocks of 32
    raw = quants.quantize(x.reshape(1, -1), T.Q5_1).reshape(-1)
    deq = emit("Q5_1", T.Q5_1, raw, "gguf.quants.quantize(gemma blk.0.attn_norm + blk.3.ffn_norm, F32)")
    step = (x.reshape(2, 32).max(axis=1) - x.reshape(2, 32).min(axis=1)) / 31
    assert np.all(np.abs(deq - x).reshape(2, 32) <= step[:, None] * 0.51 + 1e-3 * np.abs(x).max()), "Q5_1"
    xb = norms[100:132]
    raw = quants.quantize(xb.reshape(1, -1), T.BF16).reshape(-1)
    deq = emit("BF16", T.BF16, raw, "gguf.quants.quantize(gemma blk.0.attn_norm, F32)")
    assert np.all(np.abs(deq - xb) <= np.abs(xb) * 2.0 ** -8), "BF16"

    # Q5_K: this script's quantizer over SmolLM2 floats; gguf.quants decodes them
    f = floats_of(smol, "blk.2.ffn_down.weight")
    for start in (1536 * 100 + 512,):
        x = f[start:start + 256]
        blk, mine, bound = quantize_q5_k(x)
        deq = emit("Q5_K", T.Q5_K, blk, f"quantize_q5_k(SmolLM2 blk.2.ffn_down.weight[{start}:{start + 256}])")
        assert np.array_equal(deq, mine), "Q5_K: gguf decodes other values than the script packed"
        assert np.all(np.abs(deq - x) <= bound), f"Q5_K round trip: max err {np.abs(deq - x).max()}"


if __name__ == "__main__":
    sys.exit(main())
