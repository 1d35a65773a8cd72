"""tests/e2e/test_chat_template.py: Jinja chat templates through the router with the openai client: a cluster serving SmolLM2 with --chat-template-file (Qwen3's published template) renders the prompt byte for byte as Python's jinja2 does, answers, and reads forced calls in Qwen's format, colocated and 1P1D; a request's own chat_template runs Llama 3.1's and Mistral Nemo's templates, whose call formats are read back; raise_exception and a template without tools are 400s; a template that does not parse stops the start naming its line."""

import json
import os
import shutil
import subprocess
import tempfile
import unittest

import e2e_util as u
from oai_util import MODEL_ID, client, openai, start

try:
    import jinja2
    import jinja2.sandbox
except ImportError:  # the test venv has it (scripts/setup.sh); oai_util re-executes under it
    jinja2 = None

TEMPLATES = os.path.join(u.SOURCE_DIR, "tests", "models", "templates")
QWEN3 = os.path.join(TEMPLATES, "Qwen-Qwen3-0.6B.jinja")
LLAMA31 = os.path.join(TEMPLATES, "meta-llama-Llama-3.1-8B-Instruct.jinja")
NEMO = os.path.join(TEMPLATES, "mistralai-Mistral-Nemo-Instruct-2407.jinja")
GEMMA2 = os.path.join(TEMPLATES, "google-gemma-2-2b-it.jinja")

WEATHER = {"type": "object", "properties": {"city": {"type": "string", "minLength": 1, "maxLength": 20}},
           "required": ["city"], "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "The current weather in a city.",
                                           "parameters": WEATHER}}]
ASK = [{"role": "user", "content": "What is the weather like in Paris today?"}]
FORCE = {"type": "function", "function": {"name": "get_weather"}}


def read(path):
    with open(path) as f:
        return f.read()


def hf_render(template, **ctx):
    """The prompt as Hugging Face's apply_chat_template renders it (its jinja2 environment)."""

    def raise_exception(msg):
        raise jinja2.exceptions.TemplateError(msg)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = jinja2.sandbox.ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                                       extensions=["jinja2.ext.loopcontrols"])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env.from_string(template).render(**ctx)


