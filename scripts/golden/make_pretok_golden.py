#!/usr/bin/env python3
"""scripts/golden/make_pretok_golden.py: writes tests/models/golden/pretok.json, llama.cpp's token ids for texts under
the llama-bpe (Llama 3) and qwen2 (Qwen 2.5) pre-tokenizers, for tests/models/test_tokenizer.cc.

No Llama 3 or Qwen 2.5 GGUF is at hand, so each pre-tokenizer is tried on SmolLM2's byte-level BPE vocabulary
relabelled: a vocabulary-only GGUF (no tensors) holding SmolLM2's metadata with tokenizer.ggml.pre set to the name
(and no chat template). llama-tokenize (--ids --no-bos --no-escape --no-parse-special) tokenizes every text in that
file. The test writes the same vocabulary-only file itself from SmolLM2's GGUF and compares dserve's ids.

SmolLM2's vocabulary has no token of more than one digit (its own pre-tokenizer splits digits), under which Llama 3's
runs of up to 3 digits and Qwen 2's single digits would give the same ids; so both files get EXTRA_TOKENS appended
(ids from 49152 on) with EXTRA_MERGES after SmolLM2's merges: digit tokens that only a run of digits can merge into,
and "zzzq", which no merge reaches (llama-bpe's ignore_merges takes such a word whole).

Texts are stored base64 (so that any byte survives). Run with a venv holding the gguf package and llama.cpp's
binaries (bench/peer.sh):
  python3 -m venv /tmp/gguf-venv && /tmp/gguf-venv/bin/pip install gguf numpy
  /tmp/gguf-venv/bin/python scripts/golden/make_pretok_golden.py [BIN_DIR]
"""
import base64
import json
import os
import subprocess
import sys
import tempfile

import gguf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests/models/golden/pretok.json")
# the peer's bin dir: bench/peer.sh prints it (building the peer the first time)
BIN = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
    [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peer.sh")],
    check=True, capture_output=True, text=True).stdout.strip()
PRES = ["llama-bpe", "qwen2"]
EXTRA_TOKENS = ["12", "123", "45", "456", "zzzq"]
EXTRA_MERGES = ["1 2", "12 3", "4 5", "45 6"]

TEXTS = [
    # digits: runs of 1..10, inside words, with separators, other scripts' numbers
    "1", "12", "123", "1234", "12345", "1234567", "1234567890", "abc123def", "x=42; y = -17.5e+3",
    "3.14159 and 2,718,281", "phone: +1 (555) 123-4567", "The year 2024 had 366 days.", "٣٤٥ ৩৪৫ ５６７ Ⅻ ½",
    "v1.2.3-rc4", "0x1F2E3D4C", "123 1234 12345 456456 4567 0123", "zzzq zzzq zzzqzzzq", "a1234567b",
    # contractions in either case, and apostrophes elsewhere
    "It's what they're saying: we've, I'm, you'll, he'd, don't", "IT'S LOUD 'S 'T 'RE 'VE 'M 'LL 'D",
    "'s't're've'm'll'd", "It'S mIxEd'Re 'Ll", "rock'n'roll 'quoted' ''", "l'été c'est", "’curly’ apostrophes’s",
    # punctuation runs, with newlines after them
    "Hello, world! How are you today?", "...!!!???", "a.b,c;d:e", "(nested [brackets] {braces})", "end.\n\nNext",
    "--flag=value && echo $HOME | grep -v x", "<html><body class=\"x\">Hi &amp; bye</body></html>",
    "@user #tag $5 %d ^_^ ~/path", "-->\r\n<--", " !leading space before punctuation", "   !!! spaced",
    "emoji 🙂🙃 and ★☆ symbols", "quote: \"a\" 'b' `c`",
    # Unicode letters and marks
    "café naïve résumé über Straße ça va", "Ελληνικά κείμενο", "Русский текст здесь", "日本語のテキスト",
    "中文文本测试", "한국어 텍스트", "עברית ועוד", "العربية نص", "हिन्दी पाठ",
    "e\u0301 a\u0300 n\u0303 combining marks", "\u0915\u094d\u0937 conjunct", "ﬁ ligature ǅ titlecase",
    # whitespace runs and newlines
    " ", "  ", "   hello", "trailing spaces   ", "tabs\tand\t\tmore\ttabs", "mixed \t \n whitespace \n\n  runs",
    "\n", "\n\n\n", "line one\nline two\r\nline three", "  \n  indented\n    more", "a \n b", "x\r\r\ny",
    "\u00a0non-breaking\u2003em space\u3000ideographic", "word \n\n", "\t\n\t\n",
    # code
    "def add(a, b):\n    return a + b\n", "int main(void) { printf(\"%d\\n\", 1 << 10); return 0; }",
    "for (let i = 0; i < arr.length; i++) {\n\tconsole.log(arr[i]);\n}",
    # special-looking text (not parsed as special tokens)
    "<|im_start|>user\nhi<|im_end|>", "<|endoftext|> after",
]


def vocab_only(pre, path):
    r = gguf.GGUFReader(MODEL)
    w = gguf.GGUFWriter(path, "llama")
    for key, f in r.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "tokenizer.ggml.pre", "tokenizer.chat_template"):
            continue
        vt = f.types[0]
        sub = f.types[1] if vt == gguf.GGUFValueType.ARRAY else None
        val = f.contents()
        if key == "tokenizer.ggml.tokens":
            val = val + EXTRA_TOKENS
        elif key == "tokenizer.ggml.token_type":
            val = val + [1] * len(EXTRA_TOKENS)  # normal
        elif key == "tokenizer.ggml.merges":
            val = val + EXTRA_MERGES
        elif key.startswith("tokenizer.ggml.") and vt == gguf.GGUFValueType.ARRAY:
            raise SystemExit(f"{key}: an array this script does not extend")
        w.add_key_value(key, val, vt, sub)
    w.add_key_value("tokenizer.ggml.pre", pre, gguf.GGUFValueType.STRING)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def tokenize(path, text):
    args = [os.path.join(BIN, "llama-tokenize"), "-m", path, "--stdin", "--ids", "--no-bos", "--no-escape",
            "--no-parse-special", "--log-disable"]
    r = subprocess.run(args, input=text, capture_output=True, check=True)
    return json.loads(r.stdout.decode().strip().splitlines()[-1])


def main():
    res = {"made_by": "/tmp/gguf-venv/bin/python scripts/golden/make_pretok_golden.py (llama.cpp 0.3.36 llama-tokenize "
                      "--ids --no-bos --no-escape --no-parse-special on SmolLM2's vocabulary relabelled)",
           "model": os.path.basename(MODEL), "extra_tokens": EXTRA_TOKENS, "extra_merges": EXTRA_MERGES, "pre": {}}
    with tempfile.TemporaryDirectory() as d:
        for pre in PRES:
            path = os.path.join(d, pre + ".gguf")
            vocab_only(pre, path)
            cases = []
            for t in TEXTS:
                b = t.encode()
                cases.append({"text_b64": base64.b64encode(b).decode(), "ids": tokenize(path, b)})
            res["pre"][pre] = cases
    with open(OUT, "w") as f:
        json.dump(res, f, indent=0)
        f.write("\n")
    print(f"wrote {OUT}: {len(TEXTS)} texts x {len(PRES)} pre-tokenizers", file=sys.stderr)


if __name__ == "__main__":
    main()
