"""tests/e2e/test_tools.py: tool calling (tools, tool_choice none/auto/required/named, parallel_tool_calls) through the router with the openai client, colocated (1P1D: test_tools_1p1d.py, the same checks): calls parse and validate, streams accumulate, a round trip answers."""

import json
import unittest

import e2e_util as u
from oai_util import MODEL_ID, client, map_parallel, openai, start, validate

# Strict tools (the client's stream helper parses only strict ones); short strings keep the small model's calls short.
WEATHER = {"type": "object",
           "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 30},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["city", "unit"], "additionalProperties": False}
TIME = {"type": "object", "properties": {"timezone": {"type": "string", "maxLength": 30}},
        "required": ["timezone"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                           "parameters": WEATHER, "strict": True}},
         {"type": "function", "function": {"name": "get_time", "description": "The current time in a time zone.",
                                           "parameters": TIME, "strict": True}}]
SCHEMAS = {"get_weather": WEATHER, "get_time": TIME}
MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]
# SmolLM2's own Jinja template never reads tools (a request with tools is a 400 with it): these clusters render with
# the ChatML family, whose tool convention is Hermes's (docs/openai.md). test_chat_template.py runs Jinja templates.
CHATML = {"chat_template": "chatml"}
# tool_choice "required" at temperature 1: the target is 20/20 valid calls (the sanitizer build, SCALE > 1, looks
# for memory errors, not the rate: 5 seeds there keep CI's ASan stage short)
N_SEEDS = 20 if u.SCALE == 1 else 5


def call_errors(call, allowed=SCHEMAS):
    """What is wrong with one tool call (a dict of the response's shape): [] when it is a valid call of allowed."""
    if call["type"] != "function" or not call["id"].startswith("call_"):
        return ["bad id or type: %r" % call]
    name = call["function"]["name"]
    if name not in allowed:
        return ["undeclared function %r" % name]
    try:
        args = json.loads(call["function"]["arguments"])
    except ValueError as ex:
        return ["arguments are not JSON (%s): %r" % (ex, call["function"]["arguments"])]
    return validate(args, allowed[name])


def as_dict(call):
    return {"id": call.id, "type": call.type,
            "function": {"name": call.function.name, "arguments": call.function.arguments}}


def ask(port, seed, stream=False, **kw):
    """One chat completion; returns (content, [tool call dicts], finish_reason). stream True goes through the client's
    stream helper, which accumulates the tool-call deltas (and parses strict tools' arguments); "raw" reads the chunks."""
    # parallel_tool_calls true lets the model write call after call: SmolLM2 stops after 1..5 (~30 tokens each), so
    # max_tokens leaves room for several
    args = dict(model=MODEL_ID[port], messages=MESSAGES, tools=TOOLS, temperature=1.0, max_tokens=400, seed=seed)
    args.update(kw)
    c = client(port).chat.completions
    if not stream:
        r = c.create(**args)
        m = r.choices[0].message
        return m.content, [as_dict(t) for t in (m.tool_calls or [])], r.choices[0].finish_reason
    if stream == "raw":  # chunk by chunk, as a client without the helper does (it raises on finish "length")
        content, calls, finish = None, {}, None
        for ch in c.create(stream=True, **args):
            if not ch.choices:
                continue
            d = ch.choices[0].delta
            if d.content:
                content = (content or "") + d.content
            for t in d.tool_calls or []:
                a = calls.setdefault(t.index, {"id": None, "type": None, "function": {"name": None, "arguments": ""}})
                a["id"] = t.id or a["id"]
                a["type"] = t.type or a["type"]
                if t.function:
                    a["function"]["name"] = t.function.name or a["function"]["name"]
                    a["function"]["arguments"] += t.function.arguments or ""
            finish = ch.choices[0].finish_reason or finish
        return content, [calls[k] for k in sorted(calls)], finish
    with c.stream(**args) as s:
        for _ in s:
            pass
        r = s.get_final_completion()
    m = r.choices[0].message
    for t in m.tool_calls or []:  # the helper parsed the arguments of a strict tool: they must equal the JSON text
        assert t.function.parsed_arguments == json.loads(t.function.arguments), t
    return m.content, [as_dict(t) for t in (m.tool_calls or [])], r.choices[0].finish_reason


def ask_all(port, seeds, parallel=4, **kw):
    """ask() for each seed, parallel at a time: [(content, calls, finish)] in seed order, and the errors."""
    return map_parallel(lambda seed: ask(port, seed, **kw), seeds, parallel)


