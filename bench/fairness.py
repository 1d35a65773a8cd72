#!/usr/bin/env python3
"""bench/fairness.py: a small chat's time to first token beside one request of many choices, against the same chat
alone, on one `dserve serve` (issue 39 item 5: fair admission; target: at most 3x alone).

    python3 bench/fairness.py [--dserve build/dserve] [--model GGUF] [--prompts 8] [--n 8] [--max-tokens 200]
                              [--rounds 3] [--threads 2] [--parallel 64]

Each round: the chat alone (8 tokens out), then a /v1/completions request of PROMPTS prompts x N choices
(MAX_TOKENS tokens each, ignore_eos) and, 2 s into it, the same chat. Prints each TTFT and the median ratio.
Standard library only."""
import argparse
import http.client
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
def chat(k):
    """A chat no other request shares a prefix with beyond the template (k: a fresh one each time)."""
    return {"messages": [{"role": "user", "content": "Say hello to visitor number %d." % k}], "max_tokens": 8,
            "stream": True, "temperature": 0}


def post(port, path, body, stream):
    """(seconds to the first streamed token, not the role chunk, or to the answer, status)."""
    c = http.client.HTTPConnection("127.0.0.1", port, timeout=900)
    t0 = time.perf_counter()
    c.request("POST", path, json.dumps(body), {"Content-Type": "application/json"})
    r = c.getresponse()
    first = None
    if stream and r.status == 200:
        while True:
            line = r.readline()
            if not line:
                break
            if first is None and line.startswith(b"data: {"):
                ch = json.loads(line[6:]).get("choices") or [{}]
                if ch[0].get("delta", {}).get("content") or ch[0].get("text"):
                    first = time.perf_counter() - t0
    else:
        r.read()
        first = time.perf_counter() - t0
    c.close()
    return first, r.status


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dserve", default=os.path.join(ROOT, "build", "dserve"))
    ap.add_argument("--model", default=os.path.join(ROOT, "models", "weights", "SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--prompts", type=int, default=8)
    ap.add_argument("--n", type=int, default=8)
    ap.add_argument("--max-tokens", type=int, default=200)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--parallel", type=int, default=64)
    a = ap.parse_args()
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    log = tempfile.NamedTemporaryFile(prefix="dserve-fairness-", suffix=".log", delete=False)
    # -kvu: -np caps the sequences decoded together; every request may use the model's whole context (without it,
    # -np splits the context among the slots, as llama-server's does)
    p = subprocess.Popen([a.dserve, "serve", a.model, "--port", str(port), "-t", str(a.threads), "-np",
                          str(a.parallel), "-kvu"], stdout=log, stderr=subprocess.STDOUT)
    try:
        end = time.time() + 120
        while True:
            try:
                if post(port, "/v1/chat/completions", dict(chat(0), stream=False), False)[1] == 200:
                    break
            except OSError:
                pass
            if time.time() > end or p.poll() is not None:
                sys.exit("fairness.py: the server did not come up; log %s" % log.name)
            time.sleep(0.2)
        big = {"prompt": ["Write a long story about the sea, number %d." % i for i in range(a.prompts)], "n": a.n,
               "max_tokens": a.max_tokens, "ignore_eos": True, "temperature": 0.8}
        print("dserve fairness: %s, %d prompts x n %d = %d choices of %d tokens beside a chat of 8 tokens, %d threads, "
              "-np %d" % (os.path.basename(a.model), a.prompts, a.n, a.prompts * a.n, a.max_tokens, a.threads,
                          a.parallel))
        ratios = []
        for i in range(a.rounds):
            alone, st = post(port, "/v1/chat/completions", chat(2 * i + 1), True)
            out = {}
            t = threading.Thread(target=lambda: out.update(r=post(port, "/v1/completions", big, False)))
            t.start()
            time.sleep(2.0)
            beside, st2 = post(port, "/v1/chat/completions", chat(2 * i + 2), True)
            t.join()
            ratios.append(beside / alone)
            print("round %d: chat TTFT alone %.0f ms, beside %.0f ms (%.2fx); big request %s in %.1f s" % (
                i + 1, alone * 1e3, beside * 1e3, beside / alone, out["r"][1], out["r"][0]))
            sys.stdout.flush()
        print("median ratio %.2fx (target <= 3x)" % statistics.median(ratios))
    finally:
        p.terminate()
        p.wait(30)


if __name__ == "__main__":
    main()
