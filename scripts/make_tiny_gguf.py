#!/usr/bin/env python3
# scripts/make_tiny_gguf.py: small random-weight GGUFs of every architecture dserve runs, with the metadata and tensor
# names llama.cpp reads, for checking dserve's forward pass against llama.cpp's (tests/models/golden/archs).
"""Writes ARCH-TYPE.gguf files (F32, Q8_0, Q4_K_M) of tiny models with a real tokenizer.

The weights are seeded from (--seed, architecture, tensor name) and scaled so that the logits are peaked like a trained
model's (build_tensors: a few thousand "frequent" tokens with widely spread logits, the rest far below; the top token
takes 0.8 of the probability on average, 0.9 at the median) and so that llama-perplexity's base files, which store
only what lies within 16 nats of the top, stay small; --logit-scale scales the spread. Every value is made by
element-wise float32 arithmetic and order-free reductions (max, min), so the bytes are the same on every machine;
tests/models/golden/archs records each file's sha256.

Q8_0, Q5_0 and Q5_1 come from the gguf package's quantizers. The gguf package cannot write K-quants, so Q4_K, Q5_K and
Q6_K are quantized here (ggml's block layouts; simple min/max scales, not ggml's search). The Q4_K_M mix follows
llama.cpp's llama-quantize (src/llama-quant.cpp): Q6_K for the output matrix (the token embedding when tied), Q6_K for
attn_v (or a fused attn_qkv) and ffn_down on the layers use_more_bits picks, Q8_0 for attn_k/attn_v and Q5_K for
attn_output with 8 experts, Q4_K elsewhere; a row length that is not a multiple of 256 falls back as llama-quantize's
tensor_type_fallback does (Q4_K -> Q5_0, Q5_K -> Q5_1, Q6_K -> Q8_0). Norms, biases, the router and RoPE factors stay
F32. (Checked: llama-quantize Q4_K_M of each F32 file here gives every tensor the same type.)

Examples:
  make_tiny_gguf.py --out DIR                          # every architecture, F32 Q8_0 Q4_K_M
  make_tiny_gguf.py --out DIR --arch qwen3moe --hidden 1024 --experts 32 --expert-ff 512 --used 4 --layers 8
  make_tiny_gguf.py --out DIR --arch deepseek2 --kv-lora-rank 512 --rope-dim 64 --nope-dim 128 --v-dim 128  # V3's latent
"""
import argparse
import hashlib
import os
import sys

import numpy as np

import gguf
from gguf import GGMLQuantizationType as QT
from gguf import GGUFValueType as VT