class Tools:
    """The checks, run against one cluster (colocated or 1P1D) set up by the subclass."""

    PORT = None

    def assert_calls(self, out, allowed=SCHEMAS, what=""):
        for i, (content, calls, finish) in enumerate(out):
            self.assertEqual(finish, "tool_calls", "%s %d: %r %r" % (what, i, content, calls))
            self.assertGreaterEqual(len(calls), 1, "%s %d: no calls: %r" % (what, i, content))
            self.assertIsNone(content, "%s %d: a required call's turn has no content" % (what, i))
            for c in calls:
                self.assertEqual(call_errors(c, allowed), [], "%s %d: %r" % (what, i, c))
            self.assertEqual(len({c["id"] for c in calls}), len(calls), "ids repeat: %r" % calls)

    def test_required_20_seeds(self):
        # parallel_tool_calls left at its default: one call, then the choice ends (before, the grammar allowed call
        # after call and the small model repeated one until max_tokens)
        out, errors = ask_all(self.PORT, list(range(100, 100 + N_SEEDS)), tool_choice="required")
        self.assertEqual(errors, [])
        self.assert_calls(out, what="seed")
        self.assertEqual([len(calls) for _, calls, _ in out], [1] * N_SEEDS)

    def test_parallel_asked(self):
        # parallel_tool_calls true: the grammar lets a turn hold call after call (SmolLM2 often repeats one until
        # max_tokens, which is why a forced call is one call by default); every call is valid, and some turn has two
        out, errors = ask_all(self.PORT, list(range(200, 203)), tool_choice="required", parallel_tool_calls=True)
        self.assertEqual(errors, [])
        for i, (content, calls, finish) in enumerate(out):
            self.assertIn(finish, ("tool_calls", "length"), i)
            self.assertIsNone(content, i)
            self.assertEqual([e for c in calls for e in call_errors(c)], [], i)
        self.assertGreater(max(len(calls) for _, calls, _ in out), 1, out)

    def test_required_stream(self):
        for stream in (True, "raw"):
            out, errors = ask_all(self.PORT, list(range(300, 303)), stream=stream, tool_choice="required")
            self.assertEqual(errors, [])
            self.assert_calls(out, what="streamed (%s) seed" % stream)

    def test_named_function(self):
        choice = {"type": "function", "function": {"name": "get_time"}}
        for stream in (False, True):
            out, errors = ask_all(self.PORT, list(range(400, 403)), stream=stream, tool_choice=choice)
            self.assertEqual(errors, [])
            self.assert_calls(out, allowed={"get_time": TIME}, what="named (stream %s)" % stream)
            self.assertEqual([len(calls) for _, calls, _ in out], [1] * 3)  # exactly one call, finish tool_calls

    def test_single_call(self):
        out, errors = ask_all(self.PORT, list(range(500, 504)), tool_choice="required", parallel_tool_calls=False)
        self.assertEqual(errors, [])
        self.assert_calls(out, what="single")
        for _, calls, _ in out:
            self.assertEqual(len(calls), 1)

    def test_none(self):
        for stream in (False, "raw"):
            content, calls, finish = ask(self.PORT, 600, stream=stream, tool_choice="none", max_tokens=40)
            self.assertEqual(calls, [])
            self.assertIn(finish, ("stop", "length"))
            self.assertIsInstance(content, str)
            self.assertNotIn("<tool_call>", content)

    def test_auto(self):
        """auto is accepted, and whatever the model chose is well formed: valid calls, or text with no markup."""
        for stream in (False, "raw"):
            out, errors = ask_all(self.PORT, list(range(700, 703)), stream=stream, tool_choice="auto",
                                  max_tokens=100)
            self.assertEqual(errors, [])
            for content, calls, finish in out:
                if calls:
                    self.assertEqual(finish, "tool_calls")
                    for c in calls:
                        self.assertEqual(call_errors(c), [], c)
                else:
                    self.assertIn(finish, ("stop", "length"))
                    self.assertIsInstance(content, str)

    def test_n_choices(self):
        r = client(self.PORT).chat.completions.create(model=MODEL_ID[self.PORT], messages=MESSAGES, tools=TOOLS,
                                                      tool_choice="required", n=2, seed=800, max_tokens=400,
                                                      temperature=1.0)
        self.assertEqual(len(r.choices), 2)
        out = [(c.message.content, [as_dict(t) for t in c.message.tool_calls or []], c.finish_reason)
               for c in r.choices]
        self.assert_calls(out, what="choice")

    def test_round_trip(self):
        """A call, its result as a tool message, and the answer: the conversation with tool_calls and a tool message
        is accepted and answered (tool_choice none: text; auto: text or valid calls)."""
        _, calls, _ = ask(self.PORT, 900, tool_choice={"type": "function", "function": {"name": "get_weather"}},
                          parallel_tool_calls=False)
        self.assertEqual(len(calls), 1)
        msgs = MESSAGES + [{"role": "assistant", "content": None, "tool_calls": calls},
                           {"role": "tool", "tool_call_id": calls[0]["id"],
                            "content": json.dumps({"temperature": 18, "sky": "sunny"})}]
        for choice in ("none", "auto"):
            for stream in (False, "raw"):
                content, more, finish = ask(self.PORT, 901, stream=stream, messages=msgs, tool_choice=choice,
                                            max_tokens=60)
                if more:
                    self.assertEqual(choice, "auto")
                    self.assertEqual(finish, "tool_calls")
                    for c in more:
                        self.assertEqual(call_errors(c), [], c)
                else:
                    self.assertIn(finish, ("stop", "length"))
                    self.assertTrue(content, "empty answer (tool_choice %s, stream %s)" % (choice, stream))
                    self.assertNotIn("<tool_call>", content)

    def test_bad_requests(self):
        c = client(self.PORT).chat.completions
        bad_params = dict(TOOLS[0]["function"], parameters={"type": "object", "properties": {"n": {"type": "number",
                                                                                                   "multipleOf": 0.5}}})
        for kw, param, code in [
                (dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}), "tool_choice",
                 "invalid_value"),
                (dict(tool_choice="required"), "tool_choice", None),
                (dict(tools=[{"type": "function", "function": bad_params}]), "tools[0].function.parameters",
                 "unsupported_parameter"),
                (dict(tools=[{"type": "function", "function": {"name": "bad name"}}]), "tools[0].function.name", None),
                (dict(tools=TOOLS, tool_choice="sometimes"), "tool_choice", "invalid_value")]:
            with self.assertRaises(openai.BadRequestError) as e:
                c.create(model=MODEL_ID[self.PORT], messages=MESSAGES, max_tokens=5, **kw)
            self.assertEqual(e.exception.status_code, 400)
            self.assertEqual(e.exception.param, param, e.exception.body)
            self.assertEqual(e.exception.code, code, e.exception.body)


class Colocated(Tools, unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        start(cls, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 8}], 1000, "tools", extra=CHATML)


if __name__ == "__main__":
    unittest.main()
