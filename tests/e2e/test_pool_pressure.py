"""tests/e2e/test_pool_pressure.py: a KV pool under pressure never refuses or fails a request that fits it (issue 29's replays): cached blocks give way to a new long prompt, and a 17-block pool serves 24 concurrent streams with the unloaded greedy text; a sequence that outgrows the whole pool ends at once with finish_reason "length" and its tokens (issue 39 item 6)."""

import os
import unittest

import e2e_util as u

WORDS = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa quebec "
         "romeo sierra tango uniform victor whiskey xray yankee zulu").split()


def long_prompt(seed, n_words):
    """A prompt of n_words words that shares no leading block with another seed's."""
    return "%d: " % seed + " ".join(WORDS[(seed * 7 + i * (seed + 3)) % len(WORDS)] for i in range(n_words))


class PoolPressure(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)

    def test_second_long_prompt_evicts_the_first(self):
        # kv_budget_mb 12: 34 blocks of SmolLM2's 360 KiB; each prompt takes ~26 of them and leaves ~25 cached.
        c = u.Cluster([{"name": "w0", "role": "both", "kv_budget_mb": 12}], tag="evict")
        self.addCleanup(c.close)
        c.start()
        for seed in range(4):
            r = u.complete(c.port, "completions", {"prompt": long_prompt(seed, 200), "max_tokens": 1})
            self.assertEqual(r["status"], 200, (seed, r))
            self.assertGreater(r["prompt_tokens"], 16 * 20, r)  # more than the pool's free blocks after the first

    def test_small_pool_many_streams(self):
        # kv_budget_mb 6: 17 blocks; a chat with 60 tokens out needs 5-6, so 24 streams contend (preemption), and the
        # second wave finds the pool full of the first wave's cached blocks (48 different prompts; the 200 with
        # DSERVE_POOL_PRESSURE_N=200, which CI leaves out for its time).
        n = int(os.environ.get("DSERVE_POOL_PRESSURE_N", "48"))
        prompts = ["%d. Write a short story about %s and %s." % (i, WORDS[i % 26], WORDS[(i * 5 + 3) % 26])
                   for i in range(n)]

        def body(i):
            return {"messages": [{"role": "user", "content": prompts[i]}], "max_tokens": 60}

        solo = u.Cluster([{"name": "w0", "role": "both", "kv_budget_mb": 256, "threads": 2}], tag="pool-solo")
        self.addCleanup(solo.close)
        solo.start()
        want = u.run_threads([(lambda i=i: u.complete(solo.port, "chat", body(i), timeout=200 * u.SCALE))
                              for i in range(n)], timeout=220 * u.SCALE)
        solo.close()
        for w in want:
            self.assertIsNotNone(w)
            self.assertEqual(w["status"], 200, w)
        c = u.Cluster([{"name": "w0", "role": "both", "kv_budget_mb": 6, "threads": 2}], tag="pool-small")
        self.addCleanup(c.close)
        c.start()
        res = []
        for w0 in range(0, n, 24):  # 24 in flight at a time
            res += u.run_threads([(lambda i=i: u.stream(c.port, "chat", body(i), timeout=200 * u.SCALE))
                                  for i in range(w0, min(n, w0 + 24))], timeout=220 * u.SCALE)
        bad = ["stream %d: %s" % (i, "did not finish" if r is None else (r["status"], r["error"]))
               for i, r in enumerate(res) if r is None or r["error"] is not None or not r["done"]]
        self.assertEqual(bad, [], "%d of %d streams failed" % (len(bad), n))
        for i, r in enumerate(res):
            self.assertEqual(r["text"], want[i]["text"], "stream %d" % i)
            self.assertEqual(r["finish_reason"], want[i]["finish_reason"], i)

    def test_sequence_that_outgrows_the_pool_ends_with_length(self):
        # kv_budget_tokens 256: 16 blocks. A prompt of P tokens (up to 255 fits) with max_tokens 200 and ignore_eos
        # reaches the pool's end after 257 - P tokens: the position 256 would need a 17th block, and there is nothing
        # to preempt. It used to stay running (kv 100%) until the request's deadline (504, its tokens lost); now it
        # ends at once with "length". The deadline is short so that the old behaviour fails fast.
        c = u.Cluster([{"name": "w0", "role": "both", "kv_budget_tokens": 256}], tag="outgrow",
                      router={"request_timeout_ms": int(15000 * u.SCALE)})
        self.addCleanup(c.close)
        c.start()
        body = {"prompt": long_prompt(5, 100), "max_tokens": 200, "ignore_eos": True}
        r = u.complete(c.port, "completions", body)
        self.assertEqual(r["status"], 200, r)
        p = r["prompt_tokens"]
        self.assertTrue(57 <= p <= 255, p)  # the prompt fits the pool, the prompt plus max_tokens does not
        self.assertEqual(r["finish_reason"], "length", r)
        self.assertEqual(r["completion_tokens"], 257 - p, r)
        self.assertNotEqual(r["text"], "")
        c.node.wait_for("finish_reason length after %d generated tokens (257 in all): the next one needs 17 KV "
                        "blocks and this worker's pool has 16" % (257 - p))
        s = u.stream(c.port, "completions", body)
        self.assertIsNone(s["error"], s)
        self.assertTrue(s["done"], s)
        self.assertEqual(s["finish_reason"], "length", s)
        self.assertEqual(s["completion_tokens"], 257 - p, s)
        self.assertEqual(s["text"], r["text"])
        c.node.wait_count("finish_reason length after", 2)

    def test_1p1d_decode_pool_limits_the_sequence(self):
        # 1P1D with a 256-token decode pool and a large prefill pool: a handed-off sequence that outgrows the decode
        # pool ends with "length" as on a both worker, and a prompt the decode pool can never hold is refused at once
        # (it used to wait for blocks until the request's deadline).
        c = u.Cluster([{"name": "p0", "role": "prefill", "kvxfer": {"backend": "shm"}},
                       {"name": "d0", "role": "decode", "kv_budget_tokens": 256, "kvxfer": {"backend": "shm"}}],
                      disagg_threshold=0, tag="outgrow-1p1d", router={"request_timeout_ms": int(15000 * u.SCALE)})
        self.addCleanup(c.close)
        c.start()
        r = u.complete(c.port, "completions", {"prompt": long_prompt(5, 100), "max_tokens": 200, "ignore_eos": True})
        self.assertEqual(r["status"], 200, r)
        p = r["prompt_tokens"]
        self.assertTrue(57 <= p <= 255, p)
        self.assertEqual((r["finish_reason"], r["completion_tokens"]), ("length", 257 - p), r)
        c.node.wait_for("finish_reason length after %d generated tokens" % (257 - p))
        r = u.complete(c.port, "completions", {"prompt": long_prompt(6, 200), "max_tokens": 5})
        self.assertEqual(r["status"], 400, r)
        self.assertEqual(r["error"]["error"]["code"], "context_length_exceeded", r)
        self.assertIn("KV blocks", r["error"]["error"]["message"], r)


if __name__ == "__main__":
    unittest.main()
