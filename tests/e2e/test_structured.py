"""tests/e2e/test_structured.py: structured outputs (response_format json_object / json_schema) through the router with the openai client, colocated and 1P1D, streamed and not: every answer parses and validates."""

import json
import unittest

try:
    import pydantic
except ImportError:  # the openai client brings pydantic: both live in the test venv (oai_util re-executes there)
    pydantic = None

import e2e_util as u
from oai_util import MODEL_ID, client, map_parallel, openai, start, validate

# Short strings (maxLength) keep the small model's answers short; every keyword kind the grammar knows appears once.
SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 30},
        "age": {"type": "integer"},
        "email": {"type": "string", "format": "email"},
        "hobbies": {"type": "array", "items": {"type": "string", "maxLength": 20}, "minItems": 1, "maxItems": 3},
        "pet": {"anyOf": [{"$ref": "#/$defs/pet"}, {"type": "null"}]},
        "verified": {"type": "boolean"},
    },
    "required": ["name", "age", "email", "hobbies", "pet", "verified"],
    "additionalProperties": False,
    "$defs": {"pet": {"type": "object", "properties": {"kind": {"enum": ["cat", "dog", "fish"]},
                                                       "name": {"type": "string", "maxLength": 20}},
                      "required": ["kind", "name"], "additionalProperties": False}},
}
MESSAGES = [{"role": "user", "content": "Invent a person and describe them as JSON: name, age, email, up to three "
                                        "hobbies, their pet (or null) and whether they are verified."}]
# requests per configuration and mode (streamed or not): 20 per configuration, the target 20/20 valid. The sanitizer
# build (SCALE > 1) looks for memory errors, not the rate: 3 per mode there keep CI's ASan stage short.
N_SCHEMA = 10 if u.SCALE == 1 else 3


if pydantic is not None:
    class Reading(pydantic.BaseModel):
        """A sensor reading with numeric bounds of every kind pydantic writes."""
        sensor: str = pydantic.Field(max_length=20)
        celsius: int = pydantic.Field(ge=-40, le=60)
        humidity: float = pydantic.Field(ge=0, le=1)
        floor: int = pydantic.Field(gt=0, lt=10)
        step: int = pydantic.Field(multiple_of=5, ge=0, le=100)
        confidence: float = pydantic.Field(gt=0.1, le=0.95)


def parse_reading(port, seed):
    """One parse() of Reading (seed); (parsed, finish_reason, text). pydantic validates, so a bad answer raises."""
    r = client(port).beta.chat.completions.parse(
        model=MODEL_ID[port], response_format=Reading, max_tokens=200, seed=2000 + seed,
        messages=[{"role": "user", "content": "Give one reading of the sensor in the hall as JSON: its name, the "
                                              "temperature, the humidity, the floor, the step and how sure you "
                                              "are."}])
    return r.choices[0].message.parsed, r.choices[0].finish_reason, r.choices[0].message.content


def ask(port, i, response_format, stream, max_tokens=700):
    """One chat completion (seed i); returns (content, finish_reason)."""
    c = client(port).chat.completions
    kw = dict(model=MODEL_ID[port], messages=MESSAGES, response_format=response_format, max_tokens=max_tokens,
              seed=1000 + i + (500 if stream else 0))
    if not stream:
        r = c.create(**kw)
        return r.choices[0].message.content, r.choices[0].finish_reason
    text, finish = "", None
    for ch in c.create(stream=True, **kw):
        if ch.choices:
            text += ch.choices[0].delta.content or ""
            finish = ch.choices[0].finish_reason or finish
    return text, finish


def ask_all(port, n, response_format, stream, parallel=4, max_tokens=700):
    """n requests (seeds 0..n-1), parallel at a time: [(content, finish_reason)] in seed order, and the errors."""
    return map_parallel(lambda seed: ask(port, seed, response_format, stream, max_tokens), list(range(n)), parallel)


