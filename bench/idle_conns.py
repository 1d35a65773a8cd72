#!/usr/bin/env python3
"""bench/idle_conns.py: what idle connections cost the router's other clients.

Usage: idle_conns.py DSERVE_BINARY [--idle N] [--requests N] [--slow-body]. Starts tests/router/fake_worker.py and
`dserve router` on loopback (tiny GGUF and config in a temp dir), times N small non-stream completions (one fresh
connection each) with nothing else open, then again while N idle connections (default 2000, nothing ever sent on them)
are held open, and prints p50/p99 of both and the p99 ratio. Standard library only; every wait is bounded (about a
minute in all).
--slow-body (issue 39, item 4): the N connections come from 17 loopback addresses, each sends a complete request head
and then its body a byte every 5 s; the router keeps its default caps (4096, 256 per address) and body_timeout_s (30),
and the script also reports how many were answered 408 and how long after they started.
"""
import argparse
import http.client
import json
import os
import re
import resource
import shutil
import socket
import struct
import subprocess
import sys
import tempfile
import time

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, os.path.join(HERE, "..", "tests", "router"))
import fake_worker  # noqa: E402


def byte_char(b):
    keep = lambda x: 33 <= x <= 126 or 161 <= x <= 172 or 174 <= x <= 255  # noqa: E731
    return chr(b) if keep(b) else chr(256 + sum(1 for x in range(b) if not keep(x)))


def tiny_gguf(path):  # byte-level vocabulary, context 512 (as tests/router/test_openai.py)
    def s(x):
        x = x.encode()
        return struct.pack("<Q", len(x)) + x
    toks = [byte_char(b) for b in range(256)] + ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
    kvs = [s("general.architecture") + struct.pack("<I", 8) + s("llama"),
           s("general.name") + struct.pack("<I", 8) + s("tiny"),
           s("llama.context_length") + struct.pack("<II", 4, 512),
           s("tokenizer.ggml.model") + struct.pack("<I", 8) + s("gpt2"),
           s("tokenizer.ggml.pre") + struct.pack("<I", 8) + s("smollm"),
           s("tokenizer.ggml.tokens") + struct.pack("<IIQ", 9, 8, len(toks)) + b"".join(s(t) for t in toks),
           s("tokenizer.ggml.token_type") + struct.pack("<IIQ", 9, 5, len(toks)) +
           b"".join(struct.pack("<i", 1 if i < 256 else 3) for i in range(len(toks))),
           s("tokenizer.ggml.merges") + struct.pack("<IIQ", 9, 8, 0),
           s("tokenizer.ggml.eos_token_id") + struct.pack("<II", 4, 256)]
    b = b"GGUF" + struct.pack("<IQQ", 3, 0, len(kvs)) + b"".join(kvs)
    with open(path, "wb") as f:
        f.write(b + b"\0" * ((32 - len(b) % 32) % 32))


