"""tests/e2e/test_prefix_fetch.py: with router.prefix_fetch, a prefill worker fetches the prefix another prefill worker holds (and without it computes it); greedy output is the same."""

import time
import unittest

import e2e_util as u

# Token ids (the completions API takes them as the prompt): a 160-token prefix (10 blocks) and a question after it.
PREFIX = [(i * 37) % 4000 + 100 for i in range(160)]
QUESTION = [(i * 53) % 3000 + 200 for i in range(24)]


class PrefixFetch(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)

    def run_cluster(self, fetch):
        # Routing by free KV blocks only: the first request goes to p1 (the first of two idle prefill workers); the
        # blocks it then keeps make p0 the emptier one, so the second request goes to p0 while p1 holds its prefix.
        c = u.Cluster([{"name": "p1", "role": "prefill", "kvxfer": {"backend": "tcp"}},
                       {"name": "p0", "role": "prefill", "kvxfer": {"backend": "tcp"}},
                       {"name": "d0", "role": "decode", "kvxfer": {"backend": "tcp"}}],
                      disagg_threshold=0, tag="fetch",
                      router={"prefix_fetch": fetch, "routing": {"overlap": 0, "queue": 0, "free": 1}})
        self.addCleanup(c.close)
        c.start()
        ports = c.ports()
        first = u.complete(c.port, "completions", {"prompt": PREFIX, "max_tokens": 2})
        self.assertEqual(first["status"], 200, first)
        self.assertGreaterEqual(u.worker_stats(ports["p1"])["prefix_cached_blocks"], 10)
        time.sleep(3.5)  # the router's stats (every second) now show p1's kept blocks
        got = u.complete(c.port, "completions", {"prompt": PREFIX + QUESTION, "max_tokens": 12})
        self.assertEqual(got["status"], 200, got)
        s0, s1 = u.worker_stats(ports["p0"]), u.worker_stats(ports["p1"])
        self.assertGreaterEqual(s0["prefix_queries"], len(PREFIX + QUESTION), (s0, c.node.text()[-3000:]))  # on p0
        c.close()
        return got, s0, s1

    def test_fetch_on_and_off(self):
        on, s0, s1 = self.run_cluster(True)
        self.assertEqual(s0["prefix_fetches"], 1, s0)
        self.assertEqual(s0["prefix_fetched_blocks"], 10, s0)
        self.assertEqual(s1["prefix_served_blocks"], 10, s1)
        off, s0, s1 = self.run_cluster(False)
        self.assertEqual(s0["prefix_fetches"], 0, s0)
        self.assertEqual(s0["prefix_fetched_blocks"], 0, s0)
        self.assertEqual(s1["prefix_served_blocks"], 0, s1)
        self.assertEqual(on["text"], off["text"])
        self.assertEqual(on["completion_tokens"], off["completion_tokens"])
        self.assertEqual(on["prompt_tokens"], off["prompt_tokens"])


if __name__ == "__main__":
    unittest.main()
