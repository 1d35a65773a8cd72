#!/usr/bin/env python3
"""scripts/golden/make_chat_golden.py: writes tests/models/golden/chat_families.json, llama.cpp's rendering of a set of
conversations by each chat template family dserve knows (models/chat.c), for tests/models/test_chat.cc.

The text is llama.cpp's built-in rendering (llama_chat_apply_template, src/llama-chat.cpp), asked of llama-server
started with --no-jinja --chat-template NAME through its POST /apply-template endpoint. llama.cpp's names for the
families: chatml, llama3, gemma, mistral-v3 (dserve's "mistral"), phi3. The model only has to load (SmolLM2's GGUF);
its own template is not used.

It also renders the conversations that ask for a generation prompt with two real models' templates through
llama-server --jinja --chat-template-file (llama.cpp's copies in its sources, models/templates/): Qwen 2.5's, a
ChatML template whose default system prompt sits in an else branch, and Phi-3.5's. The templates themselves are not
committed; the test gives dserve a template of the same shape (test_chat.cc, QWEN_LIKE_TPL).

Usage (llama.cpp's binaries from bench/peer.sh; its sources next to them):
  python3 scripts/golden/make_chat_golden.py [BIN_DIR]
"""
import json
import os
import socket
import subprocess
import sys
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(ROOT, "models/weights/SmolLM2-135M-Instruct.Q4_1.gguf")
OUT = os.path.join(ROOT, "tests/models/golden/chat_families.json")
# the peer's bin dir: bench/peer.sh prints it (building the peer the first time)
BIN = sys.argv[1] if len(sys.argv) > 1 else subprocess.run(
    [os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "bench", "peer.sh")],
    check=True, capture_output=True, text=True).stdout.strip()

FAMILIES = {"chatml": "chatml", "llama3": "llama3", "gemma": "gemma", "mistral": "mistral-v3", "phi3": "phi3"}
TEMPLATES = os.path.join(os.path.dirname(BIN), "src/vendor/llama.cpp/models/templates")
JINJA = {"Qwen-Qwen2.5-7B-Instruct.jinja": "chatml", "microsoft-Phi-3.5-mini-instruct.jinja": "phi3"}


def m(role, content):
    return {"role": role, "content": content}


# (messages, add_generation_prompt): system first or not, several turns, contents with whitespace at either end
# (llama3 and gemma trim it, mistral trims assistant contents), Unicode, an assistant turn last.
CHATS = [
    ([m("user", "Hello!")], True),
    ([m("user", "Hello!")], False),
    ([m("system", "You are terse."), m("user", "What is 2+2?")], True),
    ([m("system", "You are terse."), m("user", "What is 2+2?"), m("assistant", "4"), m("user", "And 3+3?")], True),
    ([m("user", "Hi"), m("assistant", "Hello! How can I help?")], False),
    ([m("user", "  padded \n"), m("assistant", " spaced answer  "), m("user", "\n\nnext")], True),
    ([m("system", "  Answer in French.\n"), m("user", "Good morning"), m("assistant", "Bonjour")], False),
    ([m("user", "Ça va? 日本語 — ünïcödé 🙂"), m("assistant", "Très bien."), m("user", "Line one\nline two")], True),
    ([m("system", "Sys"), m("user", "a"), m("assistant", "b"), m("user", "c"), m("assistant", "d"), m("user", "e")],
     True),
    ([m("user", "")], True),
]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render_all(name, jinja_file=None):
    port = free_port()
    how = ["--jinja", "--chat-template-file", jinja_file] if jinja_file else ["--no-jinja", "--chat-template", name]
    srv = subprocess.Popen([os.path.join(BIN, "llama-server"), "-m", MODEL] + how +
                           ["--host", "127.0.0.1", "--port", str(port), "-t", "1", "-c", "256"],
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        url = f"http://127.0.0.1:{port}"
        for _ in range(200):
            try:
                with urllib.request.urlopen(url + "/health", timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                time.sleep(0.1)
        out = []
        for msgs, gen in CHATS:
            if jinja_file and not gen:
                continue  # (Phi-3.5's template ends such a text with the model's EOS, SmolLM2's here)
            body = json.dumps({"messages": msgs, "add_generation_prompt": gen}).encode()
            req = urllib.request.Request(url + "/apply-template", body, {"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=10) as r:
                out.append({"messages": msgs, "add_generation_prompt": gen, "rendered": json.load(r)["prompt"]})
        return out
    finally:
        srv.terminate()
        srv.wait()


def main():
    res = {"made_by": "python3 scripts/golden/make_chat_golden.py (llama.cpp llama-server --no-jinja --chat-template "
                      "NAME, POST /apply-template)",
           "llama_cpp_names": FAMILIES, "families": {}}
    for fam, name in FAMILIES.items():
        res["families"][fam] = render_all(name)
    res["jinja"] = {f: {"family": fam, "chats": render_all(None, os.path.join(TEMPLATES, f))} for f, fam in JINJA.items()}
    with open(OUT, "w") as f:
        json.dump(res, f, indent=1, ensure_ascii=False)
        f.write("\n")
    print("wrote", OUT)


if __name__ == "__main__":
    main()