def timed_requests(port, n, completion=True):
    body = json.dumps({"model": "tiny", "prompt": "hello", "max_tokens": 2, "seed": 1})
    lat = []
    for _ in range(n):
        t0 = time.perf_counter()
        c = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        if completion:
            c.request("POST", "/v1/completions", body=body, headers={"Content-Type": "application/json"})
        else:
            c.request("GET", "/v1/models")
        r = c.getresponse()
        r.read()
        c.close()
        if r.status != 200:
            raise RuntimeError("request failed: %d" % r.status)
        lat.append(time.perf_counter() - t0)
    lat.sort()
    return lat[len(lat) // 2], lat[min(len(lat) - 1, int(len(lat) * 0.99))]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dserve")
    ap.add_argument("--idle", type=int, default=2000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--slow-body", action="store_true")
    a = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = a.idle + 256
    if soft != resource.RLIM_INFINITY and soft < want:
        resource.setrlimit(resource.RLIMIT_NOFILE, (want if hard == resource.RLIM_INFINITY else min(hard, want), hard))
    tmp = tempfile.mkdtemp(prefix="dserve-idle-")
    procs = []
    try:
        tiny_gguf(os.path.join(tmp, "tiny.gguf"))
        w = subprocess.Popen([sys.executable, os.path.join(HERE, "..", "tests", "router", "fake_worker.py"), "0", "512",
                              "0"], stdout=subprocess.PIPE, text=True)
        procs.append(w)
        wport = int(w.stdout.readline().split()[1])
        cfg = {"model": "tiny.gguf", "model_name": "tiny", "secret": fake_worker.SECRET,
               "nodes": {"local": {"host": "127.0.0.1"}},
               "router": {"node": "local", "host": "127.0.0.1", "port": 0} if a.slow_body else
                         {"node": "local", "host": "127.0.0.1", "port": 0, "max_connections": a.idle + 512,
                          "max_connections_per_client": a.idle + 512, "header_timeout_s": 3600,
                          "conn_timeout_s": 3600},
               "workers": [{"name": "w0", "node": "local", "role": "both", "host": "127.0.0.1", "port": wport}]}
        with open(os.path.join(tmp, "cluster.json"), "w") as f:
            json.dump(cfg, f)
        log = open(os.path.join(tmp, "router.log"), "w+")
        procs.append(subprocess.Popen([a.dserve, "router", "--config", os.path.join(tmp, "cluster.json")], stderr=log))
        port, deadline = None, time.time() + 20
        while port is None and time.time() < deadline:
            log.seek(0)
            m = re.search(r"on http://127\.0\.0\.1:(\d+)", log.read())
            port = int(m.group(1)) if m else time.sleep(0.05)
        if port is None:
            raise RuntimeError("the router did not start")
        while time.time() < deadline:
            try:
                c = http.client.HTTPConnection("127.0.0.1", port, timeout=2)
                c.request("GET", "/health")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            time.sleep(0.05)
        timed_requests(port, 20)  # warm-up
        p50a, p99a = timed_requests(port, a.requests)
        m50a, m99a = timed_requests(port, a.requests, False)
        idle = []
        t_open = time.time()
        for i in range(a.idle):
            src = ("127.0.0.%d" % (2 + i % 17), 0) if a.slow_body else None
            idle.append(socket.create_connection(("127.0.0.1", port), timeout=5, source_address=src))
            if a.slow_body:
                idle[-1].sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 100\r\n\r\n{")
        time.sleep(1.0)  # the router has taken them all (one thread each)
        p50b, p99b = timed_requests(port, a.requests)
        m50b, m99b = timed_requests(port, a.requests, False)
        if a.slow_body:  # a byte each 5 s until the router answers; count the 408s
            got, t_last, last_trickle = {}, None, 0
            while len(got) < len(idle) and time.time() - t_open < 120:
                if time.time() - last_trickle >= 5:
                    for s in idle:
                        if s not in got:
                            try:
                                s.send(b" ")
                            except OSError:
                                pass
                    last_trickle = time.time()
                for s in idle:
                    if s in got:
                        continue
                    s.setblocking(False)
                    try:
                        b = s.recv(64)
                        got[s] = b
                        t_last = time.time()
                    except BlockingIOError:
                        pass
                    except OSError:
                        got[s] = b""
                time.sleep(0.2)
            n408 = sum(1 for b in got.values() if b.startswith(b"HTTP/1.1 408"))
            print("slow bodies: %d of %d answered 408, the last %.1f s after they opened; %d still open" %
                  (n408, len(idle), (t_last or time.time()) - t_open, len(idle) - len(got)))
            got = None
        dropped = 0  # idle connections the router answered or closed (none expected)
        for s in idle:
            s.setblocking(False)
            try:
                s.recv(1)
                dropped += 1
            except BlockingIOError:
                pass
            except OSError:
                dropped += 1
            s.close()
        print("%d requests each (fresh connection per request), %d idle connections, %d of them dropped" %
              (a.requests, a.idle, dropped))
        for name, u, l in (("POST /v1/completions", (p50a, p99a), (p50b, p99b)),
                           ("GET /v1/models", (m50a, m99a), (m50b, m99b))):
            print("%-21s unloaded p50 %6.2f ms p99 %6.2f ms | idle p50 %6.2f ms p99 %6.2f ms | p99 ratio %.2f" %
                  (name, u[0] * 1e3, u[1] * 1e3, l[0] * 1e3, l[1] * 1e3, l[1] / u[1]))
    finally:
        for p in procs:
            p.terminate()
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
