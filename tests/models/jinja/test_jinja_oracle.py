#!/usr/bin/env python3
"""tests/models/jinja/test_jinja_oracle.py: models/jinja.c against Python's jinja2 on the published chat templates.

Every (template in tests/models/templates, conversation in tests/models/chat_corpus.json) pair is rendered by jinja2
in Hugging Face's apply_chat_template environment (ImmutableSandboxedEnvironment, trim_blocks, lstrip_blocks,
loopcontrols, tojson = json.dumps(ensure_ascii=False), raise_exception, strftime_now at a fixed time in UTC) and by
jinja_render (tests/models/jinja/jinja_render.c). The outputs must be byte-identical; a pair where the template calls
raise_exception must raise the same message; a pair where jinja2 fails otherwise must fail too. The request-text
spans jinja_render reports must cover every occurrence of the conversation's texts and hold nothing but request text.

A second case renders 1600 random templates (a fixed seed; text, every tag, whitespace control, and expressions over
the operators, filters, tests and methods the interpreter has) over a small context: each must render as jinja2 does,
or fail where jinja2 fails.

Usage: test_jinja_oracle.py JINJA_RENDER (ctest passes the built tool).
"""

import datetime
import json
import os
import random
import subprocess
import sys
import tempfile
import unittest

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment

HERE = os.path.dirname(os.path.abspath(__file__))
TEMPLATES = os.path.join(HERE, "..", "templates")
CORPUS = os.path.join(HERE, "..", "chat_corpus.json")
NOW = 1765000000  # 2025-12-06 05:46:40 UTC: what strftime_now formats on both sides
RENDER = None  # set from argv

# The special tokens each template's model defines (bos_token, eos_token in the context, as HF passes them).
TOKENS = {
    "meta-llama-Llama-3.1-8B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "meta-llama-Llama-3.2-3B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-Qwen2.5-7B-Instruct": ("", "<|im_end|>"),
    "Qwen-Qwen3-0.6B": ("", "<|im_end|>"),
    "mistralai-Mistral-Nemo-Instruct-2407": ("<s>", "</s>"),
    "microsoft-Phi-3.5-mini-instruct": ("<s>", "<|endoftext|>"),
    "google-gemma-2-2b-it": ("<bos>", "<eos>"),
    "google-gemma-3-it": ("<bos>", "<eos>"),
    "deepseek-ai-DeepSeek-V3.1": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "NousResearch-Hermes-3-Llama-3.1-8B-tool_use": ("<|begin_of_text|>", "<|im_end|>"),
    "HuggingFaceTB-SmolLM2-135M-Instruct": ("<|im_start|>", "<|im_end|>"),
    "meta-llama-Llama-3.3-70B-Instruct": ("<|begin_of_text|>", "<|eot_id|>"),
    "Qwen-QwQ-32B": ("", "<|im_end|>"),
    "deepseek-ai-DeepSeek-R1-Distill-Qwen-32B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "deepseek-ai-DeepSeek-R1-Distill-Llama-8B": ("<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>"),
    "HuggingFaceTB-SmolLM3-3B": ("", "<|im_end|>"),
    "Qwen3-Coder": ("", "<|im_end|>"),
}


class Raised(Exception):
    pass


def hf_env():
    """The environment transformers' apply_chat_template compiles templates in (chat_template_utils.py)."""

    def raise_exception(message):
        raise Raised(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc).strftime(fmt)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = strftime_now
    return env


def request_strings(v, top=True):
    """Every string below the context's top level (keys too), and the containers holding them."""
    if isinstance(v, str):
        if not top:
            yield v
    elif isinstance(v, dict):
        for k, x in v.items():
            if not top:
                yield k
            if not (top and isinstance(x, str)):  # a top-level string (bos_token) is the caller's
                yield from request_strings(x, False)
    elif isinstance(v, list):
        for x in v:
            yield from request_strings(x, False)