ARCHS = ["llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "mixtral", "phi3", "gemma2", "deepseek2", "deepseek2lite"]
TYPES = {"F32": 0, "Q8_0": 7, "Q4_K_M": 15}  # general.file_type (llama_ftype)
QK_K = 256

# Per-architecture defaults: the features each adds are present (see the help of --arch).
DEFAULTS = {
    # arch: (layers, heads, kv_heads, head_dim or 0 for hidden/heads, ff, experts, used, expert_ff, tied)
    "llama": (4, 4, 2, 0, 768, 0, 0, 0, True),       # SmolLM2 / Llama 3.2: tied output
    "qwen2": (4, 4, 2, 0, 640, 0, 0, 0, False),      # q/k/v biases; ff 640: ffn_down rows fall back from K-quants
    "gemma3": (4, 4, 2, 0, 768, 0, 0, 0, True),      # q/k norms, post norms, sliding window pattern 2
    "qwen3": (4, 4, 2, 128, 768, 0, 0, 0, False),    # q/k norms, head_dim 128 != 256/4
    "qwen3moe": (4, 4, 2, 128, 0, 8, 2, 256, False),  # q/k norms and 8 experts, 2 used
    "mixtral": (4, 4, 2, 0, 0, 8, 2, 512, False),    # llama with 8 experts, 2 used
    "phi3": (4, 4, 4, 0, 768, 0, 0, 0, False),       # fused qkv and gate+up, LongRoPE factors
    "gemma2": (4, 4, 2, 0, 768, 0, 0, 0, True),      # soft-caps 50/30, sliding window on even layers
    # DeepSeek V3's shape (MLA, see MLA below): heads 4 (head_count_kv 1, the latent), 16 experts in 4 groups, 4 used
    "deepseek2": (4, 4, 1, 0, 512, 16, 4, 128, False),
    # DeepSeek V2-Lite's (plain attn_q, the older combined attn_kv_b, MHA head_count_kv): written as "deepseek2"
    "deepseek2lite": (4, 4, 4, 0, 512, 16, 4, 128, False),
}
# deepseek2's multi-head latent attention and MoE, per tiny architecture (each overridable by an option of the same
# name): q_lora_rank (0: plain attn_q), kv_lora_rank, rope (qk_rope_head_dim), nope (qk_nope_head_dim), v_dim
# (v_head_dim), kv_b ("split": attn_k_b and attn_v_b as llama.cpp's converter writes them now; "combined": the older
# attn_kv_b), dense_lead (leading_dense_block_count), gating (softmax, or sigmoid with the selection bias exp_probs_b),
# groups / groups_used (expert_group_count, expert_group_used_count; 0: none), shared (expert_shared_count),
# wscale (expert_weights_scale), wnorm (expert_weights_norm), yarn (YaRN factor 40 over 4096 with DeepSeek's
# yarn_log_multiplier 0.1, or none). Widths are multiples of 32 so that Q8_0 holds every row and the KV cache.
MLA = {
    "deepseek2": dict(q_lora_rank=96, kv_lora_rank=64, rope=32, nope=32, v_dim=32, kv_b="split", dense_lead=1,
                      gating="sigmoid", groups=4, groups_used=2, shared=1, wscale=2.5, wnorm=1, yarn=1),
    "deepseek2lite": dict(q_lora_rank=0, kv_lora_rank=64, rope=32, nope=32, v_dim=32, kv_b="combined", dense_lead=0,
                          gating="softmax", groups=0, groups_used=0, shared=2, wscale=1.0, wnorm=0, yarn=0),
}
SWA_WINDOW = 32  # gemma2/gemma3 sliding window: smaller than one 128-token chunk of the test text
# Logit scales (before --logit-scale; see build_tensors): (frequent token count, their logit std, the others' logit
# std); the second set for Gemma 2's final soft-cap (30), which squeezes large logits together: fewer frequent tokens,
# further apart (the top token's probability about 0.6 instead of 0.8). EMB_RMS: the token embeddings' RMS.
LOGITS, LOGITS_CAPPED, EMB_RMS = (4096, 12.0, 3.0), (256, 14.0, 2.0), 0.3


def log(msg):
    print(f"make_tiny_gguf: {msg}", file=sys.stderr)


# ---------------------------------------------------------------- deterministic weights

def rng_for(seed, arch, name):
    h = hashlib.sha256(f"{seed}/{arch}/{name}".encode()).digest()
    return np.random.Generator(np.random.PCG64(int.from_bytes(h[:8], "little")))


def normal(seed, arch, name, shape, std):
    return (rng_for(seed, arch, name).standard_normal(shape, dtype=np.float32) * np.float32(std)).astype(np.float32)


def around_one(seed, arch, name, n, spread=0.1, centre=1.0):
    return (np.float32(centre) * (np.float32(1) + normal(seed, arch, name, (n,), spread))).astype(np.float32)


# ---------------------------------------------------------------- K-quants (ggml's block layouts)

def _f16(x):
    return x.astype(np.float16)


def _safe_div(a, b):
    with np.errstate(divide="ignore", invalid="ignore"):
        return np.where(b > 0, a / np.where(b > 0, b, 1), 0).astype(np.float32)


def _kq_scales(blocks, nmax):
    """Q4_K/Q5_K: 8 sub-blocks of 32 as x = d*sc*q - dmin*m, q in 0..nmax, 6-bit sc and m."""
    nb = blocks.shape[0]
    sub = blocks.reshape(nb, 8, 32)
    mn = np.minimum(sub.min(axis=-1), 0).astype(np.float32)
    mx = sub.max(axis=-1).astype(np.float32)
    scale = ((mx - mn) / np.float32(nmax)).astype(np.float32)
    mins = (-mn).astype(np.float32)
    d16 = _f16(scale.max(axis=-1) / np.float32(63))
    dm16 = _f16(mins.max(axis=-1) / np.float32(63))
    d, dm = d16.astype(np.float32)[:, None], dm16.astype(np.float32)[:, None]
    # ceil: the sub-block's range is covered, so no value is clipped by more than a rounding step
    sc = np.clip(np.ceil(_safe_div(scale, d)), 0, 63).astype(np.uint8)
    m = np.clip(np.ceil(_safe_div(mins, dm)), 0, 63).astype(np.uint8)
    D = (d * sc.astype(np.float32))[:, :, None]
    M = (dm * m.astype(np.float32))[:, :, None]
    q = np.clip(np.rint(_safe_div(sub + M, np.broadcast_to(D, sub.shape))), 0, nmax).astype(np.uint8)
    packed = np.zeros((nb, 12), dtype=np.uint8)
    packed[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    packed[:, 4:8] = m[:, 0:4] | ((m[:, 4:8] >> 4) << 6)
    packed[:, 8:12] = (sc[:, 4:8] & 0xF) | ((m[:, 4:8] & 0xF) << 4)
    head = np.concatenate([d16.view(np.uint8).reshape(nb, 2), dm16.view(np.uint8).reshape(nb, 2), packed], axis=1)
    return head, q.reshape(nb, 256)


def _nibbles(q):
    """Low nibbles of 256 values as Q4_K/Q5_K store them: byte 32j+l holds values 64j+l (low) and 64j+32+l (high)."""
    nb = q.shape[0]
    q4 = (q & 0xF).reshape(nb, 4, 2, 32)
    return (q4[:, :, 0, :] | (q4[:, :, 1, :] << 4)).reshape(nb, 128)


def quant_q4_k(blocks):
    head, q = _kq_scales(blocks, 15)
    return np.concatenate([head, _nibbles(q)], axis=1)


def quant_q5_k(blocks):
    head, q = _kq_scales(blocks, 31)
    nb = q.shape[0]
    hi = ((q >> 4) & 1).reshape(nb, 8, 32)  # bit i of qh[l]: value 32i+l
    qh = np.zeros((nb, 32), dtype=np.uint8)
    for i in range(8):
        qh |= hi[:, i, :] << i
    return np.concatenate([head, qh, _nibbles(q)], axis=1)


def quant_q6_k(blocks):
    """16 sub-blocks of 16 as x = d*sc*(q-32), q in 0..63, int8 sc."""
    nb = blocks.shape[0]
    sub = blocks.reshape(nb, 16, 16)
    imax = np.abs(sub).argmax(axis=-1)[:, :, None]
    extreme = np.take_along_axis(sub, imax, axis=-1)[:, :, 0]
    scale = (extreme / np.float32(-32)).astype(np.float32)  # the largest magnitude maps to -32
    d16 = _f16(np.abs(scale).max(axis=-1) / np.float32(127))
    d = d16.astype(np.float32)[:, None]
    sc = np.clip(np.rint(_safe_div(scale, np.broadcast_to(d, scale.shape))), -127, 127).astype(np.int8)
    D = (d * sc.astype(np.float32))[:, :, None]
    with np.errstate(divide="ignore", invalid="ignore"):
        qf = np.where(D != 0, sub / np.where(D != 0, D, 1), 0)
    q = (np.clip(np.rint(qf), -32, 31) + 32).astype(np.uint8).reshape(nb, 2, 128)
    q4 = q & 0xF
    ql = (q4[:, :, 0:64] | (q4[:, :, 64:128] << 4)).reshape(nb, 128)
    h2 = ((q >> 4) & 3).reshape(nb, 2, 4, 32)
    qh = (h2[:, :, 0] | (h2[:, :, 1] << 2) | (h2[:, :, 2] << 4) | (h2[:, :, 3] << 6)).reshape(nb, 64)
    return np.concatenate([ql, qh, sc.view(np.uint8), d16.view(np.uint8).reshape(nb, 2)], axis=1)


KQUANT = {QT.Q4_K: quant_q4_k, QT.Q5_K: quant_q5_k, QT.Q6_K: quant_q6_k}
FALLBACK = {QT.Q4_K: QT.Q5_0, QT.Q5_K: QT.Q5_1, QT.Q6_K: QT.Q8_0}


def quantize(arr, qt):
    """arr (..., row) float32 -> (bytes array, type actually used)."""
    if qt == QT.F32:
        return arr, QT.F32
    if qt in FALLBACK and arr.shape[-1] % QK_K != 0:
        qt = FALLBACK[qt]
    if qt in KQUANT:
        bs, ts = gguf.GGML_QUANT_SIZES[qt]
        out = KQUANT[qt](arr.reshape(-1, bs))
        assert out.shape[1] == ts, (qt, out.shape)
        return out.reshape(*arr.shape[:-1], arr.shape[-1] // bs * ts), qt
    return gguf.quants.quantize(arr, qt), qt


# ---------------------------------------------------------------- the model

class Shape:
    def __init__(self, arch, a):
        layers, heads, kvh, hd, ff, experts, used, eff, tied = DEFAULTS[arch]
        if not experts and (a.experts is not None or a.used or a.expert_ff):
            raise SystemExit(f"make_tiny_gguf: --experts/--used/--expert-ff are for qwen3moe and mixtral, not {arch}")
        if experts and a.ff and arch not in MLA:
            raise SystemExit(f"make_tiny_gguf: {arch} has no dense FFN: its feed-forward length follows --expert-ff")
        self.arch = arch
        self.d = a.hidden
        self.layers = a.layers or layers
        self.heads = a.heads or heads
        self.kv = a.kv_heads or kvh
        self.hd = a.head_dim or hd or self.d // self.heads
        self.ff = a.ff or ff
        self.experts = (a.experts if a.experts is not None else experts) if experts else 0
        self.used = (a.used or used) if self.experts else 0
        self.eff = (a.expert_ff or eff) if self.experts else 0
        self.tied = tied
        self.mla = None
        if arch in MLA:
            self.mla = dict(MLA[arch])
            for k in self.mla:  # --q-lora-rank etc.; None: the architecture's default
                v = getattr(a, "mla_" + k, None)
                if v is not None:
                    self.mla[k] = v
            m = self.mla
            self.hd = m["nope"] + m["rope"]
            self.kv = 1 if m["kv_b"] == "split" else self.heads
            if not 0 <= m["dense_lead"] <= self.layers:
                raise SystemExit(f"make_tiny_gguf: --dense-lead {m['dense_lead']} must be in 0..{self.layers}")
            if m["groups"] and (self.experts % m["groups"] or not 0 < m["groups_used"] < m["groups"]):
                raise SystemExit("make_tiny_gguf: --groups must divide the experts and --groups-used be in "
                                 "1..groups-1")
        if arch == "qwen3moe":
            self.ff = self.eff * self.used  # as Qwen3-MoE's GGUFs carry it
        if arch == "mixtral":
            self.ff = self.eff
        if self.mla:
            self.ff = a.ff or ff  # the leading dense layers' FFN
        if not (a.head_dim or hd) and self.d % self.heads:
            raise SystemExit(f"make_tiny_gguf: --hidden {self.d} is not a multiple of {self.heads} heads "
                             "(or give --head-dim)")
        if self.heads % self.kv:
            raise SystemExit(f"make_tiny_gguf: {self.heads} heads are not a multiple of {self.kv} KV heads")
        if self.experts and not 0 < self.used <= self.experts:
            raise SystemExit(f"make_tiny_gguf: --used {self.used} must be in 1..{self.experts}")


def mla_layer(t, s, seed, p):
    """A deepseek2 layer's attention and FFN tensors (llama.cpp's src/models/deepseek2.cpp names and shapes)."""
    arch, d, H, m = s.arch, s.d, s.heads, s.mla
    W = lambda name, shape, std: normal(seed, arch, name, shape, std)  # noqa: E731
    R, rope, nope, vd, qr = m["kv_lora_rank"], m["rope"], m["nope"], m["v_dim"], m["q_lora_rank"]
    hk = nope + rope
    # YaRN's softmax scale grows by (1 + 0.1 ln 40)^2 = 1.87 (llama.cpp's deepseek2 kq_scale): q is that much smaller,
    # so that attention is no sharper than the other architectures' (sharper, 8-bit rounding moves the logits more)
    qs = 1 / (1 + 0.1 * np.log(40.0)) ** 2 if m["yarn"] else 1.0
    if qr:
        t[p + "attn_q_a.weight"] = W(p + "attn_q_a.weight", (qr, d), 1 / np.sqrt(d))
        t[p + "attn_q_a_norm.weight"] = around_one(seed, arch, p + "attn_q_a_norm.weight", qr)
        t[p + "attn_q_b.weight"] = W(p + "attn_q_b.weight", (H * hk, qr), qs / np.sqrt(qr))
    else:
        t[p + "attn_q.weight"] = W(p + "attn_q.weight", (H * hk, d), qs / np.sqrt(d))
    t[p + "attn_kv_a_mqa.weight"] = W(p + "attn_kv_a_mqa.weight", (R + rope, d), 1 / np.sqrt(d))
    t[p + "attn_kv_a_norm.weight"] = around_one(seed, arch, p + "attn_kv_a_norm.weight", R)
    # one (H, nope + vd, R) up-projection, written split (k_b as the transpose of its nope rows) or combined
    kvb = W(p + "attn_kv_b.weight", (H, nope + vd, R), 1 / np.sqrt(R))
    if m["kv_b"] == "split":
        t[p + "attn_k_b.weight"] = np.ascontiguousarray(kvb[:, :nope, :].transpose(0, 2, 1))  # (H, R, nope)
        t[p + "attn_v_b.weight"] = np.ascontiguousarray(kvb[:, nope:, :])                     # (H, vd, R)
    else:
        t[p + "attn_kv_b.weight"] = kvb.reshape(H * (nope + vd), R)
    t[p + "attn_output.weight"] = W(p + "attn_output.weight", (d, H * vd), 1 / np.sqrt(H * vd))
    t[p + "ffn_norm.weight"] = around_one(seed, arch, p + "ffn_norm.weight", d)
    if int(p.split(".")[1]) < m["dense_lead"]:
        t[p + "ffn_gate.weight"] = W(p + "ffn_gate.weight", (s.ff, d), 1 / np.sqrt(d))
        t[p + "ffn_up.weight"] = W(p + "ffn_up.weight", (s.ff, d), 1 / np.sqrt(d))
        t[p + "ffn_down.weight"] = W(p + "ffn_down.weight", (d, s.ff), 1 / np.sqrt(s.ff))
        return
    E, F, S = s.experts, s.eff, m["shared"]
    t[p + "ffn_gate_inp.weight"] = W(p + "ffn_gate_inp.weight", (E, d), 2 / np.sqrt(d))
    if m["gating"] == "sigmoid":  # the selection bias: large enough to change which experts win
        t[p + "exp_probs_b.bias"] = W(p + "exp_probs_b.bias", (E,), 0.3)
    t[p + "ffn_gate_exps.weight"] = W(p + "ffn_gate_exps.weight", (E, F, d), 1 / np.sqrt(d))
    # (0.3 of a dense FFN's after expert_weights_scale, as the other MoE models': see build_tensors)
    t[p + "ffn_down_exps.weight"] = W(p + "ffn_down_exps.weight", (E, d, F), 0.3 / (m["wscale"] * np.sqrt(F)))
    t[p + "ffn_up_exps.weight"] = W(p + "ffn_up_exps.weight", (E, F, d), 1 / np.sqrt(d))
    t[p + "ffn_gate_shexp.weight"] = W(p + "ffn_gate_shexp.weight", (F * S, d), 1 / np.sqrt(d))
    t[p + "ffn_down_shexp.weight"] = W(p + "ffn_down_shexp.weight", (d, F * S), 1 / np.sqrt(F * S))
    t[p + "ffn_up_shexp.weight"] = W(p + "ffn_up_shexp.weight", (F * S, d), 1 / np.sqrt(d))


def build_tensors(s, seed, vocab, logit_scale):
    """{name: float32 array (numpy shape, the reverse of ggml's ne)} in the order llama.cpp's converters write."""
    arch, d, hd, H, KV = s.arch, s.d, s.hd, s.heads, s.kv
    gemma = arch in ("gemma2", "gemma3")
    t = {}
    W = lambda name, shape, std: normal(seed, arch, name, shape, std)  # noqa: E731
    # Logits like a trained model's: the first n_freq token ids (BPE ids run roughly by frequency) score
    # N(0, lf^2), the rest N(0, lr^2); the top few frequent tokens then share most of the
    # probability and the rare ones sit more than 16 nats below the top (zeros in llama-perplexity's base files).
    n_freq, lf, lr = LOGITS_CAPPED if arch == "gemma2" else LOGITS
    n_freq, lf, lr = min(n_freq, vocab), lf * logit_scale, lr * logit_scale
    cls = np.full((vocab, 1), np.float32(lr / lf), dtype=np.float32)
    cls[:n_freq] = 1
    # Token embeddings of RMS EMB_RMS in the residual stream (gemma multiplies by sqrt(hidden) on input), small
    # beside what the layers add, so that a tied output does not just repeat the current token.
    emb_std = EMB_RMS / np.sqrt(d) if gemma else EMB_RMS
    t["token_embd.weight"] = (W("token_embd.weight", (vocab, d), emb_std) * cls).astype(np.float32)
    # logit std of a frequent token = |normed hidden| * row std = sqrt(hidden) * norm weight * row std
    row_std = emb_std if s.tied else 1.0
    t["output_norm.weight"] = around_one(seed, arch, "output_norm.weight", d, 0.05, lf / (np.sqrt(d) * row_std))
    if not s.tied:
        t["output.weight"] = (W("output.weight", (vocab, d), 1.0) * cls).astype(np.float32)
    if arch == "phi3":
        half = s.hd // 2
        u = rng_for(seed, arch, "rope_factors").uniform(0, 1, (2, half)).astype(np.float32)
        t["rope_factors_long.weight"] = (np.float32(1) + np.float32(30) * np.sort(u[0])).astype(np.float32)
        t["rope_factors_short.weight"] = (np.float32(1) + np.float32(0.5) * np.sort(u[1])).astype(np.float32)
    # Gemma 2: attention scores of std ~4 (2x larger q, k), so its 50 soft-cap bends the largest by a few percent;
    # much larger and attention turns chaotic (Q8_0 rounding alone then moves the logits by ~1 nat of KL)
    qk_boost = 2.0 if arch == "gemma2" else 1.0
    for i in range(s.layers):
        p = f"blk.{i}."
        t[p + "attn_norm.weight"] = around_one(seed, arch, p + "attn_norm.weight", d)
        if s.mla:
            mla_layer(t, s, seed, p)
            continue
        if arch == "phi3":
            t[p + "attn_qkv.weight"] = W(p + "attn_qkv.weight", (H * hd + 2 * KV * hd, d), 1 / np.sqrt(d))
        else:
            t[p + "attn_q.weight"] = W(p + "attn_q.weight", (H * hd, d), qk_boost / np.sqrt(d))
            t[p + "attn_k.weight"] = W(p + "attn_k.weight", (KV * hd, d), qk_boost / np.sqrt(d))
            t[p + "attn_v.weight"] = W(p + "attn_v.weight", (KV * hd, d), 1 / np.sqrt(d))
        if arch == "qwen2":
            t[p + "attn_q.bias"] = W(p + "attn_q.bias", (H * hd,), 0.3)
            t[p + "attn_k.bias"] = W(p + "attn_k.bias", (KV * hd,), 0.3)
            t[p + "attn_v.bias"] = W(p + "attn_v.bias", (KV * hd,), 0.3)
        t[p + "attn_output.weight"] = W(p + "attn_output.weight", (d, H * hd), 1 / np.sqrt(H * hd))
        if arch in ("qwen3", "qwen3moe", "gemma3"):
            t[p + "attn_q_norm.weight"] = around_one(seed, arch, p + "attn_q_norm.weight", hd)
            t[p + "attn_k_norm.weight"] = around_one(seed, arch, p + "attn_k_norm.weight", hd)
        if gemma:
            t[p + "post_attention_norm.weight"] = around_one(seed, arch, p + "post_attention_norm.weight", d, 0.1, 0.5)
        t[p + "ffn_norm.weight"] = around_one(seed, arch, p + "ffn_norm.weight", d)
        if s.experts:
            E, F = s.experts, s.eff
            # The experts' output is kept small (0.3 of a dense FFN's): where two experts' router scores nearly tie,
            # the 8-bit rounding of activations on quantized weights flips the choice, and full-size random experts
            # then change the logits so much that llama.cpp's KL from itself (flash attention on/off) was 0.1-0.3.
            t[p + "ffn_gate_inp.weight"] = W(p + "ffn_gate_inp.weight", (E, d), 2 / np.sqrt(d))
            t[p + "ffn_gate_exps.weight"] = W(p + "ffn_gate_exps.weight", (E, F, d), 1 / np.sqrt(d))
            t[p + "ffn_down_exps.weight"] = W(p + "ffn_down_exps.weight", (E, d, F), 0.3 / np.sqrt(F))
            t[p + "ffn_up_exps.weight"] = W(p + "ffn_up_exps.weight", (E, F, d), 1 / np.sqrt(d))
        elif arch == "phi3":
            t[p + "ffn_up.weight"] = W(p + "ffn_up.weight", (2 * s.ff, d), 1 / np.sqrt(d))  # gate rows, then up
            t[p + "ffn_down.weight"] = W(p + "ffn_down.weight", (d, s.ff), 1 / np.sqrt(s.ff))
        else:
            t[p + "ffn_gate.weight"] = W(p + "ffn_gate.weight", (s.ff, d), 1 / np.sqrt(d))
            t[p + "ffn_up.weight"] = W(p + "ffn_up.weight", (s.ff, d), 1 / np.sqrt(d))
            t[p + "ffn_down.weight"] = W(p + "ffn_down.weight", (d, s.ff), 1 / np.sqrt(s.ff))
        if gemma:
            t[p + "post_ffw_norm.weight"] = around_one(seed, arch, p + "post_ffw_norm.weight", d, 0.1, 0.5)
    return t


def metadata(s, vocab):
    """[(key, value, type)] for the architecture, as llama.cpp's converters write them."""
    a = "llama" if s.arch == "mixtral" else "deepseek2" if s.mla else s.arch
    u32, f32 = VT.UINT32, VT.FLOAT32
    if s.mla:
        return a, mla_metadata(s, vocab, a)
    ctx = {"llama": 8192, "qwen2": 32768, "gemma3": 32768, "qwen3": 40960, "qwen3moe": 40960, "mixtral": 32768,
           "phi3": 131072, "gemma2": 8192}[s.arch]
    base = {"llama": 100000.0, "qwen2": 1000000.0, "gemma3": 1000000.0, "qwen3": 1000000.0, "qwen3moe": 1000000.0,
            "mixtral": 1000000.0, "phi3": 10000.0, "gemma2": 10000.0}[s.arch]
    eps = 1e-6 if s.arch in ("gemma2", "gemma3", "qwen2", "qwen3", "qwen3moe") else 1e-5
    kv = [
        (f"{a}.context_length", ctx, u32),
        (f"{a}.embedding_length", s.d, u32),
        (f"{a}.block_count", s.layers, u32),
        (f"{a}.feed_forward_length", s.ff, u32),
        (f"{a}.attention.head_count", s.heads, u32),
        (f"{a}.attention.head_count_kv", s.kv, u32),
        (f"{a}.rope.freq_base", base, f32),
        (f"{a}.attention.layer_norm_rms_epsilon", eps, f32),
    ]
    if s.arch in ("qwen3", "qwen3moe", "gemma2", "gemma3"):
        kv += [(f"{a}.attention.key_length", s.hd, u32), (f"{a}.attention.value_length", s.hd, u32)]
    if s.arch in ("llama", "mixtral", "phi3"):
        kv += [(f"{a}.rope.dimension_count", s.hd, u32)]
    if s.arch == "llama" or s.arch == "mixtral":
        kv += [(f"{a}.vocab_size", vocab, u32)]
    if s.experts:
        kv += [(f"{a}.expert_count", s.experts, u32), (f"{a}.expert_used_count", s.used, u32)]
    if s.arch == "qwen3moe":
        kv += [(f"{a}.expert_feed_forward_length", s.eff, u32)]
    if s.arch == "phi3":
        # Phi-3-mini-128k: LongRoPE factors, the short ones used below the original context (every test run here)
        orig = 4096
        kv += [(f"{a}.rope.scaling.original_context_length", orig, u32),
               (f"{a}.rope.scaling.attn_factor", float(np.sqrt(1 + np.log(ctx / orig) / np.log(orig))), f32),
               (f"{a}.attention.sliding_window", 262144, u32)]
    if s.arch == "gemma2":
        kv += [(f"{a}.attention.sliding_window", SWA_WINDOW, u32),
               (f"{a}.attn_logit_softcapping", 50.0, f32),
               (f"{a}.final_logit_softcapping", 30.0, f32)]
    if s.arch == "gemma3":
        kv += [(f"{a}.attention.sliding_window", SWA_WINDOW, u32),
               (f"{a}.attention.sliding_window_pattern", 2, u32)]
    return a, kv


def mla_metadata(s, vocab, a):
    """deepseek2's keys as llama.cpp's converter writes them (DeepseekV2Model / DeepseekV3Model)."""
    u32, f32, m = VT.UINT32, VT.FLOAT32, s.mla
    R, rope, nope, vd = m["kv_lora_rank"], m["rope"], m["nope"], m["v_dim"]
    split = m["kv_b"] == "split"
    kv = [
        (f"{a}.context_length", 163840, u32),
        (f"{a}.embedding_length", s.d, u32),
        (f"{a}.block_count", s.layers, u32),
        (f"{a}.feed_forward_length", s.ff, u32),
        (f"{a}.attention.head_count", s.heads, u32),
        (f"{a}.attention.head_count_kv", s.kv, u32),  # 1 with the split form: one latent "head"
        (f"{a}.rope.freq_base", 10000.0, f32),
        (f"{a}.attention.layer_norm_rms_epsilon", 1e-6, f32),
        (f"{a}.vocab_size", vocab, u32),
        (f"{a}.leading_dense_block_count", m["dense_lead"], u32),
        (f"{a}.attention.q_lora_rank", m["q_lora_rank"], u32),
        (f"{a}.attention.kv_lora_rank", R, u32),
        # split (MLA as llama.cpp runs it): key/value lengths are the latent row's, the _mla ones the heads'
        (f"{a}.attention.key_length", R + rope if split else nope + rope, u32),
        (f"{a}.attention.value_length", R if split else vd, u32),
    ]
    if split:
        kv += [(f"{a}.attention.key_length_mla", nope + rope, u32), (f"{a}.attention.value_length_mla", vd, u32)]
    kv += [
        (f"{a}.rope.dimension_count", rope, u32),
        (f"{a}.expert_feed_forward_length", s.eff, u32),
        (f"{a}.expert_count", s.experts, u32),
        (f"{a}.expert_used_count", s.used, u32),
        (f"{a}.expert_shared_count", m["shared"], u32),
        (f"{a}.expert_weights_scale", float(m["wscale"]), f32),
        (f"{a}.expert_weights_norm", bool(m["wnorm"]), VT.BOOL),
        (f"{a}.expert_gating_func", 2 if m["gating"] == "sigmoid" else 1, u32),
    ]
    if m["groups"]:
        kv += [(f"{a}.expert_group_count", m["groups"], u32), (f"{a}.expert_group_used_count", m["groups_used"], u32)]
    if m["yarn"]:
        kv += [(f"{a}.rope.scaling.type", "yarn", VT.STRING), (f"{a}.rope.scaling.factor", 40.0, f32),
               (f"{a}.rope.scaling.original_context_length", 4096, u32),
               (f"{a}.rope.scaling.yarn_log_multiplier", 0.1, f32)]
    return kv


def tensor_type(name, arr, s, ftype):
    """The type llama-quantize gives this tensor for ftype (before the row-length fallback)."""
    if arr.ndim < 2 or "_norm.weight" in name or not name.endswith("weight") or "ffn_gate_inp" in name:
        return QT.F32
    if ftype == "F32":
        return QT.F32
    if ftype == "Q8_0":
        return QT.Q8_0
    n8 = s.experts == 8
    layer = int(name.split(".")[1]) if name.startswith("blk.") else -1
    n = s.layers

    def more_bits(i):
        return i < n // 8 or i >= 7 * n // 8 or (i - n // 8) % 3 == 2

    if name == "output.weight" or (s.tied and name == "token_embd.weight"):
        return QT.Q6_K if arr.shape[-1] % QK_K == 0 else QT.Q8_0
    if ".attn_v." in name or ".attn_qkv." in name:  # (llama-quantize's category_is_attn_v)
        return QT.Q8_0 if n8 else QT.Q6_K if more_bits(layer) else QT.Q4_K
    if ".attn_k." in name and n8:
        return QT.Q8_0
    if ".ffn_down" in name:
        return QT.Q6_K if more_bits(layer) else QT.Q4_K
    if ".attn_output." in name and n8:
        return QT.Q5_K
    return QT.Q4_K


def read_tokenizer(path):
    r = gguf.GGUFReader(path)
    out = []
    for k, f in r.fields.items():
        if not k.startswith("tokenizer."):
            continue
        main = f.types[0]
        if main == VT.ARRAY:
            sub = f.types[-1]
            if sub == VT.STRING:
                val = [bytes(f.parts[i]) for i in f.data]
            else:
                val = np.concatenate([f.parts[i] for i in f.data]).copy()
            out.append((k, val, main, sub))
        elif main == VT.STRING:
            out.append((k, bytes(f.parts[f.data[0]]), main, None))
        else:
            out.append((k, f.parts[f.data[0]][0].item(), main, None))
    vocab = next(len(v) for k, v, _, _ in out if k == "tokenizer.ggml.tokens")
    return out, vocab


def write(path, s, ftype, tensors, tok, vocab):
    a, kv = metadata(s, vocab)
    w = gguf.GGUFWriter(path, a)
    w.add_string("general.type", "model")
    # (not "phi3": llama.cpp's vocabulary loader keys Phi-3's token attributes on a name containing it, and this
    # vocabulary lacks Phi-3's tokens)
    w.add_string("general.name", f"dserve tiny {s.arch.replace('phi3', 'phi 3')} {ftype}")
    for k, v, t in kv:
        w.add_key_value(k, v, t)
    w.add_uint32("general.file_type", TYPES[ftype])
    w.add_uint32("general.quantization_version", 2)
    for k, v, main, sub in tok:
        if main == VT.ARRAY:
            w.add_key_value(k, list(v) if sub == VT.STRING else v.tolist(), main, sub)
        else:
            w.add_key_value(k, v, main)
    counts = {}
    for name, arr in tensors.items():
        data, qt = quantize(arr, tensor_type(name, arr, s, ftype))
        counts[qt.name] = counts.get(qt.name, 0) + 1
        w.add_tensor(name, data, raw_dtype=None if qt == QT.F32 else qt)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return counts


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--list-archs", action="store_true", help="print the architectures, one a line, and exit")
    ap.add_argument("--out", help="folder for ARCH-TYPE.gguf (or a file name with one --arch/--type)")
    ap.add_argument("--arch", action="append", choices=ARCHS, help="architecture (repeatable; default all)")
    ap.add_argument("--type", action="append", choices=list(TYPES), help="output type (repeatable; default all)")
    ap.add_argument("--vocab-from", default=None, help="GGUF whose tokenizer.* keys are copied "
                    "(default models/weights/SmolLM2-135M-Instruct.Q4_1.gguf)")
    ap.add_argument("--seed", type=int, default=40)
    ap.add_argument("--hidden", type=int, default=256)
    ap.add_argument("--layers", type=int, default=0)
    ap.add_argument("--heads", type=int, default=0)
    ap.add_argument("--kv-heads", type=int, default=0)
    ap.add_argument("--head-dim", type=int, default=0)
    ap.add_argument("--ff", type=int, default=0, help="dense feed-forward length")
    ap.add_argument("--experts", type=int, default=None, help="MoE architectures: expert count")
    ap.add_argument("--used", type=int, default=0, help="MoE architectures: experts used per token")
    ap.add_argument("--expert-ff", type=int, default=0, help="MoE architectures: one expert's feed-forward length")
    mla = ap.add_argument_group("deepseek2 (MLA; default: the architecture's, see MLA in the script)")
    mla.add_argument("--q-lora-rank", dest="mla_q_lora_rank", type=int, help="0: plain attn_q")
    mla.add_argument("--kv-lora-rank", dest="mla_kv_lora_rank", type=int)
    mla.add_argument("--rope-dim", dest="mla_rope", type=int, help="qk_rope_head_dim")
    mla.add_argument("--nope-dim", dest="mla_nope", type=int, help="qk_nope_head_dim")
    mla.add_argument("--v-dim", dest="mla_v_dim", type=int, help="v_head_dim")
    mla.add_argument("--kv-b", dest="mla_kv_b", choices=["split", "combined"])
    mla.add_argument("--dense-lead", dest="mla_dense_lead", type=int, help="leading dense layers")
    mla.add_argument("--gating", dest="mla_gating", choices=["softmax", "sigmoid"])
    mla.add_argument("--groups", dest="mla_groups", type=int, help="expert groups (0: none)")
    mla.add_argument("--groups-used", dest="mla_groups_used", type=int)
    mla.add_argument("--shared", dest="mla_shared", type=int, help="shared experts")
    mla.add_argument("--wscale", dest="mla_wscale", type=float, help="expert_weights_scale")
    mla.add_argument("--wnorm", dest="mla_wnorm", type=int, choices=[0, 1], help="expert_weights_norm")
    mla.add_argument("--yarn", dest="mla_yarn", type=int, choices=[0, 1])
    ap.add_argument("--logit-scale", type=float, default=1.0,
                    help="how peaked the logits are (larger: the top token takes more of the probability)")
    a = ap.parse_args()
    if a.list_archs:
        print("\n".join(ARCHS))
        return
    if not a.out:
        ap.error("--out is required")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    vocab_from = a.vocab_from or os.path.join(root, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")
    archs, types = a.arch or ARCHS, a.type or list(TYPES)
    one_file = a.out.endswith(".gguf")
    if one_file and (len(archs) != 1 or len(types) != 1):
        raise SystemExit("make_tiny_gguf: a .gguf --out needs exactly one --arch and one --type")
    if not one_file:
        os.makedirs(a.out, exist_ok=True)
    tok, vocab = read_tokenizer(vocab_from)
    for arch in archs:
        s = Shape(arch, a)
        tensors = build_tensors(s, a.seed, vocab, a.logit_scale)
        for ft in types:
            path = a.out if one_file else os.path.join(a.out, f"{arch}-{ft}.gguf")
            tmp = f"{path}.tmp{os.getpid()}"  # (tests may write the same file at once: same bytes)
            counts = write(tmp, s, ft, tensors, tok, vocab)
            os.replace(tmp, path)
            log(f"{path}: {s.layers} layers, hidden {s.d}, heads {s.heads}/{s.kv} of {s.hd}"
                + (f", MLA {s.mla}" if s.mla else "")
                + (f", {s.experts} experts of {s.eff}, {s.used} used" if s.experts else f", ff {s.ff}")
                + f"; tensors {counts}")


if __name__ == "__main__":
    main()
