#!/usr/bin/env python3
"""scripts/golden/make_embeddings_golden.py: llama.cpp's embeddings of a few texts on both bundled GGUFs, for
tests/e2e/test_embeddings.py.

  tests/models/golden/embeddings.json.gz (gzipped JSON): {"generator", "models": {GGUF file name: {"sha256",
    "pooling", "inputs": [text...], "embeddings": [[float...]...], "self_cosine": [float...]}}}: llama-embedding's
    vectors (--pooling mean --embd-normalize 2: the mean of the final hidden states after the output norm,
    L2-normalised; the texts tokenized as llama.cpp does, with BOS when the vocabulary adds one), printed with 7
    decimals. dserve serves these GGUFs with mean pooling too (neither has a pooling_type key). self_cosine is
    llama.cpp's agreement with itself: the cosine between its vectors with flash attention on (the golden) and off.
    It is about 0.9999 on SmolLM2 but 0.998 on Gemma 3 270M, whose final hidden states move that much with the order
    of one softmax's sums; the test asks dserve for cosine >= 0.999 per input, or where llama.cpp itself is further
    apart, for no less than its own agreement minus 0.001.

  and "archs": {ARCH: {"file", "sha256", "inputs", "embeddings", "self_cosine"}}: the same for the tiny Q8_0 GGUF
    of every architecture (scripts/make_tiny_gguf.py; tests/archs serves each and compares), run with the model's
    own context (-c 0) as dserve serve runs it: phi3's LongRoPE factors follow the context (long above the original
    one), which moves every position past the first.

Needs llama.cpp's llama-embedding (bench/peer.sh builds it) and, for the tiny GGUFs, the test venv (numpy, gguf).
Usage:
  ~/.cache/dserve/venv/bin/python scripts/golden/make_embeddings_golden.py [BIN_DIR]
"""
import gzip
import json
import os
import hashlib
import subprocess
import sys
import tempfile

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
OUT = os.path.join(ROOT, "tests/models/golden/embeddings.json.gz")
MODELS = ["SmolLM2-135M-Instruct.Q4_1.gguf", "gemma-3-270m-q4_k_m.gguf"]
BIN = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
    [os.path.join(ROOT, "bench", "peer.sh")], check=True, capture_output=True, text=True).stdout.strip()
SEP = "<#sep#>"
ARCHS = ["llama", "qwen2", "gemma3", "qwen3", "qwen3moe", "mixtral", "phi3", "gemma2", "deepseek2", "deepseek2lite"]
ARCH_INPUT = "The river rises in the hills north of the town and meets the sea at a small harbour."
INPUTS = [
    "hello world",
    "The quick brown fox jumps over the lazy dog.",
    "Embeddings turn text into vectors: texts that mean similar things get vectors that point the same way, "
    "which is what search, clustering and retrieval-augmented generation rely on.",
    "café naïve 你好，世界 12345",
]


def embed(path, inputs, fa="on", ctx="512"):
    cmd = [os.path.join(BIN, "llama-embedding"), "-m", path,
           "-p", SEP.join(inputs), "--embd-separator", SEP, "--pooling", "mean", "--embd-normalize", "2",
           "--embd-output-format", "json", "-t", "2", "-c", ctx, "-fa", fa]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    data = json.loads(out[out.index("{"):])["data"]
    assert len(data) == len(inputs), (path, len(data))
    return [d["embedding"] for d in sorted(data, key=lambda d: d["index"])]


def sha256(path):
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def cosine(a, b):
    dot = sum(x * y for x, y in zip(a, b))
    return dot / (sum(x * x for x in a) ** 0.5 * sum(y * y for y in b) ** 0.5)


def main():
    doc = {"generator": "scripts/golden/make_embeddings_golden.py (llama.cpp llama-embedding --pooling mean "
                        "--embd-normalize 2)", "models": {}}
    for m in MODELS:
        path = os.path.join(ROOT, "models/weights", m)
        on, off = embed(path, INPUTS, "on"), embed(path, INPUTS, "off")
        doc["models"][m] = {"sha256": sha256(path), "pooling": "mean", "inputs": INPUTS, "embeddings": on,
                            "self_cosine": [round(cosine(a, b), 6) for a, b in zip(on, off)]}
    doc["archs"] = {}
    with tempfile.TemporaryDirectory() as tiny:
        subprocess.run([sys.executable, os.path.join(ROOT, "scripts/make_tiny_gguf.py"), "--out", tiny, "--type",
                        "Q8_0"] + [x for a in ARCHS for x in ("--arch", a)], check=True, capture_output=True)
        for a in ARCHS:
            path = os.path.join(tiny, "%s-Q8_0.gguf" % a)
            sha = sha256(path)
            on, off = embed(path, [ARCH_INPUT], "on", "0"), embed(path, [ARCH_INPUT], "off", "0")
            doc["archs"][a] = {"file": os.path.basename(path), "sha256": sha, "inputs": [ARCH_INPUT],
                               "embeddings": on, "self_cosine": [round(cosine(x, y), 6) for x, y in zip(on, off)]}
    with gzip.GzipFile(OUT, "wb", mtime=0) as f:  # mtime 0: the same inputs give the same bytes
        f.write((json.dumps(doc, separators=(",", ":")) + "\n").encode())
    print(f"wrote {OUT} ({os.path.getsize(OUT)} bytes)")


if __name__ == "__main__":
    main()
