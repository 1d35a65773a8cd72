"""tests/e2e/test_1p1d.py: greedy outputs through one prefill + one decode worker (kvxfer shm, tcp and nixl) equal the colocated worker's."""

import glob
import json
import os
import threading
import time
import unittest

import e2e_util as u

# (kind, body): chat and completions; one prompt long enough to span several 16-token KV blocks.
LONG = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a wooden press adapted from those used for wine. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell sharply. "
        "Summarize the consequences of this invention in one sentence:")
REQUESTS = [
    ("chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12}),
    ("chat", {"messages": [{"role": "system", "content": "You are terse."},
                           {"role": "user", "content": "Name three primary colors."}], "max_tokens": 16}),
    ("completions", {"prompt": "The capital of France is", "max_tokens": 10}),
    ("completions", {"prompt": LONG, "max_tokens": 12}),
]


class OneP1D(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        co = u.Cluster([{"name": "w0", "role": "both"}], tag="coloc")
        cls.addClassCleanup(co.close)
        co.start()
        cls.expected = [u.complete(co.port, k, b) for k, b in REQUESTS]
        cls.expected_stream = u.stream(co.port, *REQUESTS[3])
        co.close()
        for e in cls.expected:
            assert e["status"] == 200, e

    def check_backend(self, backend):
        c = u.Cluster([{"name": "p0", "role": "prefill", "max_batch_tokens": 32, "kvxfer": {"backend": backend}},
                       {"name": "d0", "role": "decode", "kvxfer": {"backend": backend}}],
                      disagg_threshold=0, tag="1p1d-" + backend)
        self.addCleanup(c.close)
        c.start()
        m0 = u.metrics(c.port)
        for (kind, body), want in zip(REQUESTS, self.expected):
            got = u.complete(c.port, kind, body)
            self.assertEqual(got["status"], 200, got)
            self.assertEqual(got["text"], want["text"], (kind, body))
            self.assertEqual(got["completion_tokens"], want["completion_tokens"], (kind, body))
            self.assertEqual(got["prompt_tokens"], want["prompt_tokens"], (kind, body))
            self.assertEqual(got["finish_reason"], want["finish_reason"], (kind, body))
        s = u.stream(c.port, *REQUESTS[3])
        self.assertIsNone(s["error"], s)
        self.assertTrue(s["done"], s)
        self.assertEqual(s["text"], self.expected_stream["text"])
        self.assertEqual(s["completion_tokens"], self.expected_stream["completion_tokens"])
        # Every request was disaggregated: KV moved for each, and the transfer time was observed per request.
        m1 = u.metrics(c.port)
        n = len(REQUESTS) + 1
        self.assertEqual(m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"], n)
        self.assertGreater(m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"], 0)

    def test_shm(self):
        self.check_backend("shm")

    def test_tcp(self):
        self.check_backend("tcp")

    def test_nixl(self):
        # Where kvxfer looks for NIXL's C API (kvxfer/kvx_nixl.c): DSERVE_NIXL_LIB, else the venv's nixl-cu12 wheel.
        lib = os.environ.get("DSERVE_NIXL_LIB")
        venv = (os.environ.get("DSERVE_VENV") or os.path.join(os.environ.get("DSERVE_CACHE") or
                os.path.expanduser("~/.cache/dserve"), "venv"))
        if not lib and not glob.glob(os.path.join(venv, "lib/python3*/site-packages/.nixl_cu1*.mesonpy.libs/libnixl_capi.so")):
            self.skipTest("nixl absent: no DSERVE_NIXL_LIB and no nixl-cu12 wheel in %s (scripts/setup.sh installs it)" % venv)
        self.check_backend("nixl")


class AutoDisagg(unittest.TestCase):
    """Policy auto (the default): a prompt is handed off only while the decode worker is busy."""

    def test_idle_decode_prefills_itself_busy_one_hands_off(self):
        u.require_env(self)
        c = u.Cluster([{"name": "p0", "role": "prefill", "kvxfer": {"backend": "shm"}},
                       {"name": "d0", "role": "decode", "kvxfer": {"backend": "shm"}}],
                      disagg_threshold=16, router={"disagg_policy": "auto"}, tag="1p1d-auto")
        self.addCleanup(c.close)
        c.start()
        transfers = lambda: u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"]
        m0 = transfers()
        got = u.complete(c.port, "completions", {"prompt": LONG, "max_tokens": 4})
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(transfers() - m0, 0, "an idle decode worker should have prefilled the prompt itself")
        # A long stream keeps d0 decoding; a prompt sent meanwhile goes through p0.
        busy = {"prompt": "Count from one to one hundred:", "max_tokens": 600, "ignore_eos": True}
        t = threading.Thread(target=lambda: busy.update(result=u.complete(c.port, "completions", dict(busy))))
        g0 = u.metrics(c.port)["dserve:generation_tokens_total"]
        t.start()
        deadline = time.time() + 60 * u.SCALE
        while u.metrics(c.port)["dserve:generation_tokens_total"] < g0 + 2 and time.time() < deadline:
            time.sleep(0.05)
        # (not LONG again: d0 holds its blocks now, and a prompt it has cached is not worth a handoff)
        got = u.complete(c.port, "completions", {"prompt": "In brief. " + LONG, "max_tokens": 4})
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(transfers() - m0, 1, "with d0 busy decoding, the prompt should have been handed off")
        got = u.complete(c.port, "completions", {"prompt": LONG, "max_tokens": 4})
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(transfers() - m0, 1, "d0 holds LONG's blocks: the few tokens left are not worth a handoff")
        self.assertTrue(t.is_alive(), "the busy stream ended before the checks: they did not test a busy d0")
        t.join()
        self.assertEqual(busy["result"]["status"], 200, busy["result"])


def gemma_facts(test, n):
    """n sentences of about 20 Gemma tokens each, for prompts past its 512-token window; skips test without the model."""
    u.require_env(test)
    if not os.path.exists(u.GEMMA):
        test.skipTest("the model %s is missing: run scripts/setup.sh" % u.GEMMA)
    return ["Fact %d: the %s river is %d kilometres long and crosses %d towns." % (
        i, ["red", "green", "blue", "grey", "white", "black"][i % 6], 100 + 37 * i, 3 + i % 9) for i in range(n)]


class SlidingWindowHandoff(unittest.TestCase):
    """Gemma 3: a handoff sends a sliding-window layer only the blocks it reads again, and the output is the
    colocated one; the decode worker does not reuse those blocks for a shorter prompt that shares their prefix."""

    # Gemma 3 270M: 18 layers, every 6th global (5, 11, 17), window 512; one KV head of 256, f16 K and V, 16 tokens
    # per block: 2 x 16 x 256 x 2 bytes per layer and block.
    LAYERS, GLOBAL, WINDOW, BS, LAYER_BLOCK_BYTES = 18, 3, 512, 16, 2 * 16 * 256 * 2

    def wait_for(self, cond, secs=10):
        deadline = time.time() + secs * u.SCALE
        while not cond() and time.time() < deadline:
            time.sleep(0.1)

    def test_window_only_handoff(self):
        facts = gemma_facts(self, 34)
        a = {"prompt": " ".join(facts) + " Of all these rivers, the longest is", "max_tokens": 8}
        b = {"prompt": " ".join(facts[:27]) + " So the shortest river is", "max_tokens": 8}
        co = u.Cluster([{"name": "w0", "role": "both", "threads": 2, "kv_budget_mb": 64}], model=u.GEMMA,
                       tag="swa-coloc")
        self.addCleanup(co.close)
        co.start()
        want = [u.complete(co.port, "completions", x) for x in (a, b)]
        co.close()
        for w in want:
            self.assertEqual(w["status"], 200, w)
        n_a, n_b = want[0]["prompt_tokens"], want[1]["prompt_tokens"]
        live_a, live_b = (n_a - self.WINDOW) // self.BS, (n_b - self.WINDOW) // self.BS
        # A's local layers skip blocks B's would read: reusing A's blocks for B would read KV never sent.
        self.assertGreater(live_a, live_b + 2, (n_a, n_b))
        self.assertGreater(live_b, 0, (n_a, n_b))
        c = u.Cluster([{"name": "p0", "role": "prefill", "kv_budget_mb": 64, "kvxfer": {"backend": "shm"}},
                       {"name": "d0", "role": "decode", "kv_budget_mb": 64, "prefix_cache_mb": 32,
                        "kvxfer": {"backend": "shm"}}],
                      disagg_threshold=0, model=u.GEMMA, tag="swa-1p1d")
        self.addCleanup(c.close)
        c.start()
        # Handoffs are counted when the decode worker's `done` comes, which may be after the response, and pushes
        # when the prefill worker's stats come (every second): wait for start()'s one-token request to be counted
        # both ways, then for A's.
        m = lambda name: u.metrics(c.port).get(name, 0)
        handoffs = lambda: m("dserve:kv_transfer_time_seconds_count")
        self.wait_for(lambda: handoffs() >= 1 and
                      m("dserve:kv_pushed_bytes_total") >= m("dserve:kv_transfer_bytes_total") > 0)
        m0 = u.metrics(c.port)
        got = u.complete(c.port, "completions", a)
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["text"], want[0]["text"])
        n_blocks = (n_a + self.BS - 1) // self.BS
        sent = (self.GLOBAL * n_blocks + (self.LAYERS - self.GLOBAL) * (n_blocks - live_a)) * self.LAYER_BLOCK_BYTES
        why = "window-only handoff of %d tokens: %d of %d bytes expected" % (
            n_a, sent, self.LAYERS * n_blocks * self.LAYER_BLOCK_BYTES)
        # what the decode worker counted (with the request) and what the prefill worker wrote (its stats, each second)
        counted = lambda name: u.metrics(c.port)[name] - m0[name]
        self.wait_for(lambda: handoffs() >= m0["dserve:kv_transfer_time_seconds_count"] + 1)
        self.assertEqual(counted("dserve:kv_transfer_bytes_total"), sent, why)
        self.wait_for(lambda: counted("dserve:kv_pushed_bytes_total") >= sent)  # prefill stats: every second
        self.assertEqual(counted("dserve:kv_pushed_bytes_total"), sent, why)
        got = u.complete(c.port, "completions", b)
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["text"], want[1]["text"], "B after A: the decode worker reused blocks A did not fill")


class SlidingWindowPages(unittest.TestCase):
    """Gemma 3: a prompt longer than the pool would hold if every layer kept every block is served, colocated and
    1P1D, with the text of a large pool: the local layers give back the pages their 512-token window passed."""

    def test_long_prompt_in_a_small_pool(self):
        facts = gemma_facts(self, 56)
        req = {"prompt": " ".join(facts) + " Of all these rivers, the longest is", "max_tokens": 8}
        big = u.Cluster([{"name": "w0", "role": "both", "threads": 2, "kv_budget_mb": 64}], model=u.GEMMA,
                        tag="swa-big")
        self.addCleanup(big.close)
        big.start()
        want = u.complete(big.port, "completions", req)
        big.close()
        self.assertEqual(want["status"], 200, want)
        # 14 MiB: 49 blocks of 288 KiB (18 layers' K and V for 16 positions), fewer than the prompt's; in pages of 3
        # layers, 298 pages: every block's global page and 5 window pages for the (512 + 128) / 16 + 2 blocks that a
        # 128-token step's window reads at most
        n_blocks = (want["prompt_tokens"] + 1 + 15) // 16
        self.assertGreater(n_blocks, 14 * 1024 // 288, want["prompt_tokens"])
        small = {"kv_budget_mb": 14, "max_batch_tokens": 128, "prefix_cache_mb": 2}
        co = u.Cluster([dict({"name": "w0", "role": "both", "threads": 2}, **small)], model=u.GEMMA, tag="swa-small")
        self.addCleanup(co.close)
        co.start()
        got = u.complete(co.port, "completions", req)
        co.close()
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["text"], want["text"])
        pd = u.Cluster([dict({"name": "p0", "role": "prefill", "kvxfer": {"backend": "tcp"}}, **small),
                        dict({"name": "d0", "role": "decode", "kvxfer": {"backend": "tcp"}}, **small)],
                       disagg_threshold=0, model=u.GEMMA, tag="swa-small-1p1d")
        self.addCleanup(pd.close)
        pd.start()
        got = u.complete(pd.port, "completions", req)
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["text"], want["text"])
        # a prompt that even a window's pages cannot hold is refused at once, with the reason
        huge = {"prompt": " ".join(facts * 6), "max_tokens": 4}
        got = u.complete(pd.port, "completions", huge)
        self.assertEqual(got["status"], 400, got)
        self.assertIn("KV blocks", json.dumps(got), got)


if __name__ == "__main__":
    unittest.main()
