#!/usr/bin/env python3
"""scripts/golden/make_gemma_golden.py: llama.cpp's answers for the Gemma 3 270M GGUF, for tests/models/test_gemma.cc.

  tests/models/golden/gemma_tokenizer.json: token ids of texts (base64, so invalid UTF-8 survives) from llama.cpp's
    llama-tokenize (--ids --no-bos --no-escape, with and without --no-parse-special).
  tests/models/golden/gemma_greedy.json: for each prompt (BOS + text, as llama-server tokenizes it), 24 greedy tokens
    from llama-server's /completion (temperature 0) and the top-20 probabilities of the first generated position
    (n_probs; llama-server returns softmax probabilities over the full vocabulary, not raw logits, so the test
    compares log-probabilities: log p = logit - logsumexp(logits)), and llama.cpp's top1 - top2 margin at each
    greedy step. This model is numerically touchy: llama-server's own log-probabilities move by up to 0.69 between
    -fa on (the default here) and -fa off on these prompts.

Needs llama.cpp's binaries (bench/peer.sh builds them) and the GGUF (scripts/fetch_gemma.sh). Usage:
  python3 scripts/golden/make_gemma_golden.py [BIN_DIR]
"""
import base64
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models/weights/gemma-3-270m-q4_k_m.gguf")
OUT = os.path.join(ROOT, "tests/models/golden")
# the peer's bin dir: bench/peer.sh prints it (building the peer the first time)
BIN = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
    [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peer.sh")],
    check=True, capture_output=True, text=True).stdout.strip()
N_GEN = 24
N_PROBS = 20

TEXTS = [
    b"Hello world", b"Hello, world! How are you today?", b"The quick brown fox jumps over the lazy dog.",
    b"hello", b" hello", b"  hello", b"   leading spaces", b"a", b" ", b"   ", b"\t", b"\n", b"\n\n\n",
    b"line one\nline two\r\nline three", b"trailing spaces   ", b"tabs\tand\t\tmore\ttabs",
    b"mixed \t \n whitespace \n\n  runs", b"1234567", b"3.14159", b"The year 2024 had 366 days.",
    b"x=42; y = -17.5e+3", b"phone: +1 (555) 123-4567", b"def add(a, b):\n    return a + b\n",
    b"int main(void) { printf(\"%d\\n\", 1 << 10); return 0; }",
    b"for (let i = 0; i < arr.length; i++) {\n\tconsole.log(arr[i]);\n}",
    b"<html><body class=\"x\">Hi &amp; bye</body></html>",
    b"It's what they're saying: we've, I'm, you'll, he'd, don't",
    "caf\u00e9 na\u00efve r\u00e9sum\u00e9 \u00fcber Stra\u00dfe \u00e7a va".encode(),
    "e\u0301 (combining acute)".encode(),
    "\u4f60\u597d\uff0c\u4e16\u754c\uff01\u6211\u662f\u4e00\u4e2a\u6a21\u578b\u3002".encode(),
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3067\u3059".encode(),
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8".encode(),
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043a\u0430\u043a \u0434\u0435\u043b\u0430?".encode(),
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645".encode(),
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e".encode(),
    "emoji \U0001F600\U0001F680 and \U0001F468\u200D\U0001F469\u200D\U0001F467 family".encode(),
    "\u00bd \u2154 \u0663\u0664 \u2163 \u00b2".encode(),
    "non\u00a0breaking\u2003em\u3000ideographic".encode(),
    # rare characters that are likely no token of their own: byte fallback <0xXX>
    "\U0001D54F\U0001D56A \U00010348 \U0001F9FF\U0001FAE0 \u2E3B \U00013000".encode(),
    "\U000E0041\U000F0000 private use".encode(),
    b"\xff\xfe invalid bytes", b"abc\x80def", b"truncated \xe4\xbd", b"\xc3(", b"\xed\xa0\x80 surrogate",
    b"\xc0\x80 overlong", b"ctrl \x01\x04\x7f bytes", b"\x1b[0m escape",
    b"!!!???...;;;", b"email@example.com https://example.org/path?q=1&r=2#frag",
    b"aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa",
    b"    indented code\n        more\n", b"SELECT * FROM users WHERE id = 7;",
    b"\"quoted\" 'single' `back`", b"1,000,000.00 $ 50% off", b"a\n\nb\n\n\nc",
    b"    ", b"\n \n", b"x" * 3 + b" " * 7 + b"y",
    b"<start_of_turn>user\nHi<end_of_turn>", b"<bos>text", b"[multimodal] tag",
    b"CamelCaseIdentifierName snake_case_name", b"ALL CAPS SHOUTING", b"Mr. O'Neil's 3rd-floor apt. #4B",
    "\u00e0\u00e8\u00ec\u00f2\u00f9 \u00c0\u00c8 \u0153\u00e6 \u00df".encode(),
    "\u03b1\u03b2\u03b3 \u03a9 \u2211\u222b\u221e \u2260 \u2264".encode(),
    "\u2192 \u2190 \u2022 \u2026 \u201cquotes\u201d \u2014 dash".encode(),
]

