#!/usr/bin/env python3
"""scripts/golden/make_tokenizer_golden.py: writes tests/models/golden/tokenizer.json (llama.cpp's token ids for
texts stored as base64, so that invalid UTF-8 survives) and tests/models/golden/tokenizer_chat.json (the GGUF's
jinja chat template rendered for a few conversations), for the SmolLM2 GGUF.

Run with the reference venv: /work/.cache/refvenv/bin/python scripts/golden/make_tokenizer_golden.py
"""
import base64
import json
import os
import sys

import jinja2
import llama_cpp

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests/models/golden")

TEXTS = [
    b"Hello world",
    b"Hello, world! How are you today?",
    b"The quick brown fox jumps over the lazy dog.",
    b"hello",
    b" hello",
    b"  hello",
    b"a",
    b"",
    b" ",
    b"   ",
    b"\t",
    b"\n",
    b"\n\n\n",
    b"line one\nline two\r\nline three",
    b"trailing spaces   ",
    b"tabs\tand\t\tmore\ttabs",
    b"mixed \t \n whitespace \n\n  runs",
    b"1234567",
    b"3.14159",
    b"The year 2024 had 366 days.",
    b"x=42; y = -17.5e+3",
    b"phone: +1 (555) 123-4567",
    b"def add(a, b):\n    return a + b\n",
    b"int main(void) { printf(\"%d\\n\", 1 << 10); return 0; }",
    b"for (let i = 0; i < arr.length; i++) {\n\tconsole.log(arr[i]);\n}",
    b"<html><body class=\"x\">Hi &amp; bye</body></html>",
    b"It's what they're saying: we've, I'm, you'll, he'd, don't",
    b"IT'S LOUD 'S 'T 'RE",
    b"'s't're've'm'll'd",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00e7a va".encode(),
    "e\u0301 (combining acute)".encode(),
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u662f\u4e00\u4e2a\u6a21\u578b\u3002".encode(),
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059".encode(),
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8".encode(),
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?".encode(),
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645".encode(),
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e".encode(),
    "emoji \U0001F600\U0001F680 and \U0001F468\u200D\U0001F469\u200D\U0001F467 family".encode(),
    "\u00bd \u2154 \u0663\u0664 \u2163 \u00b2".encode(),  # non-ASCII numbers (No, Nd, Nl)
    "non\u00a0breaking\u2003em\u3000ideographic".encode(),
    b"\xff\xfe invalid bytes",
    b"abc\x80def",
    b"truncated \xe4\xbd",
    b"\xc3(",
    b"\xed\xa0\x80 surrogate",
    b"\xc0\x80 overlong",
    b"ctrl \x01\x04\x7f bytes",  # SmolLM2 has no tokens for some control bytes
    b"\x00nul\x1b[0m",
    # (code points above U+10FFFF, e.g. F4 90 80 80, make llama.cpp 0.3.36 abort; dserve encodes them as U+FFFD)
    b"!!!???...;;;",
    b"email@example.com https://example.org/path?q=1&r=2#frag",
    b"<|im_start|>user\nhi<|im_end|>",
    b"<|endoftext|>",
    b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    b"    indented code\n        more\n",
]

SPECIAL_TEXTS = [
    b"<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
    b"<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n",
    b"<|endoftext|>text after<|endoftext|>",
    b"a<|im_end|>b<|im_start|>c",
    b"<|im_start|><|im_end|>",
    b"<|im_start|>user\nno end",
    b"<|im_start broken|> <|im_end",
    b"<repo_name>x<file_sep>y",
]

CONVERSATIONS = [
    ([{"role": "user", "content": "Hello!"}], True),
    ([{"role": "user", "content": "Hello!"}], False),
    ([{"role": "system", "content": "Be terse."}, {"role": "user", "content": "Hi"}], True),
    ([{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": "4"},
      {"role": "user", "content": "And 3+3?"}], True),
    ([{"role": "assistant", "content": "I start."}], False),
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "multi\nline\n"},
      {"role": "assistant", "content": " spaced "}], True),
    ([], True),
]


def main():
    llm = llama_cpp.Llama(model_path=MODEL, vocab_only=True, verbose=False)
    cases = []
    for special, texts in ((False, TEXTS), (True, SPECIAL_TEXTS)):
        for t in texts:
            ids = llm.tokenize(t, add_bos=False, special=special) if t else []
            # roundtrip: llama.cpp decodes the ids back to exactly the text (not so for invalid UTF-8, or bytes
            # the vocabulary has no token for)
            back = llm.detokenize(ids, special=True) if ids else b""
            cases.append({"text_b64": base64.b64encode(t).decode(), "special": special, "ids": ids,
                          "roundtrip": back == t})
    with open(os.path.join(OUT, "tokenizer.json"), "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "llama_cpp_python": llama_cpp.__version__,
                   "cases": cases}, f, indent=1)
    tpl = jinja2.Environment(loader=jinja2.BaseLoader()).from_string(llm.metadata["tokenizer.chat_template"])
    chats = []
    for msgs, agp in CONVERSATIONS:
        chats.append({"messages": msgs, "add_generation_prompt": agp,
                      "rendered": tpl.render(messages=msgs, add_generation_prompt=agp)})
    with open(os.path.join(OUT, "tokenizer_chat.json"), "w") as f:
        json.dump({"model": "SmolLM2-135M-Instruct.Q4_1.gguf", "chats": chats}, f, indent=1)
    print(f"{len(cases)} tokenizer cases, {len(chats)} chats", file=sys.stderr)


if __name__ == "__main__":
    main()
