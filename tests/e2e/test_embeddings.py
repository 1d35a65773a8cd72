"""tests/e2e/test_embeddings.py: /v1/embeddings (issue 45 item 5) through the real binary and the official openai
client: both bundled models against llama.cpp's llama-embedding (tests/models/golden/embeddings.json.gz, made by
scripts/golden/make_embeddings_golden.py), float and base64, token-id input, the prefix cache left alone, the decode
worker of a disaggregated cluster, and the refusals."""

import base64
import gzip
import hashlib
import json
import os
import shutil
import struct
import tempfile
import unittest

import oai_util as o
import e2e_util as u

GOLDEN = os.path.join(u.SOURCE_DIR, "tests", "models", "golden", "embeddings.json.gz")


def golden_doc():
    with gzip.open(GOLDEN) as f:
        return json.load(f)


def golden(model_path):
    return golden_doc()["models"][os.path.basename(model_path)]


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def f32(v):
    """v's numbers as float32 (the float answer prints each with 9 digits: the float32 exactly)."""
    return list(struct.unpack("<%df" % len(v), struct.pack("<%df" % len(v), *v)))


def floor_for(self_cosine):
    """The cosine asked of dserve: 0.999, or where llama.cpp agrees with itself less (flash attention on vs off:
    Gemma 3 270M's short inputs, 0.9977), its own agreement less 0.001."""
    return min(0.999, self_cosine - 0.001)