SPECIAL_TEXTS = [
    b"<start_of_turn>user\nWhat is 2+2?<end_of_turn>\n<start_of_turn>model\n",
    b"<bos><start_of_turn>user\nHi<end_of_turn>",
    b"a<end_of_turn>b<start_of_turn>c", b"<start_of_turn> spaced <end_of_turn>", b"<eos>after",
    b"<start_of_turn broken> <end_of_turn",
]

PROMPTS = [
    "The capital of France is",
    "Once upon a time, in a small village by the sea,",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "The three primary colors are red, blue and",
    "Water boils at 100 degrees Celsius at sea level. At the top of a mountain",
    "<start_of_turn>user\nWhat is the capital of France?<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nWrite a haiku about autumn leaves.<end_of_turn>\n<start_of_turn>model\n",
    "<start_of_turn>user\nList three fruits that are yellow.<end_of_turn>\n<start_of_turn>model\n",
    "Translate to French: I like cheese. ->",
    "1, 2, 3, 4, 5,",
    # longer than the 512-token sliding window, so the local layers' window matters
    "Here is a list of numbered facts.\n" + "".join(f"Fact {i}: the number {i} squared is {i * i}.\n" for i in range(1, 60))
    + "Fact 60: the number 60 squared is",
]


def tokenize(text, special):
    args = [os.path.join(BIN, "llama-tokenize"), "-m", MODEL, "--stdin", "--ids", "--no-bos", "--no-escape", "--log-disable"]
    if not special:
        args.append("--no-parse-special")
    r = subprocess.run(args, input=text, capture_output=True, check=True)
    line = r.stdout.decode().strip().splitlines()[-1]
    return json.loads(line)


def post(port, path, body):
    req = urllib.request.Request(f"http://127.0.0.1:{port}{path}", data=json.dumps(body).encode(),
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=300) as r:
        return json.loads(r.read())


def greedy():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    srv = subprocess.Popen([os.path.join(BIN, "llama-server"), "-m", MODEL, "--port", str(port), "-c", "4096",
                            "-np", "1", "-t", "2", "--log-disable"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(300):
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2) as r:
                    if r.status == 200:
                        break
            except Exception:
                time.sleep(0.2)
        cases = []
        for text in PROMPTS:
            ids = post(port, "/tokenize", {"content": text, "add_special": True, "parse_special": True})["tokens"]
            r = post(port, "/completion", {"prompt": ids, "n_predict": N_GEN, "temperature": 0,
                                          "n_probs": N_PROBS, "return_tokens": True, "cache_prompt": False,
                                          "ignore_eos": True})
            first = r["completion_probabilities"][0]["top_logprobs"]
            # top1 - top2 at each greedy step (a difference of log-probabilities is one of logits): near-ties show here
            margins = [round(p["top_logprobs"][0]["logprob"] - p["top_logprobs"][1]["logprob"], 4)
                       for p in r["completion_probabilities"]]
            cases.append({"text": text, "prompt": ids, "greedy": r["tokens"], "greedy_margins": margins,
                          "top_ids": [p["id"] for p in first], "top_logprobs": [round(p["logprob"], 5) for p in first]})
            print(f"greedy: {len(ids)} prompt tokens -> {r['tokens'][:6]}...", file=sys.stderr)
        return cases
    finally:
        srv.terminate()
        srv.wait()


def main():
    cases = []
    for special, texts in ((False, TEXTS), (True, SPECIAL_TEXTS)):
        for t in texts:
            cases.append({"text_b64": base64.b64encode(t).decode(), "special": special,
                          "ids": tokenize(t, special) if t else []})
    with open(os.path.join(OUT, "gemma_tokenizer.json"), "w") as f:
        f.write('{"model": "gemma-3-270m-q4_k_m.gguf", "reference": "llama.cpp 0.3.36 llama-tokenize --no-bos --no-escape", "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in cases))
        f.write("\n]}\n")
    print(f"{len(cases)} tokenizer cases", file=sys.stderr)
    if os.environ.get("GEMMA_GOLDEN_TOKENIZER_ONLY"):
        return
    g = greedy()
    with open(os.path.join(OUT, "gemma_greedy.json"), "w") as f:
        f.write('{"model": "gemma-3-270m-q4_k_m.gguf", "reference": "llama.cpp 0.3.36 llama-server /completion, '
                f'temperature 0, n_probs {N_PROBS} (log-probabilities, not raw logits)", "n_gen": {N_GEN}, "cases": [\n')
        f.write(",\n".join(json.dumps(c) for c in g))
        f.write("\n]}\n")


if __name__ == "__main__":
    main()
