#!/usr/bin/env python3
"""tests/router/test_openai.py: the official openai client against `dserve router` and a fake worker process.

Usage: test_openai.py DSERVE_BINARY. Writes a tiny GGUF (byte-level vocabulary, context 2048) and a cluster config
into a temp dir, starts tests/router/fake_worker.py and `dserve router --config`, then drives the router with the
openai package: chat (stream and not), completions, n=2, stop strings, seeds, usage in stream, models.list,
errors, and 64 concurrent streaming clients; the field policy (refused and no-op fields, docs/openai.md) and the
sampling defaults the router puts in what the worker gets (seen through FAKE_WORKER_RECORD).
"""
import http.client
import json
import os
import socket
import re
import struct
import subprocess
import sys
import tempfile
import threading
import time
import unittest
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)
import fake_worker  # noqa: E402
import router_proc  # noqa: E402

import openai  # noqa: E402

DSERVE = None
ROUTER = None
WORKER = None
TMP = None
BASE = None
N_CTX = 2048  # room for a tool list in the system block (one token per byte)


def byte_char(b):
    keep = lambda x: 33 <= x <= 126 or 161 <= x <= 172 or 174 <= x <= 255  # noqa: E731
    if keep(b):
        return chr(b)
    return chr(256 + sum(1 for x in range(b) if not keep(x)))


def tiny_gguf(path):
    def s(x):
        x = x.encode()
        return struct.pack("<Q", len(x)) + x

    kvs = []

    def kv_str(k, v):
        kvs.append(s(k) + struct.pack("<I", 8) + s(v))

    def kv_u32(k, v):
        kvs.append(s(k) + struct.pack("<II", 4, v))

    def kv_f32(k, v):
        kvs.append(s(k) + struct.pack("<If", 6, v))

    toks = [byte_char(b) for b in range(256)] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    types = [1] * 256 + [3, 3, 3]
    kv_str("general.architecture", "llama")
    kv_str("general.name", "tiny")
    kv_u32("llama.context_length", N_CTX)
    kv_str("tokenizer.ggml.model", "gpt2")
    kv_str("tokenizer.ggml.pre", "smollm")
    kvs.append(s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(toks)) + b"".join(s(t) for t in toks))
    kvs.append(s("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, len(types)) +
               b"".join(struct.pack("<i", t) for t in types))
    kvs.append(s("tokenizer.ggml.merges") + struct.pack("<IIQ", 9, 8, 0))
    kv_u32("tokenizer.ggml.eos_token_id", 256)
    # the model's recommended sampling (llama.cpp's keys): the config's "sampling" wins over temp, the rest fill in
    kv_f32("general.sampling.temp", 0.5)
    kv_f32("general.sampling.min_p", 0.25)
    kv_f32("general.sampling.penalty_repeat", 1.25)
    b = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    b += b"\0" * ((32 - len(b) % 32) % 32)
    with open(path, "wb") as f:
        f.write(b)


def post(path, body):
    req = urllib.request.Request(BASE + path, data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=10) as r:
        return json.loads(r.read())


def prompt_ids_chat(messages):
    return post("/tokenize", {"messages": messages})["tokens"]


def prompt_ids_chat_tools(messages, tools):
    """The prompt ids of a chat request with tools (the router's rendering, read back from what the worker got)."""
    r = client().chat.completions.create(model="tiny", messages=messages, tools=tools, seed=1, max_tokens=1)
    return sent_to_worker(r.id)["prompt"]


def prompt_ids_text(text):
    return post("/tokenize", {"prompt": text})["tokens"]


def setUpModule():
    global ROUTER, WORKER, TMP, BASE
    TMP = tempfile.mkdtemp(prefix="dserve-router-py-")
    tiny_gguf(os.path.join(TMP, "tiny.gguf"))
    WORKER = subprocess.Popen([sys.executable, os.path.join(HERE, "fake_worker.py"), "0", str(N_CTX)],
                              stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, FAKE_WORKER_RECORD=os.path.join(TMP, "generate.jsonl")))
    wport = int(WORKER.stdout.readline().split()[1])
    cfg = {
        "model": "tiny.gguf", "model_name": "tiny", "secret": fake_worker.SECRET,
        "nodes": {"local": {"host": "127.0.0.1"}},
        "router": {"node": "local", "host": "127.0.0.1", "port": 0, "queue_limit": 256, "max_n": 4,
                   "strict_model_name": True},  # a request's model must be "tiny" (the 404s below)
        "sampling": {"temperature": 0.7, "top_k": 33, "top_p": 0.9},  # min_p, repetition_penalty: from the GGUF
        "workers": [{"name": "w0", "node": "local", "role": "both", "host": "127.0.0.1", "port": wport,
                     "max_seqs": 64}],
    }
    with open(os.path.join(TMP, "cluster.json"), "w") as f:
        json.dump(cfg, f)
    ROUTER, BASE = router_proc.start_router(DSERVE, os.path.join(TMP, "cluster.json"))


