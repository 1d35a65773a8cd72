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
        # The prefix + question goes to the asker while the holder holds the prefix (u.prefix_fetch_cluster).
        # Returns the answer and the (asker, holder) stats.
        c, asker, holder = u.prefix_fetch_cluster(self, PREFIX, fetch, "fetch")
        ports = c.ports()
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
