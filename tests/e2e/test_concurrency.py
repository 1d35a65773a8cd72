"""tests/e2e/test_concurrency.py: 2 prefill + 2 decode workers under 32 concurrent streaming clients, every output the colocated greedy one."""

import unittest

import e2e_util as u

PROMPTS = [
    "The capital of France is",
    "List the planets of the solar system:",
    "def fibonacci(n):",
    "Water boils at a temperature of",
]
MAX_TOKENS = 10
N_CLIENTS = 32


class TwoP2D(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        co = u.Cluster([{"name": "w0", "role": "both"}], tag="coloc")
        cls.addClassCleanup(co.close)
        co.start()
        cls.expected = [u.complete(co.port, "completions", {"prompt": p, "max_tokens": MAX_TOKENS}) for p in PROMPTS]
        co.close()
        for e in cls.expected:
            assert e["status"] == 200, e

    def test_32_streams(self):
        tcp = {"backend": "tcp"}
        c = u.Cluster([{"name": "p0", "role": "prefill", "kvxfer": tcp}, {"name": "p1", "role": "prefill", "kvxfer": tcp},
                       {"name": "d0", "role": "decode", "kvxfer": tcp}, {"name": "d1", "role": "decode", "kvxfer": tcp}],
                      disagg_threshold=0, tag="2p2d")
        self.addCleanup(c.close)
        c.start()
        ports = c.ports()
        before = {d: u.worker_stats(ports[d])["finished"] for d in ("d0", "d1")}
        m0 = u.metrics(c.port)

        def client(i):
            return lambda: u.stream(c.port, "completions", {"prompt": PROMPTS[i % len(PROMPTS)],
                                                            "max_tokens": MAX_TOKENS}, timeout=150)

        res = u.run_threads([client(i) for i in range(N_CLIENTS)], timeout=160)
        bad = ["client %d: %s" % (i, "did not finish" if r is None else (r["status"], r["error"]))
               for i, r in enumerate(res) if r is None or r["error"] is not None]
        self.assertEqual(bad, [], "%d of %d streams failed" % (len(bad), N_CLIENTS))
        for i, r in enumerate(res):
            want = self.expected[i % len(PROMPTS)]
            self.assertIsNotNone(r, "client %d did not finish" % i)
            self.assertEqual(r["status"], 200, r)
            self.assertIsNone(r["error"], (i, r["error"]))
            self.assertTrue(r["done"], i)
            self.assertEqual(r["text"], want["text"], "client %d (prompt %d)" % (i, i % len(PROMPTS)))
            self.assertEqual(r["completion_tokens"], want["completion_tokens"], i)
            self.assertEqual(r["finish_reason"], want["finish_reason"], i)
        # Both decode workers served some of them (their own `stats` counters), and every one was disaggregated.
        after = {d: u.worker_stats(ports[d])["finished"] for d in ("d0", "d1")}
        served = {d: after[d] - before[d] for d in after}
        self.assertEqual(sum(served.values()), N_CLIENTS, served)
        for d in served:
            self.assertGreater(served[d], 0, served)
        m1 = u.metrics(c.port)
        self.assertEqual(m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"],
                         N_CLIENTS)
        self.assertEqual(m1['dserve:request_success_total{finished_reason="length"}'] +
                         m1['dserve:request_success_total{finished_reason="stop"}'] -
                         m0['dserve:request_success_total{finished_reason="length"}'] -
                         m0['dserve:request_success_total{finished_reason="stop"}'], N_CLIENTS)


if __name__ == "__main__":
    unittest.main()
