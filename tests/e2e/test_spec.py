"""tests/e2e/test_spec.py: speculative decoding never changes an answer: workers[].spec auto against off, over both
bundled models, one stream and several at once, greedy and seeded sampling, with logprobs, stop strings and a json_schema
grammar: identical texts, tokens and logprobs, with drafts accepted (the counters > 0, or the test proves nothing);
streamed the same; a decode worker fed by a prefill worker the same as a both worker; "speculative": false opts out."""

import json
import threading
import unittest

import e2e_util as u

TEXT = ("The quick brown fox jumps over the lazy dog. The quick brown fox jumps over the lazy dog. "
        "The quick brown fox jumps over the lazy dog.")
CODE = "for (int i = 0; i < n; i++) {\n  sum += a[i] * b[i];\n}\nfor (int i = 0; i < n; i++) {\n  sum += a[i];\n}\n"
CONFIG = '{"name": "w0", "role": "both", "threads": 1, "kv_budget_mb": 32}\n{"name": "w1", "role": "both"}'
SCHEMA = {"type": "object", "properties": {"name": {"type": "string"}, "items": {"type": "array", "items":
          {"type": "string"}}}, "required": ["name", "items"]}

# (path, body): extractive prompts (drafts hold), open ones (drafts fail), sampling settings, stops, a grammar
BODIES = [
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Repeat this text exactly: " + TEXT}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Copy this code:\n" + CODE}]}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Repeat: " + TEXT}], "temperature": 0.8,
                              "seed": 7}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Copy this config:\n" + CONFIG}],
                              "temperature": 1.0, "top_p": 0.9, "seed": 3, "frequency_penalty": 0.3}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Repeat this text: " + TEXT}],
                              "stop": ["lazy dog. The quick"], "temperature": 0}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "Write a short poem about the sea."}],
                              "temperature": 0.7, "seed": 11}),
    ("/v1/chat/completions", {"messages": [{"role": "user", "content": "List the fruits apple, pear, plum, apple, "
                                                                       "pear, plum as JSON with a name."}],
                              "temperature": 0, "response_format": {"type": "json_schema", "json_schema": {
                                  "name": "fruits", "schema": SCHEMA}}}),
    ("/v1/completions", {"prompt": CODE + CODE + "for (int i = 0;", "temperature": 0, "logprobs": 3}),
    ("/v1/completions", {"prompt": "apple banana cherry apple banana cherry apple banana", "temperature": 0.9,
                         "seed": 5, "max_tokens": 24}),
]


def bodies(chat_template=None):
    """BODIES with their defaults: greedy unless a body samples (an unseeded sampled request draws a new seed each
    time), chat with top-2 logprobs; chat_template for a model without its own (Gemma 3's GGUF)."""
    out = []
    for path, b in BODIES:
        b = dict(b)
        b.setdefault("max_tokens", 48)
        b.setdefault("temperature", 0)
        if path.endswith("chat/completions"):
            b.setdefault("logprobs", True)
            b.setdefault("top_logprobs", 2)
            if chat_template:
                b["chat_template"] = chat_template
        out.append((path, b))
    return out


def answer(port, path, body):
    st, r = u.post(port, path, body, timeout=300 * u.SCALE)
    if st != 200:
        raise AssertionError("%s %s: %d %s" % (path, json.dumps(body)[:80], st, r))
    ch = r["choices"][0]
    return {"text": ch.get("text", (ch.get("message") or {}).get("content")), "finish": ch["finish_reason"],
            "logprobs": ch.get("logprobs"), "completion_tokens": r["usage"]["completion_tokens"]}


def run_all(port, parallel, chat_template=None):
    """Every body's answer, `parallel` requests in flight at once."""
    todo = bodies(chat_template)
    out = [None] * len(todo)
    errors = []

    def worker(k):
        for i in range(k, len(todo), parallel):
            try:
                out[i] = answer(port, *todo[i])
            except Exception as ex:  # reported by the caller
                errors.append(repr(ex))

    th = [threading.Thread(target=worker, args=(k,)) for k in range(parallel)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    if errors:
        raise AssertionError(errors)
    return out


def spec_counts(port):
    m = u.metrics(port)
    return (m.get("dserve:spec_decode_num_drafts_total", 0), m.get("dserve:spec_decode_num_draft_tokens_total", 0),
            m.get("dserve:spec_decode_num_accepted_tokens_total", 0))


class Exactness(unittest.TestCase):
    MODEL = u.MODEL
    TEMPLATE = None

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        off = u.Cluster([{"name": "w0", "role": "both", "threads": 2, "spec": "off"}], tag="spec-off", model=cls.MODEL)
        cls.addClassCleanup(off.close)
        off.start()
        cls.want = run_all(off.port, 1, cls.TEMPLATE)
        cls.want_stream = u.stream(off.port, "chat", dict(bodies(cls.TEMPLATE)[0][1]))
        cls.off_counts = spec_counts(off.port)
        off.close()

    def check(self, got):
        for (path, body), w, g in zip(bodies(self.TEMPLATE), self.want, got):
            self.assertEqual(g, w, (path, json.dumps(body)[:120]))

    def test_off_drafts_nothing(self):
        self.assertEqual(self.off_counts, (0, 0, 0))

    def test_both_worker_one_and_several_streams(self):
        c = u.Cluster([{"name": "w0", "role": "both", "threads": 2}], tag="spec-auto", model=self.MODEL)  # auto: default
        self.addCleanup(c.close)
        c.start()
        self.check(run_all(c.port, 1, self.TEMPLATE))
        drafts, drafted, accepted = spec_counts(c.port)
        self.assertGreater(drafts, 0)
        self.assertGreater(accepted, 0, "no draft was accepted: the comparison proves nothing")
        self.assertLessEqual(accepted, drafted)
        self.check(run_all(c.port, 4, self.TEMPLATE))
        self.assertGreater(spec_counts(c.port)[2], accepted)
        s = u.stream(c.port, "chat", dict(bodies(self.TEMPLATE)[0][1]))
        for k in ("text", "finish_reason", "completion_tokens"):
            self.assertEqual(s[k], self.want_stream[k], k)
        # a client may opt out: its request drafts nothing, and answers the same
        before = spec_counts(c.port)
        path, body = bodies(self.TEMPLATE)[0]
        self.assertEqual(answer(c.port, path, dict(body, speculative=False)), self.want[0])
        self.assertEqual(spec_counts(c.port), before)
        st, r = u.post(c.port, path, dict(body, speculative="no"))
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "speculative", r)

    def test_decode_worker_after_a_handoff(self):
        c = u.Cluster([{"name": "p0", "role": "prefill", "threads": 1},
                       {"name": "d0", "role": "decode", "threads": 2, "spec": "auto"}],
                      disagg_threshold=0, tag="spec-1p1d", model=self.MODEL)
        self.addCleanup(c.close)
        c.start()
        self.check(run_all(c.port, 3, self.TEMPLATE))
        self.assertGreater(spec_counts(c.port)[2], 0, "no draft was accepted: the comparison proves nothing")


class ExactnessGemma3(Exactness):
    MODEL = u.GEMMA
    TEMPLATE = "gemma"  # its GGUF has no chat template


if __name__ == "__main__":
    unittest.main()
