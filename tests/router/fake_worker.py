#!/usr/bin/env python3
"""tests/router/fake_worker.py: a fake `both` worker speaking the dserve control protocol, for the router's tests.

Usage: fake_worker.py [PORT [N_CTX [DELAY_S]]]. Listens on 127.0.0.1 (port 0 = any; the chosen port is printed as
"PORT <n>" on stdout), answers the handshake (a random challenge nonce; a hello without the proof of SECRET, the
shared secret the router tests put in their configs, is closed without a hello_ok, as a real worker does),
`stats`, `cancel` and `generate`. A generation is a deterministic list of words (see `words_for`) derived from the
prompt ids and the seed (a random seed when none is given), cut at max_tokens (finish "length"), at the first stop
string (finish "stop", the stop string left out) or after 8 words (finish "stop"). One word per `token` message.
With FAKE_WORKER_RECORD=PATH in the environment, every `generate` message received is appended to PATH as one JSON
line, so a test can see what the router sent (its sampling defaults, for one).
With FAKE_WORKER_STEP_MS=N a connection's generations advance together, as an engine's continuous batch would: every
N ms one token each, sent as one `token_batch` message (docs/protocol.md), or one `token` message each with
FAKE_WORKER_BATCH=0 (a worker before protocol version 3). A prompt holding the bytes FLOOD streams max_tokens pieces
of FAKE_WORKER_FLOOD_BYTES (4096) bytes each: a stream large enough to fill a client's socket that stops reading.
"""
import hashlib
import json
import os
import random
import socket
import sys
import threading
import time

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "e2e"))
import ctl_wire  # noqa: E402  (the control protocol: handshake and sealed frames)

WORDS = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot", "golf", "hotel", "india", "juliet", "kilo",
         "lima", "mike", "november", "oscar", "papa", "quebec", "romeo", "sierra", "tango"]
NATURAL_LEN = int(os.environ.get("FAKE_WORKER_LEN", "8"))  # words a generation makes before any cut
SECRET = "dc3c80b87648d296023e7386aece451e900f9b6bd254473a88a2fe5e7db030af"  # = tests/test_secret.h


def words_for(prompt_ids, seed):
    """The words a generation produces before any cut: a function of the prompt and the seed only."""
    h = hashlib.sha256((",".join(map(str, prompt_ids)) + "|" + str(seed)).encode()).digest()
    rng = random.Random(h)
    return [rng.choice(WORDS) + " " for _ in range(NATURAL_LEN)]


def expected(prompt_ids, seed, max_tokens=None, stop=()):
    """(text, finish_reason, completion_tokens) the fake worker produces for these inputs."""
    words = words_for(prompt_ids, seed)
    n = NATURAL_LEN if max_tokens is None else min(max_tokens, NATURAL_LEN)
    finish = "length" if max_tokens is not None and max_tokens <= NATURAL_LEN else "stop"
    out, text = [], ""
    for w in words[:n]:
        cut = None
        cand = text + w
        for s in stop:
            i = cand.find(s)
            if i >= 0 and (cut is None or i < cut):
                cut = i
        if cut is not None:
            out.append(cand[len(text):cut])
            return "".join(out), "stop", len(out)
        out.append(w)
        text = cand
    return "".join(out), finish, len(out)


def tool_call_text(m):
    """The text of a tool call turn, or None: with a tool_calls grammar, a call of its first tool as the grammar
    writes it; with a byte-level prompt holding CALL_ME (tool_choice auto), a sentence and a Hermes-style call."""
    g = m.get("grammar") or {}
    if g.get("type") == "tool_calls":
        tools = json.loads(g["tools"])  # JSON text in a string (docs/protocol.md: its numbers stay exact)
        one = g["open"] + json.dumps({"name": tools[0]["name"], "arguments": {"city": "Paris"}}) + g["close"]
        return one + g["sep"] + one if g.get("parallel") else one
    if b"CALL_ME" in bytes(t for t in m["prompt"] if 0 <= t < 256):
        return 'Let me look.\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n</tool_call>'
    return None