class Structured:
    """The checks, run against one cluster (colocated or 1P1D) set up by the subclass."""

    PORT = None

    def check_schema(self, stream):
        rf = {"type": "json_schema", "json_schema": {"name": "person", "schema": SCHEMA, "strict": True}}
        out, errors = ask_all(self.PORT, N_SCHEMA, rf, stream)
        self.assertEqual(errors, [])
        valid = 0
        for i, (text, finish) in enumerate(out):
            self.assertEqual(finish, "stop", "request %d ended by %s: %r" % (i, finish, text))
            try:
                v = json.loads(text)
            except ValueError as ex:
                self.fail("request %d: not JSON (%s): %r" % (i, ex, text))
            self.assertEqual(validate(v, SCHEMA), [], "request %d: %r" % (i, text))
            valid += 1
        self.assertEqual(valid, N_SCHEMA)

    def test_json_schema(self):
        self.check_schema(stream=False)

    def test_json_schema_stream(self):
        self.check_schema(stream=True)

    def test_json_object(self):
        for stream in (False, True):
            out, errors = ask_all(self.PORT, 2, {"type": "json_object"}, stream, parallel=2, max_tokens=120)
            self.assertEqual(errors, [])
            for i, (text, finish) in enumerate(out):
                if finish == "length":  # json_object bounds nothing: a long answer may be cut, never wrong so far
                    continue
                self.assertEqual(finish, "stop")
                self.assertIsInstance(json.loads(text), dict, text)

    def test_pydantic_bounds(self):
        """A pydantic model with Field(ge=, le=, gt=, lt=, multiple_of=) through client.beta.chat.completions.parse:
        every answer parses and validates in pydantic (the grammar enforces the bounds)."""
        out, errors = map_parallel(lambda seed: parse_reading(self.PORT, seed), list(range(self.N_PYDANTIC)), 4)
        self.assertEqual(errors, [])
        for i, (parsed, finish, text) in enumerate(out):
            self.assertEqual(finish, "stop", "request %d: %r" % (i, text))
            self.assertIsInstance(parsed, Reading, text)
            v = json.loads(text)  # and the bounds themselves, checked here too
            self.assertTrue(-40 <= v["celsius"] <= 60 and 0 <= v["humidity"] <= 1 and 0 < v["floor"] < 10 and
                            0 <= v["step"] <= 100 and v["step"] % 5 == 0 and 0.1 < v["confidence"] <= 0.95, text)

    def test_bad_schema(self):
        c = client(self.PORT).chat.completions
        for schema, keyword, code in [({"type": "number", "multipleOf": 0.5}, "'multipleOf'", "unsupported_parameter"),
                                      ({"type": "integer", "minimum": 5, "maximum": 4}, "nothing can satisfy",
                                       "invalid_value"),
                                      ({"type": "object", "properties": {"a": {"type": "string", "pattern": "(x)\\1"}}},
                                       "'pattern'", "unsupported_parameter"),
                                      ({"type": "strnig"}, "'type'", "invalid_value")]:
            rf = {"type": "json_schema", "json_schema": {"name": "bad", "schema": schema}}
            with self.assertRaises(openai.BadRequestError) as e:
                c.create(model=MODEL_ID[self.PORT], messages=MESSAGES, response_format=rf, max_tokens=5)
            self.assertEqual(e.exception.status_code, 400)
            self.assertEqual(e.exception.param, "response_format", e.exception.body)
            self.assertEqual(e.exception.code, code, e.exception.body)
            self.assertIn(keyword, e.exception.message)


class Colocated(Structured, unittest.TestCase):
    N_PYDANTIC = 20 if u.SCALE == 1 else 3  # the target: 20/20 valid
    @classmethod
    def setUpClass(cls):
        start(cls, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 8}], 1000, "structured")


class OneP1D(Structured, unittest.TestCase):
    """The prefill worker samples the first token under the grammar; the decode worker replays it and goes on."""

    N_PYDANTIC = 4 if u.SCALE == 1 else 2

    @classmethod
    def setUpClass(cls):
        start(cls, [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode", "max_seqs": 8}], 0,
              "structured-1p1d")

    def test_json_schema(self):
        m0 = u.metrics(self.PORT)
        super().test_json_schema()
        m1 = u.metrics(self.PORT)  # every request went through the prefill worker
        self.assertEqual(m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"],
                         N_SCHEMA)


if __name__ == "__main__":
    unittest.main()