class Served:
    """A mixin: `dserve serve MODEL` for the class (MODEL set by the subclass), the openai client on it."""
    MODEL = None

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        if o.openai is None:
            raise unittest.SkipTest("the openai package is not installed (scripts/setup.sh makes the test venv)")
        if not os.path.exists(cls.MODEL):
            raise unittest.SkipTest("the model is missing: run scripts/setup.sh")
        cls.dir = tempfile.mkdtemp(prefix="dserve-embed-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.port = u.free_ports(1)[0]
        cls.srv = u.Proc(["serve", cls.MODEL, "--port", str(cls.port), "-t", "1"], os.path.join(cls.dir, "out.log"))
        cls.addClassCleanup(cls.srv.stop, 20 * u.SCALE)
        cls.srv.wait_for("ready (router", 90 * u.SCALE)
        cls.client = o.client(cls.port)
        cls.model_id = cls.client.models.list().data[0].id
        cls.gold = golden(cls.MODEL)
        with open(cls.MODEL, "rb") as f:
            if hashlib.file_digest(f, "sha256").hexdigest() != cls.gold["sha256"]:
                raise AssertionError("%s is not the file the embedding golden was made from: regenerate it "
                                     "(scripts/golden/make_embeddings_golden.py)" % cls.MODEL)

    def check_golden(self, data, what):
        self.assertEqual([d.index for d in data], list(range(len(self.gold["inputs"]))))
        for d, want, own in zip(data, self.gold["embeddings"], self.gold["self_cosine"]):
            self.assertEqual(len(d.embedding), len(want))
            c = cosine(d.embedding, want)
            self.assertGreaterEqual(c, floor_for(own), "%s input %d: cosine %.5f with llama.cpp's (llama.cpp with "
                                    "itself: %.5f)" % (what, d.index, c, own))
            self.assertAlmostEqual(sum(x * x for x in d.embedding), 1.0, places=4)  # L2-normalised

    def test_golden_float_and_base64(self):
        r = self.client.embeddings.create(model=self.model_id, input=self.gold["inputs"], encoding_format="float")
        self.assertEqual((r.object, r.model, r.data[0].object), ("list", self.model_id, "embedding"))
        self.assertGreater(r.usage.prompt_tokens, 20)
        self.assertEqual(r.usage.total_tokens, r.usage.prompt_tokens)
        self.check_golden(r.data, "float")
        # the client's default asks for base64 and decodes it (little-endian float32): the same numbers
        d = self.client.embeddings.create(model=self.model_id, input=self.gold["inputs"])
        for a, b in zip(d.data, r.data):
            self.assertEqual(f32(a.embedding), f32(b.embedding))
        # and the bytes as sent
        b64 = self.client.embeddings.create(model=self.model_id, input=self.gold["inputs"][0],
                                            encoding_format="base64")
        raw = base64.b64decode(b64.data[0].embedding)
        self.assertEqual(list(struct.unpack("<%df" % (len(raw) // 4), raw)), f32(r.data[0].embedding))


class SmolLM2(Served, unittest.TestCase):
    MODEL = u.MODEL

    def test_token_ids_are_the_text(self):
        texts = self.gold["inputs"][:2]
        ids = [u.post(self.port, "/tokenize", {"prompt": t})[1]["tokens"] for t in texts]
        by_text = self.client.embeddings.create(model=self.model_id, input=texts, encoding_format="float")
        by_ids = self.client.embeddings.create(model=self.model_id, input=ids, encoding_format="float")
        one = self.client.embeddings.create(model=self.model_id, input=ids[1], encoding_format="float")
        for a, b in zip(by_text.data, by_ids.data):
            self.assertGreater(cosine(a.embedding, b.embedding), 0.99999)
        self.assertGreater(cosine(one.data[0].embedding, by_text.data[1].embedding), 0.99999)
        self.assertEqual(by_ids.usage.prompt_tokens, len(ids[0]) + len(ids[1]))

    def test_the_prefix_cache_is_left_alone(self):
        # a completion caches the long input's leading blocks; an embedding of it must still pool every position
        text, want, own = self.gold["inputs"][2], self.gold["embeddings"][2], self.gold["self_cosine"][2]
        for _ in range(2):
            self.client.completions.create(model=self.model_id, prompt=text, max_tokens=2, temperature=0)
        r = self.client.embeddings.create(model=self.model_id, input=text, encoding_format="float")
        self.assertGreaterEqual(cosine(r.data[0].embedding, want), floor_for(own))

    def test_refusals_name_the_field(self):
        n_ctx = json.loads(u.get(self.port, "/v1/models")[1])["data"][0]["max_model_len"]
        width = len(self.gold["embeddings"][0])
        for body, status, param, code in [
                ({}, 400, "input", None),
                ({"input": ""}, 400, "input", None),
                ({"input": []}, 400, "input", None),
                ({"input": ["a", 7]}, 400, "input[1]", None),
                ({"input": [[1, 2], []]}, 400, "input[1]", None),
                ({"input": [10 ** 9]}, 400, "input", None),
                ({"input": "a", "dimensions": 64}, 400, "dimensions", "unsupported_parameter"),
                ({"input": "a", "encoding_format": "int8"}, 400, "encoding_format", "invalid_value"),
                ({"input": "a", "temperature": 0}, 400, "temperature", "unsupported_parameter"),
                ({"input": [1] * n_ctx}, 400, "input", "context_length_exceeded"),
                ({"input": ["a", [1] * n_ctx]}, 400, "input[1]", "context_length_exceeded"),
                ({"input": ["a"] * 65}, 400, "input", "too_many_choices")]:  # router.max_choices, 64 by default
            got, obj = u.post(self.port, "/v1/embeddings", body)
            self.assertEqual(got, status, body if len(json.dumps(body)) < 200 else param)
            e = obj["error"]
            self.assertEqual(e["param"], param, e)
            if code:
                self.assertEqual(e["code"], code, e)
        got, _ = u.post(self.port, "/v1/embeddings", {"input": "a", "model": "other"})
        self.assertEqual(got, 200)  # one model served, router.strict_model_name off: any name is it (llama-server)
        ok = self.client.embeddings.create(model=self.model_id, input="a", dimensions=width, user="u-1",
                                           encoding_format="float")
        self.assertEqual(len(ok.data[0].embedding), width)
        with self.assertRaises(o.openai.BadRequestError):
            self.client.embeddings.create(model=self.model_id, input="a", dimensions=width - 1)


class Gemma3(Served, unittest.TestCase):
    MODEL = u.GEMMA


class Disaggregated(unittest.TestCase):
    """A prefill and a decode worker, every generation handed off (disagg_threshold 0): an embedding runs on the
    decode worker itself, whole; a prefill worker refuses one; generations still hand off."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        if o.openai is None:
            raise unittest.SkipTest("the openai package is not installed (scripts/setup.sh makes the test venv)")
        cls.cluster = u.Cluster([{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode"}],
                                disagg_threshold=0, tag="embed")
        cls.addClassCleanup(cls.cluster.close)
        cls.cluster.start()
        cls.gold = golden(u.MODEL)

    def test_on_the_decode_worker(self):
        port = self.cluster.port
        c = o.client(port)
        model = c.models.list().data[0].id
        r = c.embeddings.create(model=model, input=self.gold["inputs"], encoding_format="float")
        for d, want, own in zip(r.data, self.gold["embeddings"], self.gold["self_cosine"]):
            self.assertGreaterEqual(cosine(d.embedding, want), floor_for(own))
        t = c.completions.create(model=model, prompt="The capital of France is", max_tokens=4, temperature=0)
        self.assertTrue(t.choices[0].text)
        # the router's access log: the embedding on d0 alone, the completion handed off p0>d0
        self.cluster.node.wait_for("route=/v1/completions", 10 * u.SCALE)
        log = self.cluster.node.text()
        self.assertRegex(log, r"route=/v1/embeddings status=200 .*workers=d0")
        self.assertNotRegex(log, r"route=/v1/embeddings .*workers=p0")
        self.assertRegex(log, r"route=/v1/completions status=200 .*workers=p0>d0")

    def test_a_prefill_worker_refuses_one(self):
        ctl = u.Control("127.0.0.1", self.cluster.ports()["p0"])
        try:
            ctl.send({"op": "generate", "id": "e-1", "prompt": [1, 2, 3], "max_tokens": 1, "mode": "prefill",
                      "decode": "d0", "embed": "mean"})
            while True:
                m = ctl.recv(10 * u.SCALE)
                if m.get("id") == "e-1":
                    break
        finally:
            ctl.close()
        self.assertEqual(m["op"], "error", m)
        self.assertIn("computes no embeddings", m["message"])


if __name__ == "__main__":
    unittest.main()
