"""tests/archs/test_archs_layout.py: a prefill worker and a decode worker whose KV layouts differ (a deepseek2 tiny
GGUF, one latent row per position and layer, beside a llama one, K and V) are never paired: the router logs the refusal
naming both layouts, no prompt is handed from one to the other, and every request is served by the decode worker
computing its own prompt (docs/design.md, "The KV cache's geometry"). Real processes: two `dserve launch` nodes of one cluster whose
config files differ only in the model."""

import json
import os
import re
import shutil
import tempfile
import unittest

import tiny_util as t
import e2e_util as u

PROMPT = [(i * 41) % 3500 + 150 for i in range(40)]  # token ids: three blocks, enough to be handed off


class LayoutMismatch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        t.require_env()
        u.require_env(cls)

    def test_never_paired(self):
        llama = t.models("llama", ["Q8_0"])["Q8_0"]
        mla = t.models("deepseek2", ["Q8_0"])["Q8_0"]
        d = tempfile.mkdtemp(prefix="dserve-archs-layout-")
        self.addCleanup(shutil.rmtree, d, True)
        # Node "dec" runs the router and d0 on llama; node "pre" runs p0 on deepseek2 (its config's model).
        dec_cfg, pre_cfg = os.path.join(d, "dec.json"), os.path.join(d, "pre.json")
        port = u.local_config(dec_cfg, [{"name": "p0", "role": "prefill", "node": "pre", "kvxfer": {"backend": "shm"}},
                                        {"name": "d0", "role": "decode", "node": "dec", "kvxfer": {"backend": "shm"}}],
                              disagg_threshold=0, model=llama, router={"node": "dec"})
        with open(dec_cfg) as f:
            cfg = json.load(f)
        with open(pre_cfg, "w") as f:
            json.dump(dict(cfg, model=mla), f, indent=1)
        dec = u.Node(dec_cfg, node="dec")
        self.addCleanup(dec.stop)
        pre = u.Node(pre_cfg, node="pre")
        self.addCleanup(pre.stop)
        u.wait_serving([dec, pre], dec, ["p0", "d0"], port)
        # The router's line names both layouts: p0's latent row (1 part) and d0's K and V (2 parts).
        logged = u.wait_until(lambda: "KV layouts differ" in dec.text(), 10 * u.SCALE)
        self.assertTrue(logged, "the router did not log the unpaired layouts:\n" + dec.text()[-3000:])
        line = re.search(r"KV layouts differ: prefill worker p0 holds (\d+) layers x 1 part of (\d+) values, "
                         r"kv_type f16, blocks of 16, 1 layer group, decode worker d0 (\d+) layers x 2 parts of "
                         r"(\d+) values, kv_type f16, blocks of 16, 1 layer group: never paired", dec.text())
        self.assertIsNotNone(line, dec.text()[-3000:])
        m0 = u.metrics(port)
        p0 = pre.ports()["p0"]
        pushed0 = u.worker_stats(p0)["kv_bytes_pushed"]
        for _ in range(2):
            r = u.complete(port, "completions", {"prompt": PROMPT, "max_tokens": 4, "ignore_eos": True}, timeout=30)
            self.assertEqual(r["status"], 200, r)
            self.assertEqual(r["completion_tokens"], 4, r)
        # d0's `done` has been taken in when the decode-time histogram counts both (a handoff would count in the same
        # step): only then is "no handoff" a finding.
        dec_n = "dserve:request_decode_time_seconds_count"
        self.assertTrue(u.wait_until(lambda: u.metrics(port)[dec_n] >= m0[dec_n] + 2, 10 * u.SCALE), u.metrics(port))
        m1 = u.metrics(port)
        self.assertEqual(m1["dserve:kv_transfer_time_seconds_count"], m0["dserve:kv_transfer_time_seconds_count"],
                         "a handoff between a latent and a K/V pool")
        self.assertEqual(u.worker_stats(p0)["kv_bytes_pushed"], pushed0, "p0 pushed KV to d0")
        self.assertNotIn("KV layouts differ", pre.text(), "p0 was asked to hand off to d0 (its link refused it)")


if __name__ == "__main__":
    unittest.main()
