"""tests/e2e/test_router_memory.py: the router's memory comes back after large answers (issue 29: n 64 with top_logprobs 20 raised its RSS from 167 to 294 MB for good): non-stream logprobs are kept as text, and large answers are mmapped and returned."""

import unittest

import e2e_util as u


def rss_mb(pid):
    with open("/proc/%d/status" % pid) as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024.0
    return -1.0


class RouterMemory(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        if u.SCALE > 1:  # the sanitize build (DSERVE_TIMEOUT_SCALE): ASan keeps freed memory in its quarantine
            raise unittest.SkipTest("RSS says nothing under AddressSanitizer (freed memory stays in its quarantine)")

    def test_large_logprob_answers_give_their_memory_back(self):
        c = u.Cluster([{"name": "w0", "role": "both", "threads": 2, "kv_budget_mb": 64}], tag="rss",
                      router={"max_n": 16})
        self.addCleanup(c.close)
        c.start()
        pid = c.node.child_pid("router")
        body = {"messages": [{"role": "user", "content": "Tell me a story."}], "n": 16, "max_tokens": 60,
                "logprobs": True, "top_logprobs": 20, "temperature": 1, "ignore_eos": True}
        small = dict(body, n=1, max_tokens=2)
        st, b = u.post(c.port, "/v1/chat/completions", small, timeout=300 * u.SCALE)  # the router has served one
        self.assertEqual(st, 200, b)
        before = rss_mb(pid)
        for _ in range(5):
            st, b = u.post(c.port, "/v1/chat/completions", body, timeout=300 * u.SCALE)
            self.assertEqual(st, 200, b)
            self.assertEqual(len(b["choices"]), 16)
            lp = b["choices"][0]["logprobs"]["content"]
            self.assertEqual(len(lp), 60)
            self.assertEqual(len(lp[0]["top_logprobs"]), 20)
        after = rss_mb(pid)
        print("router RSS %.1f MB before 5 answers of 16 x 60 tokens with 20 top logprobs, %.1f MB after"
              % (before, after))
        self.assertLess(after - before, 8.0, (before, after))


if __name__ == "__main__":
    unittest.main()