def serve_conn(sock, n_ctx, delay):
    cancelled = set()
    # As a real worker: the proof of SECRET for the member the router dialled (the fake answers to any name) at this
    # address, then sealed frames (ctl_wire.py).
    c, _ = ctl_wire.accept(sock, SECRET, None, {"role": "both", "n_ctx": n_ctx, "block_size": 16})
    if c is None:
        sock.close()
        return

    send_lock = threading.Lock()
    step_ms = float(os.environ.get("FAKE_WORKER_STEP_MS", "0"))
    batch = os.environ.get("FAKE_WORKER_BATCH", "1") != "0"
    active = []  # step mode: [id, pieces, next index, finish, n]
    active_lock = threading.Lock()

    def send(msg):
        with send_lock:
            c.send(msg)

    def stepper():
        while True:
            time.sleep(step_ms / 1000.0)
            with active_lock:
                now = [a for a in active if a[0] not in cancelled]
                active[:] = now
            items, ended = [], []
            for a in now:
                if a[2] < len(a[1]):
                    items.append({"id": a[0], "text": a[1][a[2]], "tokens": [1]})
                    a[2] += 1
                if a[2] >= len(a[1]):
                    ended.append(a)
            try:
                if batch and items:
                    send({"op": "token_batch", "items": items})
                elif items:
                    for it in items:
                        send(dict(it, op="token"))
                for a in ended:
                    send({"op": "done", "id": a[0], "finish_reason": a[3], "prompt_tokens": 1,
                          "completion_tokens": a[4], "cached_tokens": 0, "kv_bytes": 0, "kv_ms": 0})
            except (OSError, ValueError):
                return
            if ended:
                with active_lock:
                    active[:] = [a for a in active if a not in ended]

    if step_ms > 0:
        threading.Thread(target=stepper, daemon=True).start()

    def generate(m):
        seed = m["sampling"].get("seed")
        if seed is None:
            seed = random.getrandbits(48)
        text, finish, n = expected(m["prompt"], seed, m["max_tokens"], m.get("stop", []))
        pieces = []
        words = words_for(m["prompt"], seed)
        acc = ""
        for w in words:  # split text back into the per-token deltas
            if len(acc) >= len(text):
                break
            piece = text[len(acc):len(acc) + len(w)]
            pieces.append(piece)
            acc += piece
        call = tool_call_text(m)
        if call is not None:  # a tool call, in 3-byte pieces so the router's hold-back sees the tags split
            text, finish = call, "stop"
            pieces = [text[i:i + 3] for i in range(0, len(text), 3)]
            n = len(pieces)
        if b"FLOOD" in bytes(t for t in m["prompt"] if 0 <= t < 256):
            size = int(os.environ.get("FAKE_WORKER_FLOOD_BYTES", "4096"))
            n, finish = m["max_tokens"], "length"
            pieces = ["x" * size] * n
        if step_ms > 0:
            with active_lock:
                active.append([m["id"], pieces, 0, finish, n])
            return
        for p in pieces:
            if m["id"] in cancelled:
                return
            time.sleep(delay)
            send({"op": "token", "id": m["id"], "text": p, "tokens": [1]})
        send({"op": "done", "id": m["id"], "finish_reason": finish, "prompt_tokens": len(m["prompt"]),
                "completion_tokens": n, "cached_tokens": 0, "kv_bytes": 0, "kv_ms": 0})

    try:
        while True:
            try:
                m = c.recv(None)
            except (ConnectionError, ctl_wire.InvalidTag):
                break
            op = m.get("op")
            if op == "stats":
                send({"op": "stats_ok", "running": 0, "waiting": 0, "free_blocks": 100,
                        "total_blocks": 100, "prefix_hits": 0, "prefix_queries": 0})
            elif op == "generate":
                record = os.environ.get("FAKE_WORKER_RECORD")
                if record:
                    with open(record, "a") as f:  # one short append per message
                        f.write(json.dumps(m) + "\n")
                threading.Thread(target=generate, args=(m,), daemon=True).start()
            elif op == "cancel":
                cancelled.add(m["id"])
    except (OSError, ValueError):
        pass
    sock.close()


def main():
    port = int(sys.argv[1]) if len(sys.argv) > 1 else 0
    n_ctx = int(sys.argv[2]) if len(sys.argv) > 2 else 512
    delay = float(sys.argv[3]) if len(sys.argv) > 3 else 0.002  # seconds before each token
    ls = socket.socket()
    ls.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    ls.bind(("127.0.0.1", port))
    ls.listen(16)
    print("PORT", ls.getsockname()[1], flush=True)
    while True:
        c, _ = ls.accept()
        threading.Thread(target=serve_conn, args=(c, n_ctx, delay), daemon=True).start()


if __name__ == "__main__":
    main()
