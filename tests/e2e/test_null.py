"""tests/e2e/test_null.py: the null model (issue 44): `dserve serve null` streams through the HTTP API with its
tokenizer, stop strings, grammars and seeds; a 1P1D null cluster gives the colocated text and moves exactly
prompt tokens x null_kv_bytes_per_token of KV, and a repeated prompt the blocks the decode worker lacks, counted alike
on both sides; a path is never taken for the null model."""

import json
import os
import shutil
import subprocess
import tempfile
import threading
import unittest

import e2e_util as u

WORD = " togo"  # one token of the null vocabulary: PROMPT is exactly 32 tokens (no BOS), two whole KV blocks
PROMPT = WORD * 32
KV_BYTES = 8192  # null_kv_bytes_per_token of the 1P1D cluster (a multiple of 1024)


class ServeNull(unittest.TestCase):
    """`dserve serve null`, colocated, as a user starts it: no model file, no config."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        cls.dir = tempfile.mkdtemp(prefix="dserve-null-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.port = u.free_ports(1)[0]
        cls.srv = u.Proc(["serve", "null", "--port", str(cls.port), "-t", "1"],
                         os.path.join(cls.dir, "out.log"), cwd=cls.dir)
        cls.addClassCleanup(cls.srv.stop, 20 * u.SCALE)
        cls.srv.wait_for("ready (router", 60 * u.SCALE)

    def test_models_names_it_null(self):
        st, body = u.get(self.port, "/v1/models")
        self.assertEqual(st, 200, body)
        self.assertEqual(json.loads(body)["data"][0]["id"], "null")

    def test_streams_words_and_greedy_is_deterministic(self):
        a = u.stream(self.port, "chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12})
        self.assertIsNone(a["error"], a)
        self.assertTrue(a["done"], a)
        self.assertEqual(a["completion_tokens"], 12)
        self.assertEqual(a["finish_reason"], "length")
        words = a["text"].split()
        self.assertEqual(len(words), 12, a["text"])
        self.assertTrue(all(w.isalpha() and len(w) == 4 for w in words), a["text"])
        self.assertGreater(a["events"], 12)  # a chunk per token, then the finish and the usage
        b = u.stream(self.port, "chat", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 12})
        self.assertEqual(a["text"], b["text"])
        c = u.stream(self.port, "chat", {"messages": [{"role": "user", "content": "hello"}], "max_tokens": 12})
        self.assertNotEqual(a["text"], c["text"])  # the logits depend on the tokens

    def test_stream_of_several_choices_gets_every_token(self):
        # A step's token_batch holds all three choices: the router wakes the stream's reader once for them, after
        # letting go of its lock (router/req.c, rtr_wake_reader_locked); every choice's every token still arrives.
        per = {}

        def on_event(i, o):
            for ch in o.get("choices", []):
                per.setdefault(ch["index"], []).append(ch.get("text") or "")
            return False
        a = u.stream(self.port, "completions", {"prompt": PROMPT, "max_tokens": 16, "n": 3}, on_event=on_event)
        self.assertIsNone(a["error"], a)
        self.assertTrue(a["done"], a)
        self.assertEqual(a["completion_tokens"], 48)
        want = u.complete(self.port, "completions", {"prompt": PROMPT, "max_tokens": 16})["text"]
        self.assertEqual(sorted(per), [0, 1, 2])
        for i in range(3):
            self.assertEqual("".join(per[i]), want, i)
            self.assertEqual(len([p for p in per[i] if p]), 16, per[i])

    def test_same_seed_same_tokens(self):
        def run(seed):
            st, b = u.post(self.port, "/v1/completions", {"prompt": "x", "max_tokens": 16, "temperature": 1.0,
                                                          "seed": seed})
            self.assertEqual(st, 200, b)
            return b["choices"][0]["text"]
        self.assertEqual(run(11), run(11))
        self.assertNotEqual(run(11), run(12))

    def test_tokenize_detokenize_round_trip(self):
        text = "Hello, world! {\"a\": [1, 2]}" + WORD + " caf\u00e9\n"
        st, t = u.post(self.port, "/tokenize", {"prompt": text})
        self.assertEqual(st, 200, t)
        st, d = u.post(self.port, "/detokenize", {"tokens": t["tokens"]})
        self.assertEqual(st, 200, d)
        self.assertEqual(d["prompt"], text)
        st, t = u.post(self.port, "/tokenize", {"prompt": PROMPT})
        self.assertEqual(t["count"], 32)

    def test_stop_string_and_grammar(self):
        full = u.complete(self.port, "completions", {"prompt": PROMPT, "max_tokens": 10})
        stop = full["text"].split()[4]
        got = u.complete(self.port, "completions", {"prompt": PROMPT, "max_tokens": 10, "stop": [stop]})
        self.assertEqual(got["finish_reason"], "stop", got)
        self.assertEqual(got["text"], full["text"][:full["text"].index(stop)])
        schema = {"type": "object", "properties": {"n": {"type": "integer"}, "ok": {"type": "boolean"}},
                  "required": ["n", "ok"], "additionalProperties": False}
        st, b = u.post(self.port, "/v1/chat/completions", {
            "messages": [{"role": "user", "content": "json"}], "max_tokens": 64, "temperature": 0,
            "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema}}})
        self.assertEqual(st, 200, b)
        self.assertEqual(b["choices"][0]["finish_reason"], "stop", b)
        got = json.loads(b["choices"][0]["message"]["content"])
        self.assertIsInstance(got["n"], int)
        self.assertIsInstance(got["ok"], bool)


class NullOneP1D(unittest.TestCase):
    """A prefill and a decode null worker: the colocated text, and the KV moved is the prompt's tokens x the bytes a
    token of the null model's cache takes."""

    def test_handoff_moves_tokens_times_kv_bytes(self):
        u.require_env(self)
        knobs = {"null_step_ms": 2, "null_kv_bytes_per_token": KV_BYTES}
        co = u.Cluster([dict(knobs, name="w0", role="both")], tag="null-coloc", model="null")
        self.addCleanup(co.close)
        co.start()
        body = {"prompt": PROMPT, "max_tokens": 8}
        want = u.stream(co.port, "completions", body)
        self.assertIsNone(want["error"], want)
        co.close()
        c = u.Cluster([dict(knobs, name="p0", role="prefill", kvxfer={"backend": "tcp"}),
                       dict(knobs, name="d0", role="decode", kvxfer={"backend": "tcp"})],
                      disagg_threshold=0, tag="null-1p1d", model="null")
        self.addCleanup(c.close)
        c.start()
        # the prefill worker's count of bytes it wrote comes with its stats (every second): let start()'s warm-up
        # request's reach the router first
        settled = lambda m: m["dserve:kv_pushed_bytes_total"] == m["dserve:kv_transfer_bytes_total"] > 0
        self.assertTrue(u.wait_until(lambda: settled(u.metrics(c.port)), 10 * u.SCALE), u.metrics(c.port))
        m0 = u.metrics(c.port)
        got = u.stream(c.port, "completions", body)
        self.assertIsNone(got["error"], got)
        self.assertEqual(got["text"], want["text"])
        self.assertEqual(got["completion_tokens"], 8)
        m1 = u.metrics(c.port)
        moved = 32 * KV_BYTES
        self.assertEqual(m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"], 1)
        self.assertEqual(m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"], moved)
        pushed = lambda: u.metrics(c.port)["dserve:kv_pushed_bytes_total"] - m0["dserve:kv_pushed_bytes_total"]
        self.assertTrue(u.wait_until(lambda: pushed() >= moved, 10 * u.SCALE), pushed())
        self.assertEqual(pushed(), moved)


class NullRepeatedHandoff(unittest.TestCase):
    """A repeated prompt whose leading blocks the decode worker caches: the prefill worker pushes only the others, and
    its count (dserve:kv_pushed_bytes_total) is the decode worker's (dserve:kv_transfer_bytes_total). The block table
    is made to come before the prefill worker's first step (it is busy with a long prompt), where it once forgot the
    table's skip_blocks and wrote, and counted, the decode worker's cached blocks again."""

    def test_pushed_equals_transferred(self):
        u.require_env(self)
        knobs = {"null_step_ms": 2, "null_kv_bytes_per_token": KV_BYTES}
        c = u.Cluster([dict(knobs, name="p0", role="prefill", kvxfer={"backend": "tcp"},
                            null_prefill_us_per_token=1500),
                       dict(knobs, name="d0", role="decode", kvxfer={"backend": "tcp"})],
                      disagg_threshold=0, tag="null-repeat", model="null")
        self.addCleanup(c.close)
        c.start()
        p0 = c.ports()["p0"]
        body = {"prompt": PROMPT + WORD, "max_tokens": 2}  # 33 tokens: two whole blocks the decode worker keeps
        self.assertEqual(u.complete(c.port, "completions", body)["status"], 200)
        n = lambda: u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"]
        pushed0 = u.worker_stats(p0)["kv_bytes_pushed"]  # the router has it with p0's next stats (every second)
        seen = lambda: u.metrics(c.port)["dserve:kv_pushed_bytes_total"]
        self.assertTrue(u.wait_until(lambda: seen() == pushed0, 10 * u.SCALE))
        m0 = u.metrics(c.port)
        long = {"prompt": WORD * 1000, "max_tokens": 1}  # 1.5 s of prefill
        got = [None, None]

        def send(i, b):
            got[i] = u.complete(c.port, "completions", b)

        t = threading.Thread(target=send, args=(0, long), daemon=True)
        t.start()
        self.assertTrue(u.wait_until(lambda: u.worker_stats(p0)["running"] >= 1, 10 * u.SCALE))
        send(1, body)
        t.join(30 * u.SCALE)
        self.assertEqual([g and g["status"] for g in got], [200, 200], got)
        self.assertTrue(u.wait_until(lambda: n() >= m0["dserve:kv_transfer_time_seconds_count"] + 2, 10 * u.SCALE))
        moved = u.metrics(c.port)["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"]
        # each skips the two blocks the decode worker keeps (the long prompt starts with them too): 63 - 2, then 3 - 2
        self.assertEqual(moved, ((1000 + 15) // 16 - 2 + 1) * 16 * KV_BYTES)
        self.assertEqual(u.worker_stats(p0)["kv_bytes_pushed"] - pushed0, moved,
                         "the prefill worker pushed other bytes than the decode worker counted")
        pushed = lambda: u.metrics(c.port)["dserve:kv_pushed_bytes_total"] - m0["dserve:kv_pushed_bytes_total"]
        self.assertTrue(u.wait_until(lambda: pushed() >= moved, 10 * u.SCALE), pushed())  # its next stats
        self.assertEqual(pushed(), moved)


class NullPacedStreams(unittest.TestCase):
    """router.stream_flush_ms: a stream's connection takes its queued tokens at most that often, so one wake of its
    thread sends several steps' tokens at once (docs/scale.md); the text is the unpaced one."""

    def test_tokens_come_in_flushes_with_the_same_text(self):
        u.require_env(self)
        w = [{"name": "w0", "role": "both", "null_step_ms": 10, "spec": "off"}]
        body = {"prompt": PROMPT, "max_tokens": 40}
        co = u.Cluster(w, tag="null-unpaced", model="null")
        self.addCleanup(co.close)
        co.start()
        want = u.stream(co.port, "completions", body)
        self.assertIsNone(want["error"], want)
        co.close()
        c = u.Cluster(w, tag="null-paced", model="null", router={"stream_flush_ms": 100})
        self.addCleanup(c.close)
        c.start()
        got = u.stream(c.port, "completions", body)
        self.assertIsNone(got["error"], got)
        self.assertEqual(got["text"], want["text"])
        self.assertEqual(got["completion_tokens"], 40)
        # 40 tokens a step (10 ms) apart, taken every 100 ms: most arrive together with the one before
        t = got["t_events"]
        together = sum(1 for a, b in zip(t, t[1:]) if b - a < 0.002)
        self.assertGreaterEqual(together, 20, [round(b - a, 4) for a, b in zip(t, t[1:])])


class NullByNameOnly(unittest.TestCase):
    def test_a_path_is_never_the_null_model(self):
        u.require_env(self)
        d = tempfile.mkdtemp(prefix="dserve-null-path-")
        self.addCleanup(shutil.rmtree, d, True)
        p = subprocess.run([u.DSERVE, "serve", "./null", "--port", "0"], cwd=d, capture_output=True, text=True,
                           timeout=30 * u.SCALE, stdin=subprocess.DEVNULL)
        self.assertEqual(p.returncode, 2, p.stdout + p.stderr)
        self.assertIn("./null: cannot read the model", p.stderr)
        cfg = os.path.join(d, "c.json")
        with open(cfg, "w") as f:
            json.dump({"model": "missing.gguf", "workers": [{"name": "w0", "port": 0, "null_step_ms": 5}]}, f)
        p = subprocess.run([u.DSERVE, "launch", "--config", cfg, "--node", "local"], capture_output=True, text=True,
                           timeout=30 * u.SCALE, stdin=subprocess.DEVNULL)
        self.assertNotEqual(p.returncode, 0)
        self.assertIn("workers[0].null_step_ms", p.stderr)


if __name__ == "__main__":
    unittest.main()
