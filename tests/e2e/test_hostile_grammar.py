"""tests/e2e/test_hostile_grammar.py: a schema too ambiguous to follow cheaply (issue 29's replay: n 8 of it made every step 640-760 ms) is ended with 400 grammar_too_complex after one bounded step, and a normal 100-token request beside it stays within 2x of its unloaded latency."""

import threading
import time
import unittest

import e2e_util as u

HOSTILE = {"type": "array", "items": {"type": "string", "pattern": "^(ab|cd|[e-y]{1,999}){1,999}$"}, "minItems": 1024}
NORMAL = {"messages": [{"role": "user", "content": "Name three colours."}], "max_tokens": 100, "temperature": 0,
          "ignore_eos": True}


class HostileGrammar(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        cls.c = u.Cluster([{"name": "w0", "role": "both", "threads": 2}], tag="grammar")
        cls.addClassCleanup(cls.c.close)
        cls.c.start()

    def normal(self):
        t0 = time.time()
        st, body = u.post(self.c.port, "/v1/chat/completions", NORMAL, timeout=120 * u.SCALE)
        self.assertEqual(st, 200, body)
        return time.time() - t0

    def test_hostile_schema_fails_fast_and_stalls_nobody(self):
        self.normal()  # warm-up
        unloaded = sorted(self.normal() for _ in range(3))[1]
        hostile = {}

        def send():
            # min_p 0 with top_k -1: no candidate filter, so every step needs the grammar's whole mask
            body = {"messages": [{"role": "user", "content": "List words."}], "n": 8, "temperature": 1, "top_k": -1,
                    "min_p": 0, "max_tokens": 60, "response_format": {"type": "json_schema",
                                                          "json_schema": {"name": "w", "schema": HOSTILE}}}
            t0 = time.time()
            hostile["status"], hostile["body"] = u.post(self.c.port, "/v1/chat/completions", body,
                                                        timeout=120 * u.SCALE)
            hostile["secs"] = time.time() - t0

        th = threading.Thread(target=send)
        th.start()
        time.sleep(0.05)
        beside = self.normal()
        th.join(150 * u.SCALE)
        self.assertFalse(th.is_alive(), "the hostile request never ended")
        self.assertEqual(hostile["status"], 400, hostile)
        self.assertEqual(hostile["body"]["error"]["code"], "grammar_too_complex", hostile)
        self.assertIn("simplify the schema", hostile["body"]["error"]["message"])
        print("normal request: unloaded %.2f s, beside the hostile schema %.2f s; hostile ended after %.2f s"
              % (unloaded, beside, hostile["secs"]))
        self.assertLess(beside, 2 * unloaded + 0.5 * u.SCALE, (unloaded, beside))
        self.normal()  # the worker still serves


if __name__ == "__main__":
    unittest.main()