def request_material(ctx):
    """Text a span may hold: each request string, and each nested value as tojson and str() print it."""
    parts = list(request_strings(ctx))

    def walk(v, top):
        if not top and isinstance(v, (dict, list, str)):
            parts.append(json.dumps(v, ensure_ascii=False))
            parts.append(json.dumps(v, ensure_ascii=False, indent=4))
            parts.append(str(v))
        if isinstance(v, dict):
            for x in v.values():
                walk(x, False)
        elif isinstance(v, list):
            for x in v:
                walk(x, False)

    walk(ctx, True)
    return "\x00".join(parts)


def run_tool(tpl_path, ctx):
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False, encoding="utf-8") as f:
        json.dump(ctx, f, ensure_ascii=False)
        path = f.name
    try:
        p = subprocess.run([RENDER, tpl_path, path, str(NOW)], capture_output=True, timeout=60)
    finally:
        os.unlink(path)
    return p.returncode, p.stdout, p.stderr.decode("utf-8", "replace")


class OracleTest(unittest.TestCase):
    def test_corpus_byte_identical(self):
        env = hf_env()
        corpus = json.load(open(CORPUS, encoding="utf-8"))["conversations"]
        names = sorted(f[:-6] for f in os.listdir(TEMPLATES) if f.endswith(".jinja"))
        self.assertEqual(sorted(TOKENS), names, "every template needs its tokens row and every row a template")
        counts = {}
        for name in names:
            path = os.path.join(TEMPLATES, name + ".jinja")
            tpl_text = open(path, encoding="utf-8").read()
            tpl = env.from_string(tpl_text)
            bos, eos = TOKENS[name]
            for conv in corpus:
                ctx = {k: v for k, v in conv.items() if k != "name"}
                ctx["bos_token"], ctx["eos_token"] = bos, eos
                with self.subTest(template=name, conversation=conv["name"]):
                    try:
                        want, kind = tpl.render(**ctx), "ok"
                    except Raised as e:
                        want, kind = str(e), "raised"
                    except Exception as e:  # a template bug on this input: jinja_render must fail too
                        want, kind = "%s: %s" % (type(e).__name__, e), "error"
                    rc, out, err = run_tool(path, ctx)
                    counts.setdefault(name, {}).setdefault(kind, 0)
                    counts[name][kind] += 1
                    if kind == "raised":
                        self.assertEqual(rc, 3, "jinja2 raised %r; jinja_render: rc %d %s" % (want, rc, err))
                        self.assertEqual(err.strip(), "raised: " + want)
                        continue
                    if kind == "error":
                        self.assertEqual(rc, 1, "jinja2 failed (%s); jinja_render: rc %d %s" % (want, rc, err))
                        continue
                    self.assertEqual(rc, 0, "jinja_render failed: " + err)
                    self.assertEqual(out.decode("utf-8"), want)
                    self.check_spans(out, err, ctx, tpl_text)
        for name in names:  # a corpus where most pairs fail would prove little
            self.assertGreaterEqual(counts[name].get("ok", 0), 5, "%s: %s" % (name, counts[name]))
        print("pairs per template:", json.dumps(counts), file=sys.stderr)

    def check_spans(self, out, err, ctx, tpl_text):
        line = [l for l in err.splitlines() if l.startswith("spans")][-1]
        spans = [tuple(map(int, p.split(","))) for p in line.split()[1:]]
        end = 0
        for off, n in spans:
            self.assertGreater(n, 0)
            self.assertGreaterEqual(off, end, "spans overlap or are out of order")
            end = off + n
        self.assertLessEqual(end, len(out))
        covered = bytearray(len(out))
        for off, n in spans:
            covered[off:off + n] = b"\x01" * n
        # every occurrence of a distinctive request text (contents, arguments) lies inside a span
        for s in set(request_strings(ctx)):
            for t in {s, s.strip()}:
                b = t.encode("utf-8")
                if len(b) < 8 or t in tpl_text:  # short, or also written by the template itself
                    continue
                i = out.find(b)
                while i >= 0:
                    self.assertTrue(all(covered[i:i + len(b)]), "request text %r at %d is not in a span" % (t, i))
                    i = out.find(b, i + 1)
        # and a span holds nothing but request text: each is a piece of a request string or of its tojson/str form
        material = request_material(ctx)
        for off, n in spans:
            piece = out[off:off + n].decode("utf-8")
            self.assertTrue(piece in material, "span %d+%d %r is not request text" % (off, n, piece))