def tearDownModule():
    for p in (ROUTER, WORKER):
        if p:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()


def client():
    return openai.OpenAI(base_url=BASE + "/v1", api_key="none", max_retries=0, timeout=30)


MSGS = [{"role": "user", "content": "Say something."}]

def raw(path, body, ctype="application/json", method="POST"):
    """(status, parsed JSON body or None) over a fresh connection."""
    u = BASE.split("//")[1]
    host, port = u.split(":")
    c = http.client.HTTPConnection(host, int(port), timeout=10)
    headers = {} if ctype is None else {"Content-Type": ctype}
    c.request(method, path, body=body, headers=headers)
    r = c.getresponse()
    data = r.read()
    c.close()
    try:
        return r.status, json.loads(data)
    except ValueError:
        return r.status, None


M = '"messages":[{"role":"user","content":"hi"}]'
BAD = [
    ("/v1/chat/completions", b"", 400), ("/v1/chat/completions", b"{", 400),
    ("/v1/chat/completions", b'{"messages":[{"role":"user","content":"hi"}', 400),
    ("/v1/chat/completions", b"[]", 400), ("/v1/chat/completions", b"null", 400),
    ("/v1/chat/completions", b"{\"messages\":\"\xff\"}", 400),
    ("/v1/chat/completions", b'{"messages":[{"role":"user","content":"\xc3\x28"}]}', 400),
    ("/v1/chat/completions", b"[" * 10000 + b"]" * 10000, 400),
    ("/v1/chat/completions", b'{"messages":[]}', 400),
    ("/v1/chat/completions", b'{"messages":[{"role":"alien","content":"x"}]}', 400),
    ("/v1/chat/completions", b'{"messages":[{"role":"user","content":7}]}', 400),
    ("/v1/chat/completions", ("{" + M + ',"max_tokens":-1}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"max_tokens":1e309}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"max_tokens":"5"}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"temperature":9}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"top_p":0}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"top_k":-7}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"min_p":-0.1}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"presence_penalty":2.5}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"repetition_penalty":0}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"seed":0.5}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"n":0}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"n":99}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"stop":[""]}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"stop":["a","b","c","d","e","f","g","h","i"]}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"logprobs":true,"top_logprobs":21}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"logit_bias":{"x":1}}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"logit_bias":{"5":500}}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"stream":1}').encode(), 400),
    ("/v1/chat/completions", ("{" + M + ',"model":"gpt-9"}').encode(), 404),
    ("/v1/completions", b'{"prompt":"x","echo":true}', 400),
    ("/v1/completions", b'{"prompt":[1,99999]}', 400),
    ("/v1/completions", b'{"prompt":{"a":1}}', 400),
    ("/v1/completions", ('{"prompt":"' + "x" * (N_CTX + 200) + '"}').encode(), 400),
    ("/detokenize", b'{"tokens":[-1]}', 400),
    ("/nowhere", b"{}", 404),
]


class BadInputTest(unittest.TestCase):
    def healthy(self):
        self.assertEqual(raw("/health", None, None, "GET")[0], 200)

    def test_bad_bodies(self):
        self.assertGreaterEqual(len(BAD), 30)
        for path, body, status in BAD:
            got, obj = raw(path, body)
            self.assertEqual(got, status, (path, body[:80], obj))
            self.assertIsInstance(obj, dict, body[:80])
            err = obj["error"]
            for k in ("message", "type", "param", "code"):
                self.assertIn(k, err)
            self.healthy()

    def test_content_types_and_methods(self):
        self.assertEqual(raw("/v1/completions", b'{"prompt":"a"}', "text/plain")[0], 415)
        self.assertEqual(raw("/v1/completions", b'{"prompt":"a"}', "application/x-www-form-urlencoded")[0], 415)
        self.assertEqual(raw("/v1/completions", b'{"prompt":"a","max_tokens":1}', "application/json; charset=utf-8")[0], 200)
        self.assertEqual(raw("/v1/completions", b'{"prompt":"a","max_tokens":1}', None)[0], 200)
        self.assertEqual(raw("/v1/completions", None, None, "GET")[0], 405)
        self.assertEqual(raw("/v1/models", b"{}", None, "DELETE")[0], 405)
        self.healthy()

    def test_10mb_body(self):
        u = BASE.split("//")[1].split(":")
        s = socket.create_connection((u[0], int(u[1])), timeout=10)
        n = 10 << 20
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                  b"Content-Length: %d\r\n\r\n" % n)
        try:
            s.sendall(b" " * 65536)
        except OSError:
            pass
        data = b""
        while b"\r\n\r\n" not in data:
            chunk = s.recv(65536)
            if not chunk:
                break
            data += chunk
        s.close()
        self.assertTrue(data.startswith(b"HTTP/1.1 413"), data[:100])
        self.healthy()


