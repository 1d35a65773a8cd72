"""tests/e2e/test_schema_numbers.py: issue 39 items 7-9 against a real server: structured outputs under schemas whose
numbers a double cannot hold validate in python3-jsonschema (the answer's numbers are exactly the schema's), and raw
bodies with a duplicate key, deep nesting, a lone surrogate or a /v1/responses output for no call are 400s naming
the place."""

import http.client
import json
import unittest

import e2e_util as u
from oai_util import MODEL_ID, client, start

try:
    import jsonschema
except ImportError:  # the test venv has it (scripts/setup.sh); the system python has it as python3-jsonschema
    jsonschema = None

# min = max beyond 2^53, a const and an enum a double rounds, bounds with 17 decimals: each property has one or two
# valid values, so a rounded number anywhere fails validation.
SCHEMA_TEXT = ('{"type":"object","properties":{'
               '"big":{"type":"integer","minimum":9007199254740993,"maximum":9007199254740993},'
               '"c":{"const":0.30000000000000004},'
               '"e":{"enum":[123456789012345678]},'
               '"d":{"type":"number","minimum":0.30000000000000004,"maximum":0.30000000000000005}},'
               '"required":["big","c","e","d"],"additionalProperties":false}')
EXACT = {"big": "9007199254740993", "c": "0.30000000000000004", "e": "123456789012345678"}


def raw(port, path, body):
    """POSTs body (bytes, sent as they are: json.dumps cannot write a duplicate key); (status, parsed answer)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=60 * u.SCALE)
    try:
        c.request("POST", path, body, {"Content-Type": "application/json"})
        r = c.getresponse()
        return r.status, json.loads(r.read())
    finally:
        c.close()


class SchemaNumbers(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if jsonschema is None:
            raise unittest.SkipTest("jsonschema is not installed (scripts/setup.sh installs it in the test venv)")
        start(cls, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 4}], 1000, "schema-numbers")

    def body(self, extra):
        return ('{"model":%s,"messages":[{"role":"user","content":"Write the JSON."}]%s}'
                % (json.dumps(MODEL_ID[self.PORT]), extra)).encode()

    def test_exact_numbers_validate(self):
        # the schema goes as raw text: Python's json would keep these numbers, but the point is the server's reading
        rf = ',"max_tokens":200,"seed":%d,"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":%s}}'
        schema = json.loads(SCHEMA_TEXT)
        for seed in range(3):
            for stream in (False, True):
                if not stream:
                    st, r = raw(self.PORT, "/v1/chat/completions", self.body(rf % (seed, SCHEMA_TEXT)))
                    self.assertEqual(st, 200, r)
                    text, finish = r["choices"][0]["message"]["content"], r["choices"][0]["finish_reason"]
                else:
                    text, finish = "", None
                    kw = dict(model=MODEL_ID[self.PORT], messages=[{"role": "user", "content": "Write the JSON."}],
                              max_tokens=200, seed=100 + seed,
                              response_format={"type": "json_schema", "json_schema": {"name": "n", "schema": schema}})
                    for ch in client(self.PORT).chat.completions.create(stream=True, **kw):
                        if ch.choices:
                            text += ch.choices[0].delta.content or ""
                            finish = ch.choices[0].finish_reason or finish
                self.assertEqual(finish, "stop", text)
                v = json.loads(text)
                jsonschema.validate(v, schema)  # raises, naming the keyword, when a number was rounded
                for k, lit in EXACT.items():
                    self.assertIn(lit, text, "%s written as the schema wrote it: %r" % (k, text))

    def test_inexact_schema_is_a_400(self):
        schema = '{"type":"object","properties":{"p":{"type":"number","multipleOf":0.10000000000000001}}}'
        st, r = raw(self.PORT, "/v1/chat/completions", self.body(
            ',"response_format":{"type":"json_schema","json_schema":{"name":"n","schema":%s}}' % schema))
        self.assertEqual(st, 400, r)
        self.assertEqual(r["error"]["param"], "response_format")
        self.assertIn("#/properties/p", r["error"]["message"])
        self.assertIn("0.10000000000000001", r["error"]["message"])

    def test_bodies_name_the_place(self):
        cases = [
            (self.body(',"max_tokens":1,"max_tokens":2000'), "max_tokens", "duplicate key"),
            (self.body(',"stop":["\\ud800"]'), "stop[0]", "lone UTF-16 surrogate"),
            (b'{"messages":' + b"[" * 100000, None, "deeper than 1000 levels"),
        ]
        for body, param, needle in cases:
            st, r = raw(self.PORT, "/v1/chat/completions", body)
            self.assertEqual(st, 400, r)
            self.assertEqual(r["error"]["param"], param, r)
            self.assertIn(needle, r["error"]["message"])

    def test_responses_output_for_no_call(self):
        call = {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{\"a\": 1}"}
        for items, param in [([{"type": "function_call_output", "call_id": "c2", "output": "x"}], "input[0].call_id"),
                             ([dict(call, arguments="not json")], "input[0].arguments"),
                             ([call, {"type": "function_call_output", "call_id": "nope", "output": "x"}],
                              "input[1].call_id")]:
            st, r = raw(self.PORT, "/v1/responses", json.dumps({"model": MODEL_ID[self.PORT], "input": items,
                                                                "max_output_tokens": 4}).encode())
            self.assertEqual(st, 400, r)
            self.assertEqual(r["error"]["param"], param, r)


if __name__ == "__main__":
    unittest.main()
