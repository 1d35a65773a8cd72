#!/usr/bin/env python3
# scripts/golden/make_llama_golden.py: records llama.cpp's greedy tokens and last-prompt logits for the forward-pass golden test.
# Usage: /work/.cache/refvenv/bin/python scripts/golden/make_llama_golden.py [MODEL.gguf] > tests/models/golden/llama_greedy.json
import json
import os
import sys

import numpy as np
from llama_cpp import Llama

root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
model = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")
N_GEN = 32
N_TOP = 64      # the highest logits, by id and value
STRIDE = 768    # plus every STRIDE-th id, so the tail of the distribution is checked too

SYSTEM = "You are a helpful AI assistant named SmolLM, trained by Hugging Face"


def chatml(user):
    return (f"<|im_start|>system\n{SYSTEM}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n"
            f"<|im_start|>assistant\n")


PROMPTS = [
    ("plain", "The capital of France is"),
    ("plain", "Once upon a time, in a small village by the sea,"),
    ("plain", "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n"),
    ("plain", "The three primary colors are red, blue and"),
    ("plain", "Water boils at 100 degrees Celsius at sea level. At the top of a mountain"),
    ("chat", "What is the capital of France?"),
    ("chat", "Write a haiku about autumn leaves."),
    ("chat", "Explain in one sentence what a neural network is."),
    ("chat", "List three fruits that are yellow."),
    ("chat", "How many legs does a spider have?"),
]

llm = Llama(model_path=model, n_ctx=2048, n_threads=2, logits_all=False, verbose=False)
cases = []


def last_logits():
    # logits_all=False: llama.cpp keeps only the last evaluated position's logits
    ptr = llm._ctx.get_logits()
    return np.array(np.ctypeslib.as_array(ptr, shape=(llm.n_vocab(),)), dtype=np.float32)


for kind, text in PROMPTS:
    full = chatml(text) if kind == "chat" else text
    ids = llm.tokenize(full.encode("utf-8"), add_bos=False, special=True)
    llm.reset()
    llm.eval(ids)
    first = last_logits()
    gen, margins = [], []
    logits = first
    for _ in range(N_GEN):
        order = np.argsort(-logits, kind="stable")
        tok = int(order[0])
        gen.append(tok)
        margins.append(round(float(logits[order[0]] - logits[order[1]]), 4))
        llm.eval([tok])
        logits = last_logits()
    top = np.argsort(-first, kind="stable")[:N_TOP]
    strided = list(range(0, len(first), STRIDE))
    cases.append({
        "kind": kind,
        "text": full,
        "prompt": [int(t) for t in ids],
        "greedy": gen,
        "greedy_margins": margins,   # top1 - top2 logit at each greedy step (near-ties show up here)
        "logits_top_ids": [int(i) for i in top],
        "logits_top": [round(float(first[i]), 4) for i in top],
        "logits_strided_ids": strided,
        "logits_strided": [round(float(first[i]), 4) for i in strided],
        "logits_min": round(float(first.min()), 4),
        "logits_max": round(float(first.max()), 4),
    })
    print(f"{kind}: {len(ids)} prompt tokens, margins min {min(margins):.3f}", file=sys.stderr)

# one case per line, so a diff shows which prompt changed
head = {"model": os.path.basename(model), "reference": "llama-cpp-python (llama.cpp), greedy, n_threads=2",
        "n_gen": N_GEN}
out = json.dumps(head)[:-1] + ', "cases": [\n'
out += ",\n".join(json.dumps(c, ensure_ascii=True) for c in cases)
sys.stdout.write(out + "\n]}\n")