class OpenAITest(unittest.TestCase):
    def test_models_list(self):
        ids = [m.id for m in client().models.list()]
        self.assertEqual(ids, ["tiny"])

    def test_chat_non_stream(self):
        r = client().chat.completions.create(model="tiny", messages=MSGS, seed=3, max_tokens=5)
        want, finish, n = fake_worker.expected(prompt_ids_chat(MSGS), 3, 5)
        self.assertTrue(r.id.startswith("chatcmpl-"))
        self.assertEqual(r.object, "chat.completion")
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertEqual(r.choices[0].message.content, want)
        self.assertEqual(r.choices[0].finish_reason, finish)
        self.assertEqual(r.usage.completion_tokens, n)
        self.assertEqual(r.usage.prompt_tokens, len(prompt_ids_chat(MSGS)))
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens + n)
        self.assertEqual(r.usage.prompt_tokens_details.cached_tokens, 0)

    def test_chat_stream_with_usage(self):
        chunks = list(client().chat.completions.create(model="tiny", messages=MSGS, seed=4, stream=True,
                                                       stream_options={"include_usage": True}))
        want, finish, n = fake_worker.expected(prompt_ids_chat(MSGS), 4)
        self.assertEqual(chunks[0].choices[0].delta.role, "assistant")
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        self.assertEqual(text, want)
        finals = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
        self.assertEqual(finals, [finish])
        self.assertEqual(chunks[-1].choices, [])
        self.assertEqual(chunks[-1].usage.completion_tokens, n)
        self.assertEqual(len({c.id for c in chunks}), 1)

    def test_stream_without_usage(self):
        chunks = list(client().chat.completions.create(model="tiny", messages=MSGS, seed=4, stream=True))
        self.assertTrue(all(c.usage is None for c in chunks))
        self.assertTrue(all(c.choices for c in chunks))

    def test_completions(self):
        r = client().completions.create(model="tiny", prompt="Once upon a time", seed=11, max_tokens=3)
        want, finish, n = fake_worker.expected(prompt_ids_text("Once upon a time"), 11, 3)
        self.assertTrue(r.id.startswith("cmpl-"))
        self.assertEqual(r.choices[0].text, want)
        self.assertEqual(r.choices[0].finish_reason, "length")
        self.assertEqual(r.usage.completion_tokens, 3)
        # token-id prompts reach the worker as given
        ids = prompt_ids_text("Once upon a time")
        r2 = client().completions.create(model="tiny", prompt=ids, seed=11, max_tokens=3)
        self.assertEqual(r2.choices[0].text, want)

    def test_completions_list_prompts(self):
        """One choice group per prompt, indices prompt*n + i (OpenAI's and vLLM's numbering), seeds seed + index,
        usage summed over the prompts; strings and token-id lists mixed; streamed the same."""
        ids_b = prompt_ids_text("Far away")
        prompts = ["Once upon a time", ids_b, "abc"]
        want_ids = [prompt_ids_text("Once upon a time"), ids_b, prompt_ids_text("abc")]
        r = client().completions.create(model="tiny", prompt=prompts, n=2, seed=30, max_tokens=3)
        self.assertEqual(sorted(c.index for c in r.choices), list(range(6)))
        for c in r.choices:
            self.assertEqual(c.text, fake_worker.expected(want_ids[c.index // 2], 30 + c.index, 3)[0], c.index)
        self.assertEqual(r.usage.prompt_tokens, sum(len(x) for x in want_ids))
        self.assertEqual(r.usage.completion_tokens, 18)
        texts, finishes, usage = {}, {}, None
        for ch in client().completions.create(model="tiny", prompt=prompts, n=2, seed=30, max_tokens=3, stream=True,
                                              stream_options={"include_usage": True}):
            for c in ch.choices:
                texts[c.index] = texts.get(c.index, "") + c.text
                if c.finish_reason:
                    finishes[c.index] = c.finish_reason
            usage = ch.usage or usage
        self.assertEqual(texts, {c.index: c.text for c in r.choices})
        self.assertEqual(finishes, {i: "length" for i in range(6)})
        self.assertEqual(usage.prompt_tokens, r.usage.prompt_tokens)
        # one prompt too long for the context: 400 naming it, nothing generated
        with self.assertRaises(openai.BadRequestError) as ex:
            client().completions.create(model="tiny", prompt=["a", "x" * (N_CTX + 100)], max_tokens=2)
        self.assertEqual(ex.exception.body["param"], "prompt[1]")

    def test_chat_template(self):
        """A request's chat_template renders the chat: Jinja text runs as a template; Jinja that does not parse, or a
        family whose end-of-turn token the vocabulary lacks, is a 400 naming chat_template; a family takes no
        kwargs."""
        tpl = ("{% if messages[0]['role'] != 'system' %}{{ '<|im_start|>system\\nBe brief.<|im_end|>\\n' }}"
               "{% endif %}{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + "
               "message['content'] + '<|im_end|>\\n' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}")
        want = prompt_ids_text("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nSay something.<|im_end|>\n"
                               "<|im_start|>assistant\n")
        r = client().chat.completions.create(model="tiny", messages=MSGS, seed=3, max_tokens=2,
                                             extra_body={"chat_template": tpl})
        self.assertEqual(sent_to_worker(r.id)["prompt"], want)
        self.assertNotEqual(want, prompt_ids_chat(MSGS))
        self.assertEqual(post("/tokenize", {"messages": MSGS, "chat_template": tpl})["tokens"], want)
        for body, code, needle in [({"chat_template": "{{ messages"}, "invalid_value", "line 1"),
                                   ({"chat_template": "gemma"}, "invalid_value", "<end_of_turn>"),
                                   ({"chat_template_kwargs": {"enable_thinking": False}}, "unsupported_parameter",
                                    "no template variables")]:
            with self.assertRaises(openai.BadRequestError) as ex:
                client().chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, extra_body=body)
            self.assertEqual(ex.exception.body["code"], code, body)
            self.assertTrue(ex.exception.body["param"].startswith("chat_template"), body)
            self.assertIn(needle, ex.exception.body["message"])

    def test_completions_stream(self):
        chunks = list(client().completions.create(model="tiny", prompt="abc", seed=2, stream=True))
        want, _, _ = fake_worker.expected(prompt_ids_text("abc"), 2)
        self.assertEqual("".join(c.choices[0].text for c in chunks if c.choices), want)

    def test_n2(self):
        r = client().chat.completions.create(model="tiny", messages=MSGS, seed=20, n=2, max_tokens=4)
        ids = prompt_ids_chat(MSGS)
        self.assertEqual(sorted(c.index for c in r.choices), [0, 1])
        for c in r.choices:
            self.assertEqual(c.message.content, fake_worker.expected(ids, 20 + c.index, 4)[0])
        self.assertNotEqual(r.choices[0].message.content, r.choices[1].message.content)
        self.assertEqual(r.usage.completion_tokens, 8)
        # streamed: both indexes, each complete
        texts = {0: "", 1: ""}
        for ch in client().chat.completions.create(model="tiny", messages=MSGS, seed=20, n=2, max_tokens=4,
                                                   stream=True):
            for c in ch.choices:
                texts[c.index] += c.delta.content or ""
        self.assertEqual(texts[0], r.choices[0].message.content)
        self.assertEqual(texts[1], r.choices[1].message.content)

    def test_stop_strings(self):
        ids = prompt_ids_chat(MSGS)
        full = fake_worker.words_for(ids, 9)
        stop = full[2].strip()[:3]  # the start of the third word
        r = client().chat.completions.create(model="tiny", messages=MSGS, seed=9, stop=[stop, "zzzz"])
        want, finish, _ = fake_worker.expected(ids, 9, None, [stop, "zzzz"])
        self.assertEqual(r.choices[0].message.content, want)
        self.assertNotIn(stop, r.choices[0].message.content)
        self.assertEqual(r.choices[0].finish_reason, "stop")

    def test_seed_reproducible(self):
        a = client().chat.completions.create(model="tiny", messages=MSGS, seed=123).choices[0].message.content
        b = client().chat.completions.create(model="tiny", messages=MSGS, seed=123).choices[0].message.content
        c = client().chat.completions.create(model="tiny", messages=MSGS, seed=124).choices[0].message.content
        self.assertEqual(a, b)
        self.assertNotEqual(a, c)

    def test_errors(self):
        with self.assertRaises(openai.BadRequestError) as e:
            client().chat.completions.create(model="tiny", messages=MSGS, max_tokens=-1)
        self.assertEqual(e.exception.status_code, 400)
        with self.assertRaises(openai.NotFoundError):
            client().chat.completions.create(model="nope", messages=MSGS)
        with self.assertRaises(openai.BadRequestError) as e:
            client().completions.create(model="tiny", prompt="x" * (N_CTX + 100))
        self.assertEqual(e.exception.code, "context_length_exceeded")
        with self.assertRaises(openai.BadRequestError):
            client().chat.completions.create(model="tiny", messages=[{"role": "wizard", "content": "x"}])
        # still serving
        self.assertTrue(client().chat.completions.create(model="tiny", messages=MSGS, max_tokens=1).choices)

    def test_64_concurrent_streams(self):
        results = {}
        errors = []

        def one(i):
            try:
                msgs = [{"role": "user", "content": "client %d" % i}]
                text = ""
                for ch in client().chat.completions.create(model="tiny", messages=msgs, seed=i, stream=True):
                    if ch.choices:
                        text += ch.choices[0].delta.content or ""
                results[i] = (text, msgs)
            except Exception as ex:  # reported below
                errors.append("%d: %r" % (i, ex))

        th = [threading.Thread(target=one, args=(i,)) for i in range(64)]
        for t in th:
            t.start()
        for t in th:
            t.join(60)
        self.assertEqual(errors, [])
        self.assertEqual(len(results), 64)
        for i, (text, msgs) in results.items():
            self.assertEqual(text, fake_worker.expected(prompt_ids_chat(msgs), i)[0], "client %d" % i)
        self.assertEqual(len({t for t, _ in results.values()}), 64)


def sent_to_worker(request_id, choice=0):
    """The `generate` message the fake worker got for choice of the request (FAKE_WORKER_RECORD)."""
    want = "%s-%d" % (request_id, choice)
    deadline = time.time() + 5
    while time.time() < deadline:
        with open(os.path.join(TMP, "generate.jsonl")) as f:
            for line in f:
                m = json.loads(line)
                if m["id"] == want:
                    return m
        time.sleep(0.02)
    raise AssertionError("no generate message for %s" % want)


class FieldPolicyTest(unittest.TestCase):
    """Issue 18: no field is silently ignored (docs/openai.md); server-side sampling defaults."""

    def refused(self, param, code, fn):
        with self.assertRaises(openai.BadRequestError) as e:
            fn()
        self.assertEqual(e.exception.status_code, 400)
        self.assertEqual(e.exception.param, param, e.exception.body)
        self.assertEqual(e.exception.code, code, e.exception.body)
        return e.exception

    def test_response_format(self):
        chat = client().chat.completions.create
        # structured outputs: the router checks the schema and sends the workers its grammar (docs/protocol.md)
        r = chat(model="tiny", messages=MSGS, max_tokens=2, response_format={"type": "json_object"})
        self.assertEqual(sent_to_worker(r.id)["grammar"], {"type": "json"})
        schema = {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"],
                  "additionalProperties": False}
        rf = {"type": "json_schema", "json_schema": {"name": "x", "schema": schema, "strict": True}}
        r = chat(model="tiny", messages=MSGS, max_tokens=2, response_format=rf)
        g = sent_to_worker(r.id)["grammar"]  # the schema travels as JSON text, its numbers as the client wrote them
        self.assertEqual((g["type"], json.loads(g["schema"])), ("json_schema", schema))
        r = chat(model="tiny", messages=MSGS, max_tokens=2, response_format={"type": "text"})
        self.assertNotIn("grammar", sent_to_worker(r.id))
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "number", "multipleOf": 0.5}}}
        ex = self.refused("response_format", "unsupported_parameter",
                          lambda: chat(model="tiny", messages=MSGS, response_format=bad))
        self.assertIn("'multipleOf'", str(ex))
        bad = {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "strnig"}}}
        self.refused("response_format", "invalid_value",
                     lambda: chat(model="tiny", messages=MSGS, response_format=bad))
        self.refused("response_format", "invalid_value",
                     lambda: chat(model="tiny", messages=MSGS, response_format={"type": "bogus"}))
        r = chat(model="tiny", messages=MSGS, seed=3, max_tokens=2, response_format={"type": "text"})
        self.assertEqual(r.choices[0].message.content, fake_worker.expected(prompt_ids_chat(MSGS), 3, 2)[0])

    def test_tools(self):
        """Tool calling through the router (docs/openai.md "Tools"): the fake worker writes a call when the generate
        message carries a tool_calls grammar, or when the prompt holds CALL_ME (tool_choice auto)."""
        chat = client().chat.completions.create
        tools = [{"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object"}}},
                 {"type": "function", "function": {"name": "get_time"}}]
        # required with parallel calls asked for: the grammar the workers get, the calls the client gets
        r = chat(model="tiny", messages=MSGS, tools=tools, tool_choice="required", seed=5, max_tokens=100,
                 parallel_tool_calls=True)
        g = sent_to_worker(r.id)["grammar"]
        g["tools"] = json.loads(g["tools"])  # JSON text on the wire
        self.assertEqual(g, {"type": "tool_calls", "tools": [{"name": "get_weather", "parameters": {"type": "object"}},
                                                             {"name": "get_time"}],
                             "open": "<tool_call>\n", "close": "\n</tool_call>", "sep": "\n", "parallel": True})
        m = r.choices[0].message
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertIsNone(m.content)
        self.assertEqual([(t.type, t.function.name, t.function.arguments) for t in m.tool_calls],
                         [("function", "get_weather", '{"city":"Paris"}')] * 2)
        self.assertRegex(m.tool_calls[0].id, r"^call_[A-Za-z0-9]{24}$")
        self.assertNotEqual(m.tool_calls[0].id, m.tool_calls[1].id)
        # a named function or required with parallel_tool_calls left at its default: one call, finish tool_calls
        for choice in ({"type": "function", "function": {"name": "get_time"}}, "required"):
            r = chat(model="tiny", messages=MSGS, tools=tools, seed=5, max_tokens=100, tool_choice=choice)
            g = sent_to_worker(r.id)["grammar"]
            self.assertEqual(g["parallel"], False)
            self.assertEqual(len(r.choices[0].message.tool_calls), 1)
            self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        self.assertEqual(json.loads(g["tools"]), [{"name": "get_weather", "parameters": {"type": "object"}},
                                                  {"name": "get_time"}])
        r = chat(model="tiny", messages=MSGS, tools=tools, seed=5, max_tokens=100, parallel_tool_calls=False,
                 tool_choice={"type": "function", "function": {"name": "get_time"}})
        g = sent_to_worker(r.id)["grammar"]
        self.assertEqual((json.loads(g["tools"]), g["parallel"]), ([{"name": "get_time"}], False))
        self.assertEqual([t.function.name for t in r.choices[0].message.tool_calls], ["get_time"])
        # streamed: no markup as content; per call a head delta (index, id, type, name, arguments "") and the
        # arguments; the openai stream helper accumulates them
        chunks = list(chat(model="tiny", messages=MSGS, tools=tools, tool_choice="required", seed=5, max_tokens=100,
                           stream=True, parallel_tool_calls=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        self.assertEqual(deltas[0].role, "assistant")
        self.assertFalse(any(d.content for d in deltas), [d.content for d in deltas])
        calls = [d.tool_calls[0] for d in deltas if d.tool_calls]
        self.assertEqual(len(calls), 4)
        self.assertEqual((calls[0].index, calls[0].type, calls[0].function.name, calls[0].function.arguments),
                         (0, "function", "get_weather", ""))
        self.assertRegex(calls[0].id, r"^call_")
        self.assertEqual((calls[1].index, calls[1].id, calls[1].function.arguments), (0, None, '{"city":"Paris"}'))
        self.assertEqual(calls[2].index, 1)
        self.assertEqual(chunks[-1].choices[0].finish_reason, "tool_calls")
        strict = [dict(t, function=dict(t["function"], strict=True, parameters={
            "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"],
            "additionalProperties": False})) for t in tools[:1]]
        with client().chat.completions.stream(model="tiny", messages=MSGS, tools=strict, tool_choice="required",
                                              seed=5, max_tokens=100, parallel_tool_calls=True) as st:
            final = st.get_final_completion()
        tc = final.choices[0].message.tool_calls
        self.assertEqual([(t.function.name, t.function.parsed_arguments) for t in tc], [("get_weather", {"city": "Paris"})] * 2)
        # auto: text, then a call; streamed, the text before the call is content and the call follows as deltas
        ask = [{"role": "user", "content": "CALL_ME please"}]
        r = chat(model="tiny", messages=ask, tools=tools, seed=5, max_tokens=100)
        self.assertNotIn("grammar", sent_to_worker(r.id))
        self.assertEqual(r.choices[0].message.content, "Let me look.")
        self.assertEqual([(t.function.name, t.function.arguments) for t in r.choices[0].message.tool_calls],
                         [("get_weather", '{"city":"Oslo"}')])
        self.assertEqual(r.choices[0].finish_reason, "tool_calls")
        chunks = list(chat(model="tiny", messages=ask, tools=tools, seed=5, max_tokens=100, stream=True))
        deltas = [c.choices[0].delta for c in chunks if c.choices]
        self.assertEqual("".join(d.content or "" for d in deltas), "Let me look.")
        self.assertEqual([d.tool_calls[0].function.name for d in deltas if d.tool_calls], ["get_weather", None])
        # auto with a text answer: streamed text equals the non-streamed content (the hold-back loses nothing)
        r = chat(model="tiny", messages=MSGS, tools=tools, seed=7, max_tokens=6)
        want = fake_worker.expected(prompt_ids_chat_tools(MSGS, tools), 7, 6)[0]
        self.assertEqual((r.choices[0].message.content, r.choices[0].message.tool_calls), (want, None))
        chunks = list(chat(model="tiny", messages=MSGS, tools=tools, seed=7, max_tokens=6, stream=True))
        self.assertEqual("".join(c.choices[0].delta.content or "" for c in chunks if c.choices), want)
        # a round trip: the assistant's call and the tool's result are rendered into the prompt
        msgs = MSGS + [{"role": "assistant", "content": None, "tool_calls": [
            {"id": "c1", "type": "function", "function": {"name": "get_weather", "arguments": "{}"}}]},
            {"role": "tool", "tool_call_id": "c1", "content": "sunny"}]
        r = chat(model="tiny", messages=msgs, tools=tools, tool_choice="none", seed=5, max_tokens=2)
        prompt = bytes(t for t in sent_to_worker(r.id)["prompt"] if t < 256).decode()  # without <|im_start|> & co.
        self.assertIn('\nassistant\n<tool_call>\n{"name": "get_weather", "arguments": {}}\n</tool_call>\n'
                      'user\n<tool_response>\nsunny\n</tool_response>\nassistant\n', prompt)
        self.assertNotIn("<tools>", prompt)  # "none": the tools are left out
        self.assertFalse(r.choices[0].message.tool_calls)
        # errors name the field
        self.refused("tool_choice", "invalid_value",
                     lambda: chat(model="tiny", messages=MSGS, tools=tools,
                                  tool_choice={"type": "function", "function": {"name": "nope"}}))
        self.refused("tool_choice", None, lambda: chat(model="tiny", messages=MSGS, tool_choice="required"))
        self.refused("tools[0].function.parameters", "unsupported_parameter",
                     lambda: chat(model="tiny", messages=MSGS, tools=[{"type": "function", "function": {
                         "name": "f", "parameters": {"type": "object", "not": {}}}}]))
        self.refused("messages[0].tool_call_id", None,
                     lambda: chat(model="tiny", messages=[{"role": "tool", "content": "x"}]))
        self.refused("functions", "unsupported_parameter",
                     lambda: chat(model="tiny", messages=MSGS, functions=[{"name": "f"}]))
        # "none": no tool calls, plain text
        r = chat(model="tiny", messages=MSGS, tools=tools, tool_choice="none", seed=5, max_tokens=2)
        self.assertEqual(r.choices[0].message.content, fake_worker.expected(prompt_ids_chat(MSGS), 5, 2)[0])
        self.assertFalse(r.choices[0].message.tool_calls)

    def test_unknown_fields(self):
        self.refused("frobnicate", "unsupported_parameter",
                     lambda: client().chat.completions.create(model="tiny", messages=MSGS,
                                                              extra_body={"frobnicate": 1}))
        self.refused("mirostat", "unsupported_parameter",
                     lambda: client().completions.create(model="tiny", prompt="ab", extra_body={"mirostat": 2}))
        status, obj = raw("/tokenize", b'{"prompt":"ab","with_pieces":true}')
        self.assertEqual((status, obj["error"]["param"]), (400, "with_pieces"))
        status, obj = raw("/detokenize", b'{"tokens":[97],"skip_special_tokens":true}')
        self.assertEqual((status, obj["error"]["param"]), (400, "skip_special_tokens"))

    def test_no_op_fields(self):
        r = client().chat.completions.create(model="tiny", messages=MSGS, seed=6, max_tokens=2, user="u1",
                                             store=False, metadata={"team": "a"}, service_tier="auto",
                                             parallel_tool_calls=True)
        self.assertEqual(r.choices[0].message.content, fake_worker.expected(prompt_ids_chat(MSGS), 6, 2)[0])
        self.refused("store", "unsupported_parameter",
                     lambda: client().chat.completions.create(model="tiny", messages=MSGS, store=True))

    def test_sampling_defaults(self):
        # no sampling fields: the config's (temperature, top_k, top_p), then the GGUF's (min_p, repetition_penalty)
        r = client().chat.completions.create(model="tiny", messages=MSGS, max_tokens=2)
        sp = sent_to_worker(r.id)["sampling"]
        self.assertEqual((sp["temperature"], sp["top_k"], sp["top_p"]), (0.7, 33, 0.9), sp)
        self.assertEqual((sp["min_p"], sp["repetition_penalty"]), (0.25, 1.25), sp)
        # explicit values always win, greedy included
        r = client().completions.create(model="tiny", prompt="ab", max_tokens=2, temperature=0, top_p=1,
                                        extra_body={"top_k": 0, "min_p": 0, "repetition_penalty": 1})
        sp = sent_to_worker(r.id)["sampling"]
        self.assertEqual((sp["temperature"], sp["top_k"], sp["top_p"], sp["min_p"], sp["repetition_penalty"]),
                         (0, -1, 1, 0, 1), sp)
        # one field given: the others keep their defaults
        r = client().chat.completions.create(model="tiny", messages=MSGS, max_tokens=2, temperature=1.2)
        sp = sent_to_worker(r.id)["sampling"]
        self.assertEqual((sp["temperature"], sp["top_k"], sp["min_p"]), (1.2, 33, 0.25), sp)


class FrontEndTest(unittest.TestCase):
    """Issue 17: seeds drawn per request, /v1/models/{id}, NUL refused, pipelining, the per-client cap."""

    def test_no_seed_draws_one(self):
        r = client().chat.completions.create(model="tiny", messages=MSGS, n=2, temperature=1, max_tokens=6)
        self.assertNotEqual(r.choices[0].message.content, r.choices[1].message.content)
        r2 = client().chat.completions.create(model="tiny", messages=MSGS, n=2, temperature=1, max_tokens=6)
        self.assertNotEqual({c.message.content for c in r.choices}, {c.message.content for c in r2.choices})
        # an explicit seed still reproduces, choice by choice
        a = client().chat.completions.create(model="tiny", messages=MSGS, n=2, seed=77, max_tokens=6)
        b = client().chat.completions.create(model="tiny", messages=MSGS, n=2, seed=77, max_tokens=6)
        key = lambda x: sorted((c.index, c.message.content) for c in x.choices)  # noqa: E731
        self.assertEqual(key(a), key(b))

    def test_model_by_id(self):
        m = client().models.retrieve("tiny")
        self.assertEqual((m.id, m.object, m.owned_by), ("tiny", "model", "dserve"))
        with self.assertRaises(openai.NotFoundError) as e:
            client().models.retrieve("gpt-9")
        self.assertEqual(e.exception.code, "model_not_found")
        self.assertIn("this server serves 'tiny'", e.exception.message)

    def test_nul_refused(self):
        for path, body, param in [
                ("/v1/chat/completions", b'{"messages":[{"role":"user","content":"a\\u0000b"}]}', "messages[0].content"),
                ("/v1/chat/completions", b'{"messages":[{"role":"user","content":"a\x00b"}]}', "messages[0].content"),
                ("/v1/completions", b'{"prompt":"hi","stop":["x\\u0000"]}', "stop[0]"),
                ("/tokenize", b'{"prompt":"\\u0000"}', "prompt")]:
            status, obj = raw(path, body)
            self.assertEqual(status, 400, (path, body, obj))
            self.assertEqual(obj["error"]["param"], param, obj)
        with self.assertRaises(openai.BadRequestError):
            client().completions.create(model="tiny", prompt="abc\u0000def")

    def test_pipelined(self):
        u = BASE.split("//")[1].split(":")
        body = b'{"prompt":"ab","max_tokens":2}'
        req = (b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n" % len(body) + body)
        with socket.create_connection((u[0], int(u[1])), timeout=10) as s:
            s.sendall(req + b"GET /v1/models/tiny HTTP/1.1\r\nHost: x\r\n\r\n")
            buf, got = b"", []
            while len(got) < 2:  # two Content-Length answers, in order
                he = buf.find(b"\r\n\r\n")
                if he >= 0:
                    head = buf[:he].decode()
                    n = int(re.search(r"(?i)content-length: *(\d+)", head).group(1))
                    if len(buf) >= he + 4 + n:
                        got.append((int(head.split()[1]), json.loads(buf[he + 4:he + 4 + n])))
                        buf = buf[he + 4 + n:]
                        continue
                chunk = s.recv(65536)
                self.assertTrue(chunk, "the router closed after %d answers" % len(got))
                buf += chunk
        self.assertEqual(got[0][0], 200)
        self.assertEqual(got[0][1]["object"], "text_completion")
        self.assertEqual(got[1], (200, got[1][1]))
        self.assertEqual(got[1][1]["id"], "tiny")


if __name__ == "__main__":
    DSERVE = sys.argv.pop(1)
    unittest.main(verbosity=2)