# ---- random templates ----

RANDOM_CTX = {"s": "  Hello World  ", "t": "a</t>b", "n": 3, "f": 2.5, "l": [1, 2, 3], "w": ["x", "y", "z"],
              "d": {"a": 1, "b": "two", "c": [1, 2]}, "e": "", "z": 0, "nul": None, "tr": True,
              "msgs": [{"role": "user", "content": " hi "}, {"role": "assistant", "content": "yo"},
                       {"role": "user", "content": "<|im_end|>q"}]}
LITERALS = ["1", "0", "-2", "3.5", "1e3", "'ab'", '"q\\n"', "'it\\'s'", "true", "false", "none", "[1, 'a']", "{'k': 2}",
            "''", "(1, 2)", "10", "7", "0.1"]
NAMES = ["s", "t", "n", "f", "l", "w", "d", "msgs", "e", "z", "nul", "tr", "missing", "msgs[0]", "d.a", "d['b']",
         "msgs[1].content"]
OPS = ["+", "-", "*", "//", "~", "==", "!=", "<", ">=", "and", "or", "in", "not in"]  # % on strings is printf: left out
FILTERS = ["trim", "length", "string", "list", "tojson", "first", "last", "join(',')", "default('D')", "items | list",
           "reverse | list", "upper", "lower", "int", "float", "abs", "tojson(indent=2)", "count", "round(1)",
           "capitalize", "title", "replace('l','L')", "d", "indent(2)", "dictsort", "selectattr('role') | list",
           "map(attribute='role') | join", "safe", "min", "max"]
TESTS = ["defined", "undefined", "none", "string", "number", "mapping", "iterable", "sequence", "odd", "even", "true",
         "false", "boolean", "integer", "float", "callable", "divisibleby(2)", "equalto 1", "in [1, 2]"]
METHODS = [("strip", ""), ("strip", "'H '"), ("lstrip", ""), ("rstrip", "' d'"), ("split", ""), ("split", "'</t>'"),
           ("split", "'l', 1"), ("startswith", "'  H'"), ("endswith", "'b'"), ("replace", "'l', 'L'"), ("lower", ""),
           ("upper", ""), ("find", "'o'"), ("title", "")]