class FileTemplate(unittest.TestCase):
    """--chat-template-file (the config's chat_template_file) with Qwen3's template."""

    @classmethod
    def setUpClass(cls):
        if jinja2 is None:
            raise unittest.SkipTest("jinja2 is not installed (scripts/setup.sh makes the test venv)")
        cls.c = start(cls, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 4}], 1000, "chat-template",
                      extra={"chat_template_file": QWEN3})

    def post(self, path, body):
        status, r = u.post(self.PORT, path, body)
        self.assertEqual(status, 200, r)
        return r

    def prompt_text(self, body):
        ids = self.post("/tokenize", body)["tokens"]
        return self.post("/detokenize", {"tokens": ids})["prompt"]

    def test_renders_as_jinja2(self):
        """The router's prompt is the file's template rendered as jinja2 renders it: system turn, several turns, an
        assistant's call with its arguments as a mapping, a tool result, tools, reasoning_content, kwargs."""
        msgs = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi <|im_end|> there"},
                {"role": "assistant", "content": "Hello.", "reasoning_content": "greet"},
                {"role": "user", "content": "Weather in Oslo?"},
                {"role": "assistant", "content": "", "tool_calls": [
                    {"id": "call_1", "type": "function",
                     "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
                {"role": "tool", "tool_call_id": "call_1", "content": "12 C"}]
        hf_msgs = json.loads(json.dumps(msgs))
        hf_msgs[4]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo"}
        for kwargs in ({}, {"enable_thinking": False}):
            body = {"messages": msgs, "tools": TOOLS, "add_generation_prompt": True}
            if kwargs:
                body["chat_template_kwargs"] = kwargs
            want = hf_render(read(QWEN3), messages=hf_msgs, tools=TOOLS, add_generation_prompt=True,
                             bos_token="<|im_start|>", eos_token="<|im_end|>", **kwargs)
            self.assertEqual(self.prompt_text(body), want)
        # the user's "<|im_end|>" is text, not the template's marker: only the template's own are the marker token
        body = {"messages": [{"role": "user", "content": "<|im_end|>"}]}
        ids = self.post("/tokenize", body)["tokens"]
        marker = self.post("/tokenize", {"prompt": "<|im_end|>"})["tokens"]
        self.assertEqual(len(marker), 1)
        self.assertEqual(ids.count(marker[0]), self.prompt_text(body).count("<|im_end|>") - 1)

    def test_answers_and_says_which_template(self):
        r = client(self.PORT).chat.completions.create(model=MODEL_ID[self.PORT], messages=ASK, max_tokens=8,
                                                      temperature=0)
        self.assertEqual(r.choices[0].message.role, "assistant")
        self.assertGreater(r.usage.completion_tokens, 0)
        m = client(self.PORT).models.list().data[0]
        self.assertIn("Qwen-Qwen3-0.6B.jinja", m.model_extra["chat_template_source"])

    def test_forced_call_in_qwen_format(self):
        """tool_choice named: the call grammar writes Qwen's <tool_call> (the template's format); the call comes back
        parsed, streamed too."""
        for stream in (False, True):
            kw = dict(model=MODEL_ID[self.PORT], messages=ASK, tools=TOOLS, tool_choice=FORCE, max_tokens=80,
                      temperature=0)
            if stream:
                calls, finish = {}, None
                for ch in client(self.PORT).chat.completions.create(stream=True, **kw):
                    for d in ch.choices[0].delta.tool_calls or []:
                        c = calls.setdefault(d.index, {"name": "", "args": ""})
                        c["name"] += d.function.name or ""
                        c["args"] += d.function.arguments or ""
                    finish = ch.choices[0].finish_reason or finish
                self.assertEqual(finish, "tool_calls")
                name, args = calls[0]["name"], calls[0]["args"]
            else:
                r = client(self.PORT).chat.completions.create(**kw)
                self.assertEqual(r.choices[0].finish_reason, "tool_calls")
                fn = r.choices[0].message.tool_calls[0].function
                name, args = fn.name, fn.arguments
            self.assertEqual(name, "get_weather")
            self.assertEqual(set(json.loads(args)), {"city"})

    def test_request_templates(self):
        """A request's own chat_template runs as Jinja: Llama 3.1's calls are its JSON reply with "parameters",
        Mistral Nemo's a [TOOL_CALLS] array whose 9-character id its template takes back in the next turn."""
        for path, fmt in ((LLAMA31, "parameters"), (NEMO, "[AVAILABLE_TOOLS]")):
            tpl = read(path)
            kw = dict(model=MODEL_ID[self.PORT], messages=ASK, tools=TOOLS, tool_choice=FORCE, max_tokens=80,
                      temperature=0, extra_body={"chat_template": tpl})
            r = client(self.PORT).chat.completions.create(**kw)
            call = r.choices[0].message.tool_calls[0]
            self.assertEqual(call.function.name, "get_weather", path)
            self.assertEqual(set(json.loads(call.function.arguments)), {"city"})
            # streamed: the markup (or Llama 3's bare JSON reply) never comes as content; the same call comes out
            deltas, content = [], ""
            for ch in client(self.PORT).chat.completions.create(stream=True, **kw):
                deltas += ch.choices[0].delta.tool_calls or []
                content += ch.choices[0].delta.content or ""
            self.assertEqual(content, "", path)
            self.assertEqual(deltas[0].function.name, "get_weather")
            self.assertEqual("".join(d.function.arguments or "" for d in deltas), call.function.arguments)
            if path == NEMO:
                self.assertEqual(len(call.id), 9)
                back = ASK + [{"role": "assistant", "content": None, "tool_calls": [call.model_dump()]},
                              {"role": "tool", "tool_call_id": call.id, "content": "18 C"}]
                r2 = client(self.PORT).chat.completions.create(model=MODEL_ID[self.PORT], messages=back, tools=TOOLS,
                                                               max_tokens=4, extra_body={"chat_template": tpl})
                self.assertGreater(r2.usage.prompt_tokens, r.usage.prompt_tokens)
            text = self.prompt_text({"messages": ASK, "tools": TOOLS, "chat_template": tpl})
            self.assertIn(fmt, text)

    def test_template_errors_are_400s(self):
        gemma = read(GEMMA2)
        cases = [  # (request, param, words in the message)
            (dict(messages=[{"role": "user", "content": "a"}, {"role": "user", "content": "b"}],
                  extra_body={"chat_template": gemma}), "messages", "must alternate"),  # raise_exception's text
            (dict(messages=ASK, tools=TOOLS, extra_body={"chat_template": gemma}), "tools", "cannot express tools"),
            (dict(messages=ASK, extra_body={"chat_template": "hi\n{% for %}"}), "chat_template", "line 2"),
            (dict(messages=ASK, extra_body={"chat_template_kwargs": {"eos_token": "x"}}),
             "chat_template_kwargs.eos_token", "cannot be set"),
        ]
        for kw, param, words in cases:
            with self.assertRaises(openai.BadRequestError) as e:
                client(self.PORT).chat.completions.create(model=MODEL_ID[self.PORT], max_tokens=4, **kw)
            self.assertEqual(e.exception.body["param"], param, e.exception.body)
            self.assertIn(words, e.exception.body["message"])


class FileTemplate1P1D(FileTemplate):
    """The same through a prefill and a decode worker: both follow the call grammar in the template's format (its
    args_key travels in the generate message)."""

    @classmethod
    def setUpClass(cls):
        if jinja2 is None:
            raise unittest.SkipTest("jinja2 is not installed (scripts/setup.sh makes the test venv)")
        cls.c = start(cls, [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode", "max_seqs": 4}], 0,
                      "chat-template-1p1d", extra={"chat_template_file": QWEN3})


class DefaultTemplate(unittest.TestCase):
    """No flag: the GGUF's own template (SmolLM2's, which never reads tools) renders; a broken file stops the start."""

    @classmethod
    def setUpClass(cls):
        if openai is None:
            raise unittest.SkipTest("the openai package is not installed")
        start(cls, [{"name": "w0", "role": "both", "threads": 2, "max_seqs": 2}], 1000, "chat-template-gguf")

    def test_gguf_template_and_tools_refused(self):
        m = client(self.PORT).models.list().data[0]
        self.assertIn("tokenizer.chat_template", m.model_extra["chat_template_source"])
        with self.assertRaises(openai.BadRequestError) as e:
            client(self.PORT).chat.completions.create(model=MODEL_ID[self.PORT], messages=ASK, tools=TOOLS,
                                                      max_tokens=4)
        self.assertEqual(e.exception.body["param"], "tools")
        self.assertIn("cannot express tools", e.exception.body["message"])
        # the family still renders it on request, and --chat-template NAME would for the whole server
        r = client(self.PORT).chat.completions.create(model=MODEL_ID[self.PORT], messages=ASK, tools=TOOLS,
                                                      tool_choice=FORCE, max_tokens=80,
                                                      extra_body={"chat_template": "chatml"})
        self.assertEqual(r.choices[0].message.tool_calls[0].function.name, "get_weather")

    def test_broken_template_file_stops_the_start(self):
        d = tempfile.mkdtemp(prefix="dserve-badtpl-")
        self.addCleanup(shutil.rmtree, d, True)
        bad = os.path.join(d, "bad.jinja")
        with open(bad, "w") as f:
            f.write("{% for m in messages %}\n{{ m.content }}\n{% endfor %}\n{% if x %}\n")  # unclosed if
        p = subprocess.run([u.DSERVE, "serve", u.MODEL, "--port", "0", "--chat-template-file", bad],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                           timeout=60 * u.SCALE)
        out = p.stdout.decode("utf-8", "replace")
        self.assertNotEqual(p.returncode, 0, out)
        self.assertIn("bad.jinja", out)
        self.assertRegex(out, r"line \d+")


if __name__ == "__main__":
    unittest.main()
