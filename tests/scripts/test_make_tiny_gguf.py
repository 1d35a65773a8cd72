"""tests/scripts/test_make_tiny_gguf.py: scripts/make_tiny_gguf.py's K-quants decode (by the gguf package's
dequantizers, ggml's layouts) to within each format's rounding, and its Q4_K_M mix picks llama-quantize's types."""

import os
import sys
import unittest

try:
    import numpy as np
    import gguf
except ImportError:  # ctest runs with the system python: numpy and gguf live in the test venv
    VENV_PY = os.path.join(os.environ.get("DSERVE_VENV") or os.path.expanduser("~/.cache/dserve/venv"), "bin", "python")
    if os.access(VENV_PY, os.X_OK) and not os.environ.get("DSERVE_GGUF_REEXEC"):
        os.environ["DSERVE_GGUF_REEXEC"] = "1"
        os.execv(VENV_PY, [VENV_PY] + sys.argv)
    raise unittest.SkipTest("numpy and gguf are not installed (scripts/setup.sh makes the test venv)")

SRC = os.environ.get("DSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
sys.path.insert(0, os.path.join(SRC, "scripts"))
import make_tiny_gguf as m  # noqa: E402

QT = gguf.GGMLQuantizationType


class KQuants(unittest.TestCase):
    def rows(self):
        x = np.random.default_rng(7).standard_normal((48, 512)).astype(np.float32)
        x[3] = 0                      # an all-zero block: scales 0, no division by zero
        x[5, :256] = np.abs(x[5, :256])  # no negative value: the min is 0
        x[6, :256] *= 1000            # one block far larger than the rest of its row
        return x

    def test_round_trip(self):
        x = self.rows()
        # relative RMS error of a 4-, 5- and 6-bit grid over Gaussian sub-blocks, with room for the simple scales
        for qt, bound in ((QT.Q4_K, 0.09), (QT.Q5_K, 0.045), (QT.Q6_K, 0.022)):
            q, used = m.quantize(x, qt)
            self.assertEqual(used, qt)
            self.assertEqual(q.shape, (48, 2 * gguf.GGML_QUANT_SIZES[qt][1]))
            y = gguf.quants.dequantize(q, qt)
            for r in range(len(x)):
                err = np.sqrt(np.mean((y[r] - x[r]) ** 2, dtype=np.float64))
                rms = np.sqrt(np.mean(x[r] ** 2, dtype=np.float64))
                self.assertLessEqual(err, bound * rms + 1e-30, (qt.name, r))

    def test_fallback_for_rows_not_of_256(self):
        x = self.rows()[:, :320]
        for qt, fb in ((QT.Q4_K, QT.Q5_0), (QT.Q5_K, QT.Q5_1), (QT.Q6_K, QT.Q8_0)):
            _, used = m.quantize(x, qt)
            self.assertEqual(used, fb)

    def test_q4_k_m_mix(self):
        class A:  # make_tiny_gguf's defaults
            hidden, layers, heads, kv_heads, head_dim, ff, experts, used, expert_ff = 256, 8, 0, 0, 0, 0, None, 0, 0
        dense, moe = m.Shape("qwen2", A), m.Shape("mixtral", A)
        w2, w3 = np.zeros((4, 256), np.float32), np.zeros((2, 4, 256), np.float32)
        want = {  # llama-quantize, 8 layers: use_more_bits is layers 0, 3, 6, 7
            ("output.weight", dense): QT.Q6_K, ("token_embd.weight", dense): QT.Q4_K,
            ("blk.0.attn_v.weight", dense): QT.Q6_K, ("blk.1.attn_v.weight", dense): QT.Q4_K,
            ("blk.6.ffn_down.weight", dense): QT.Q6_K, ("blk.5.ffn_down.weight", dense): QT.Q4_K,
            ("blk.1.attn_k.weight", dense): QT.Q4_K, ("blk.1.attn_norm.weight", dense): QT.F32,
            ("blk.1.attn_k.weight", moe): QT.Q8_0, ("blk.1.attn_v.weight", moe): QT.Q8_0,
            ("blk.1.attn_output.weight", moe): QT.Q5_K, ("blk.1.ffn_gate_inp.weight", moe): QT.F32,
        }
        for (name, s), qt in want.items():
            self.assertEqual(m.tensor_type(name, w2, s, "Q4_K_M"), qt, name)
        self.assertEqual(m.tensor_type("blk.7.ffn_down_exps.weight", w3, moe, "Q4_K_M"), QT.Q6_K)
        self.assertEqual(m.tensor_type("blk.3.ffn_up_exps.weight", w3, moe, "Q4_K_M"), QT.Q4_K)
        phi3 = m.Shape("phi3", A)  # a fused qkv is quantized as attn_v is (llama-quantize's category_is_attn_v)
        self.assertEqual(m.tensor_type("blk.0.attn_qkv.weight", w2, phi3, "Q4_K_M"), QT.Q6_K)
        self.assertEqual(m.tensor_type("blk.1.attn_qkv.weight", w2, phi3, "Q4_K_M"), QT.Q4_K)
        tied = m.Shape("gemma3", A)
        self.assertEqual(m.tensor_type("token_embd.weight", w2, tied, "Q4_K_M"), QT.Q6_K)


if __name__ == "__main__":
    unittest.main()