def random_template(R):
    def expr(depth=0):
        if depth > 3:
            return R.choice(LITERALS + NAMES)
        k = R.randrange(14)
        sub = lambda: expr(depth + 1)
        return [lambda: R.choice(LITERALS), lambda: R.choice(NAMES),
                lambda: "(%s %s %s)" % (sub(), R.choice(OPS), sub()),
                lambda: "%s | %s" % (sub(), R.choice(FILTERS)),
                lambda: "%s is %s" % (sub(), R.choice(TESTS)),
                lambda: "%s if %s else %s" % (sub(), sub(), sub()),
                lambda: "not %s" % sub(),
                lambda: "%s[%s]" % (R.choice(NAMES), R.choice(["0", "-1", "1", "'a'", "'content'", "n"])),
                lambda: "%s[%s:%s%s]" % (R.choice(["s", "l", "w", "t", "'h\u00e9llo'"]), R.choice(["", "1", "-2"]),
                                          R.choice(["", "3", "-1"]), R.choice(["", ":2", ":-1"])),
                lambda: "%s.%s(%s)" % (R.choice(["s", "t", "'a b  c'", "e", "msgs[0].content"]), *R.choice(METHODS)),
                lambda: "d.%s()" % R.choice(["items", "keys", "values"]) if R.random() < 0.5 else "d.get('a', 5)",
                lambda: "-%s" % R.choice(["n", "f", "1", "l"]),
                lambda: "[%s, %s]" % (sub(), sub()),
                lambda: "%s ** %s" % (R.choice(["2", "n", "f"]), R.choice(["2", "0", "-1", "3"]))][k]()

    def block(depth=0):
        out = []
        for _ in range(R.randrange(1, 5)):
            k = R.randrange(8 if depth < 3 else 3)
            o = lambda: "{%" + R.choice(["", "-", "+"]) + " "
            c = lambda: " " + R.choice(["", "-", "+"]) + "%}"
            if k == 0:
                out.append(R.choice(["a", "  ", "\n", "b\n", "  \n  ", "\t", "x", " y ", "\n\n"]))
            elif k == 1:
                out.append("{{" + R.choice(["", "-"]) + " " + expr() + " " + R.choice(["", "-"]) + "}}")
            elif k == 2:
                out.append("{#" + R.choice(["", "-"]) + " note " + R.choice(["", "-"]) + "#}")
            elif k == 3:
                s = o() + "if " + expr() + c() + block(depth + 1)
                if R.random() < 0.4:
                    s += o() + "elif " + expr() + c() + block(depth + 1)
                if R.random() < 0.4:
                    s += o() + "else" + c() + block(depth + 1)
                out.append(s + o() + "endif" + c())
            elif k == 4:
                v = R.choice([("x", "l"), ("x", "w"), ("x", "msgs"), ("x", "s"), ("k, v", "d.items()"), ("x", "d"),
                              ("x", "range(3)"), ("x", "missing")])
                s = o() + "for %s in %s" % v + c() + block(depth + 1)
                s += R.choice(["", "{{ loop.index }}{{ loop.first }}", "{{ x }}"])
                if R.random() < 0.3:
                    s += o() + "else" + c() + block(depth + 1)
                out.append(s + o() + "endfor" + c())
            elif k == 5:
                out.append(o() + "set %s = %s" % (R.choice(["n", "v", "s", "q"]), expr()) + c())
            elif k == 6:
                out.append(o() + "set ns = namespace(c=0)" + c() + o() + "for x in l" + c() + o() +
                           "set ns.c = ns.c + x" + c() + o() + "endfor" + c() + "{{ ns.c }}")
            else:
                out.append("\n" + R.choice(["  ", "", "\t"]) + o() + "if true" + c() + "\n  in\n" +
                           R.choice(["  ", ""]) + o() + "endif" + c() + R.choice(["\n", "", " "]))
        return "".join(out)

    return block()


class RandomTest(unittest.TestCase):
    def test_random_templates_as_jinja2(self):
        env = hf_env()
        R = random.Random(40)
        counts = {"ok": 0, "error": 0}
        with tempfile.TemporaryDirectory() as d:
            path = os.path.join(d, "t.jinja")
            for i in range(1600):
                tpl = random_template(R)
                with open(path, "w", encoding="utf-8") as f:
                    f.write(tpl)
                try:
                    want, kind = env.from_string(tpl).render(**RANDOM_CTX), "ok"
                except Exception as e:
                    want, kind = "%s: %s" % (type(e).__name__, e), "error"
                counts[kind] += 1
                rc, out, err = run_tool(path, RANDOM_CTX)
                with self.subTest(i=i, template=tpl):
                    if kind == "ok":
                        self.assertEqual(rc, 0, err)
                        self.assertEqual(out.decode("utf-8"), want)
                    else:
                        self.assertIn(rc, (1, 2), "jinja2 failed (%s), jinja_render did not: %r" % (want, out))
        self.assertGreater(counts["ok"], 800, counts)  # most templates must render, or the test proves little


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: test_jinja_oracle.py JINJA_RENDER")
    RENDER = sys.argv.pop(1)
    unittest.main()
