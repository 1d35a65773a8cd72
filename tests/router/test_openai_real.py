"""tests/router/test_openai_real.py: the official openai client against dserve serving the real SmolLM2 model.

Usage: test_openai_real.py DSERVE_BINARY SOURCE_DIR. Starts `dserve launch` on a one-node colocated config with free
ports (router + two `both` workers), then drives it with the `openai` package: chat and completions (stream and not),
n=2, stop strings, seed reproducibility, usage in the stream, models.list, many concurrent streams, and KV-aware
routing (a repeated long prompt lands where its prefix is cached: usage.prompt_tokens_details.cached_tokens > 0). Fails when the
model file is missing (scripts/setup.sh fetches it)."""
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

import openai

DSERVE, SRC = os.path.abspath(sys.argv[1]), os.path.abspath(sys.argv[2])
MODEL = os.path.join(SRC, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")
LAUNCH = None
TMP = None
CLIENT = None


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def setUpModule():
    global LAUNCH, TMP, CLIENT
    if not os.path.exists(MODEL):
        raise RuntimeError(MODEL + " is missing: run scripts/setup.sh")
    TMP = tempfile.mkdtemp(prefix="dserve-openai-real-")
    port = free_port()
    cfg = {
        "model": MODEL, "model_name": "smollm2",
        "router": {"node": "local", "port": port, "max_n": 4},
        "workers": [{"name": "w0", "node": "local", "role": "both", "port": free_port(), "threads": 2,
                     "kv_budget_mb": 64, "max_seqs": 64},
                    {"name": "w1", "node": "local", "role": "both", "port": free_port(), "threads": 2,
                     "kv_budget_mb": 64, "max_seqs": 64}],
    }
    path = os.path.join(TMP, "local.json")
    with open(path, "w") as f:
        json.dump(cfg, f)
    LAUNCH = subprocess.Popen([DSERVE, "launch", "--config", path, "--node", "local"],
                              stdout=subprocess.DEVNULL, stderr=open(os.path.join(TMP, "log"), "w"),
                              start_new_session=True)
    base = "http://127.0.0.1:%d" % port
    deadline = time.time() + 90
    while time.time() < deadline and LAUNCH.poll() is None:
        try:
            with urllib.request.urlopen(base + "/health", timeout=2) as r:
                if r.status == 200 and json.load(r).get("workers_up") == 2:
                    break
                time.sleep(0.2)
        except Exception:
            time.sleep(0.2)
    else:
        raise RuntimeError("dserve never became healthy:\n" + open(os.path.join(TMP, "log")).read())
    CLIENT = openai.OpenAI(base_url=base + "/v1", api_key="none", max_retries=0, timeout=120)


def tearDownModule():
    if LAUNCH:
        os.killpg(LAUNCH.pid, signal.SIGTERM)
        try:
            LAUNCH.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(LAUNCH.pid, signal.SIGKILL)


CAPITAL = [{"role": "user", "content": "What is the capital of France?"}]


class RealModelTest(unittest.TestCase):
    def test_models_list(self):
        ids = [m.id for m in CLIENT.models.list().data]
        self.assertEqual(ids, ["smollm2"])

    def test_chat_non_stream_and_stream_agree(self):
        r = CLIENT.chat.completions.create(model="smollm2", messages=CAPITAL, max_tokens=12, temperature=0)
        text = r.choices[0].message.content
        self.assertTrue(text)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + r.usage.completion_tokens)
        chunks = list(CLIENT.chat.completions.create(model="smollm2", messages=CAPITAL, max_tokens=12, temperature=0,
                                                      stream=True, stream_options={"include_usage": True}))
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        streamed = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(streamed, text)
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, r.usage.completion_tokens)

    def test_completions_and_stop(self):
        r = CLIENT.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=10, temperature=0)
        full = r.choices[0].text
        self.assertRegex(full, r"5")
        stop = full[full.index("5"):full.index("5") + 1]
        s = CLIENT.completions.create(model="smollm2", prompt="1, 2, 3, 4,", max_tokens=10, temperature=0,
                                      stop=[stop])
        self.assertEqual(s.choices[0].text, full[:full.index(stop)])
        self.assertEqual(s.choices[0].finish_reason, "stop")

    def test_n2_and_seed(self):
        kw = dict(model="smollm2", messages=[{"role": "user", "content": "Write a word."}], max_tokens=8,
                  temperature=1.0, seed=7, n=2)
        a = CLIENT.chat.completions.create(**kw)
        b = CLIENT.chat.completions.create(**kw)
        self.assertEqual(len(a.choices), 2)
        self.assertEqual([c.message.content for c in a.choices], [c.message.content for c in b.choices])
        self.assertEqual(sorted(c.index for c in a.choices), [0, 1])

    def test_context_length_exceeded(self):
        with self.assertRaises(openai.BadRequestError) as e:
            CLIENT.completions.create(model="smollm2", prompt=[1] * 9000, max_tokens=4)
        self.assertIn("context", str(e.exception))

    def test_concurrent_streams(self):
        prompts = ["Count from %d:" % i for i in range(24)]
        expected = {}
        for p in prompts[:3]:  # what each prompt gives alone
            expected[p] = CLIENT.completions.create(model="smollm2", prompt=p, max_tokens=6, temperature=0).choices[0].text
        got, errors = {}, []

        def run(p):
            try:
                s = CLIENT.completions.create(model="smollm2", prompt=p, max_tokens=6, temperature=0, stream=True)
                got[p] = "".join(c.choices[0].text for c in s if c.choices)
            except Exception as e:  # noqa: BLE001 - reported below
                errors.append(repr(e))

        threads = [threading.Thread(target=run, args=(p,)) for p in prompts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
        self.assertEqual(errors, [])
        self.assertEqual(len(got), len(prompts))
        for p in prompts[:3]:
            self.assertEqual(got[p], expected[p], p)  # batching does not change greedy output
        self.assertGreater(len(set(got.values())), len(prompts) // 2)  # distinct prompts, distinct answers

    def test_repeated_prompt_reuses_cached_prefix(self):
        # A long prompt, then the same prompt again while a long stream keeps one worker busy. Load-only routing
        # sends the repeat to the idle worker whenever the busy one holds the prefix (with both idle the first
        # worker gets the stream); KV-aware routing sends it where its blocks are, so it reports cached tokens.
        words = ("alpha bravo charlie delta echo foxtrot golf hotel india juliet kilo lima mike november oscar papa "
                 "quebec romeo sierra tango uniform victor whiskey xray yankee zulu").split()
        prompt = " ".join(words[(i * 7) % len(words)] for i in range(400))
        first = CLIENT.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0)
        self.assertGreater(first.usage.prompt_tokens, 256)
        busy = CLIENT.completions.create(model="smollm2", prompt="Count slowly from one to one hundred:",
                                         max_tokens=400, temperature=0, stream=True, extra_body={"ignore_eos": True})
        it = iter(busy)
        next(it)  # the stream runs on its worker from here on
        try:
            again = CLIENT.completions.create(model="smollm2", prompt=prompt, max_tokens=1, temperature=0)
        finally:
            busy.close()
        self.assertEqual(again.usage.prompt_tokens, first.usage.prompt_tokens)
        self.assertEqual(again.choices[0].text, first.choices[0].text)  # reuse does not change greedy output
        self.assertGreater(again.usage.prompt_tokens_details.cached_tokens, 0)


if __name__ == "__main__":
    unittest.main(argv=sys.argv[:1], verbosity=2)
