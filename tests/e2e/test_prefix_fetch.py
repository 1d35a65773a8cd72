"""tests/e2e/test_prefix_fetch.py: with router.prefix_fetch, a prefill worker fetches the prefix the other prefill worker holds (and without it computes it); greedy output is the same."""

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
        # Routing by free KV blocks only: the prefix goes to one of the two idle prefill workers (the holder); the
        # blocks it then keeps make the other one the emptier, so the prefix + question goes there, while the holder
        # holds the prefix. Returns the answer and the (asker, holder) stats.
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
        held = [n for n in ("p0", "p1") if u.worker_stats(ports[n])["prefix_cached_blocks"] >= 10]
        self.assertEqual(len(held), 1, held)
        holder = held[0]
        asker = "p0" if holder == "p1" else "p1"
        # the router's view (the stats_ok that also carries the free blocks it routes by) shows the holder's kept blocks
        kept = u.worker_stats(ports[holder])["prefix_cached_blocks"]
        key = 'dserve:prefix_cache_blocks{worker="%s",tier="pool"}' % holder
        seen = u.wait_until(lambda: u.metrics(c.port).get(key, 0) >= kept, 30 * u.SCALE, step=0.1)
        self.assertTrue(seen, "the router never saw %s's %d kept blocks: %r" % (holder, kept, u.metrics(c.port)))
        got = u.complete(c.port, "completions", {"prompt": PREFIX + QUESTION, "max_tokens": 12})
        self.assertEqual(got["status"], 200, got)
        sa, sh = u.worker_stats(ports[asker]), u.worker_stats(ports[holder])
        self.assertGreaterEqual(sa["prefix_queries"], len(PREFIX + QUESTION), (sa, c.node.text()[-3000:]))
        c.close()
        return got, sa, sh

    def test_fetch_on_and_off(self):
        on, sa, sh = self.run_cluster(True)
        self.assertEqual(sa["prefix_fetches"], 1, sa)
        self.assertEqual(sa["prefix_fetched_blocks"], 10, sa)
        self.assertEqual(sh["prefix_served_blocks"], 10, sh)
        off, sa, sh = self.run_cluster(False)
        self.assertEqual(sa["prefix_fetches"], 0, sa)
        self.assertEqual(sa["prefix_fetched_blocks"], 0, sa)
        self.assertEqual(sh["prefix_served_blocks"], 0, sh)
        self.assertEqual(on["text"], off["text"])
        self.assertEqual(on["completion_tokens"], off["completion_tokens"])
        self.assertEqual(on["prompt_tokens"], off["prompt_tokens"])


if __name__ == "__main__":
    unittest.main()
