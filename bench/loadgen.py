#!/usr/bin/env python3
"""bench/loadgen.py: streaming load generator for OpenAI-compatible servers (TTFT/TPOT/ITL/E2E, goodput), stdlib only."""

import argparse
import asyncio
import json
import math
import os
import random
import socket
import ssl
import sys
import time
import urllib.parse

# The Python of the venv scripts/setup.sh makes (it has matplotlib, for --plot).
VENV_PYTHON = os.path.join(os.environ.get("DSERVE_CACHE") or "~/.cache/dserve", "venv", "bin", "python")

# Fixed vocabulary for synthetic prompts: short common English words (each about one token for BPE vocabularies).
VOCAB = (
    "the of and to in is you that it he was for on are as with his they at be this have from or one had by word "
    "but not what all were we when your can said there use an each which she do how their if will up other about "
    "out many then them these so some her would make like him into time has look two more write go see number no "
    "way could people my than first water been call who oil its now find long down day did get come made may part "
    "over new sound take only little work know place year live me back give most very after thing our just name "
    "good sentence man think say great where help through much before line right too mean old any same tell boy "
    "follow came want show also around form three small set put end does another well large must big even such "
    "because turn here why ask went men read need land different home us move try kind hand picture again change "
    "off play spell air away animal house point page letter mother answer found study still learn should world"
).split()

from loadgen_stats import (  # noqa: E402,F401 (re-exported: callers use loadgen.summarize etc.)
    CONN_ERROR, STREAM_ERROR, TIMEOUT, LoadgenError, compare_table, describe, first_error, format_report,
    goodput_svg, parse_slo, peak_concurrency, percentile, plot, plot_title, plot_unavailable, request_meets_slo,
    summarize, timeline)


# ----------------------------------------------------------------------------------------------------------------
# Arrivals


def arrival_intervals(rate, burstiness, n, rng):
    """n inter-arrival gaps (s): gamma(shape=burstiness, scale=1/(rate*burstiness)); burstiness 1 is Poisson.

    rate inf -> all zeros (everything at once)."""
    if burstiness <= 0:
        raise LoadgenError("--burstiness must be > 0")
    if rate == float("inf"):
        return [0.0] * n
    if not rate > 0:
        raise LoadgenError("--request-rate must be > 0 (or inf)")
    theta = 1.0 / (rate * burstiness)
    return [rng.gammavariate(burstiness, theta) for _ in range(n)]


# ----------------------------------------------------------------------------------------------------------------
# Datasets: each item is a list of turns; a turn is {"prompt": str, "max_tokens": int}. Single-shot items have one.


def _words(rng, n):
    return " ".join(rng.choice(VOCAB) for _ in range(max(1, n)))


def _len_in_range(rng, base, ratio):
    lo = max(1, int(base * (1.0 - ratio)))
    hi = max(lo, int(base * (1.0 + ratio)))
    return rng.randint(lo, hi)


def build_dataset(args, n, rng):
    """n conversations (list of turn lists) for the chosen dataset; lengths in ~words (about one token each)."""
    ds = args.dataset
    items = []
    if ds == "random":
        for _ in range(n):
            il = _len_in_range(rng, args.input_len, args.range_ratio)
            ol = _len_in_range(rng, args.output_len, args.range_ratio)
            items.append([{"prompt": _words(rng, il), "max_tokens": ol}])
    elif ds == "shared-prefix":
        prefixes = [_words(rng, args.prefix_len) for _ in range(args.num_prefixes)]
        for i in range(n):
            sl = _len_in_range(rng, args.suffix_len, args.range_ratio)
            ol = _len_in_range(rng, args.output_len, args.range_ratio)
            items.append([{"prompt": prefixes[i % len(prefixes)] + " " + _words(rng, sl), "max_tokens": ol}])
    elif ds == "multi-turn":
        for _ in range(n):
            conv = []
            for _t in range(args.turns):
                il = _len_in_range(rng, args.input_len, args.range_ratio)
                ol = _len_in_range(rng, args.output_len, args.range_ratio)
                conv.append({"prompt": _words(rng, il), "max_tokens": ol})
            items.append(conv)
    elif ds == "sharegpt":
        items = load_sharegpt(args.dataset_path, n, rng, args.sharegpt_output_len)
    else:
        raise LoadgenError("unknown dataset %r" % ds)
    return items


def load_sharegpt(path, n, rng, fixed_out):
    """First human turn of n ShareGPT conversations (sampled with rng); max_tokens from the reply (~4/3 per word)."""
    if not path:
        raise LoadgenError("--dataset sharegpt needs --dataset-path FILE")
    try:
        with open(path, "r", encoding="utf-8") as f:
            data = json.load(f)
    except OSError as e:
        raise LoadgenError("cannot read dataset %s: %s" % (path, e.strerror or e)) from None
    except (ValueError, UnicodeDecodeError) as e:
        raise LoadgenError("dataset %s is not valid JSON: %s" % (path, e)) from None
    if not isinstance(data, list):
        raise LoadgenError("dataset %s: expected a JSON list of conversations" % path)
    pool = []
    for item in data:
        conv = item.get("conversations") if isinstance(item, dict) else None
        if not isinstance(conv, list) or len(conv) < 2:
            continue
        a, b = conv[0], conv[1]
        if not (isinstance(a, dict) and isinstance(b, dict)):
            continue
        q, ans = a.get("value"), b.get("value")
        if not (isinstance(q, str) and isinstance(ans, str) and q.strip()):
            continue
        if a.get("from") not in ("human", "user"):
            continue
        out = fixed_out if fixed_out else max(4, min(1024, int(len(ans.split()) * 4 / 3)))
        pool.append([{"prompt": q, "max_tokens": out}])
    if not pool:
        raise LoadgenError("dataset %s has no usable conversations (need human then gpt turns)" % path)
    rng.shuffle(pool)
    return [pool[i % len(pool)] for i in range(n)]


# ----------------------------------------------------------------------------------------------------------------
# HTTP/1.1 over asyncio streams


class Target:
    """Parsed --base-url: scheme, host, port, path prefix."""

    def __init__(self, base_url):
        u = urllib.parse.urlsplit(base_url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise LoadgenError("--base-url must look like http://HOST:PORT (got %r)" % base_url)
        self.scheme = u.scheme
        self.host = u.hostname
        try:
            self.port = u.port or (443 if u.scheme == "https" else 80)
        except ValueError:
            raise LoadgenError("bad port in --base-url %r" % base_url) from None
        self.prefix = u.path.rstrip("/")
        if self.prefix.endswith("/v1"):  # how an openai client writes it (base_url=".../v1"): endpoints carry /v1
            self.prefix = self.prefix[:-3]
        self.hostport = u.netloc

    def path(self, endpoint):
        return self.prefix + endpoint


class HTTPError(Exception):
    """The server answered, but not with what we can use (status kept)."""

    def __init__(self, status, msg):
        super().__init__(msg)
        self.status = status


async def _open(target, timeout):
    ctx = ssl.create_default_context() if target.scheme == "https" else None
    reader, writer = await asyncio.wait_for(
        asyncio.open_connection(target.host, target.port, ssl=ctx, limit=1 << 22), timeout)
    sock = writer.get_extra_info("socket")
    if sock is not None:
        try:
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        except OSError:
            pass
    return reader, writer


async def _read_head(reader):
    line = await reader.readline()
    if not line:
        raise ConnectionError("server closed the connection before answering")
    parts = line.decode("latin-1").split(None, 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/") or not parts[1].isdigit():
        raise ConnectionError("bad HTTP status line %r" % line[:80])
    status = int(parts[1])
    headers = {}
    for _ in range(256):
        h = await reader.readline()
        if h in (b"\r\n", b"\n"):
            return status, headers
        if not h:
            raise ConnectionError("connection closed inside HTTP headers")
        if b":" in h:
            k, v = h.decode("latin-1").split(":", 1)
            headers[k.strip().lower()] = v.strip()
    raise ConnectionError("too many HTTP header lines")


async def _body(reader, headers):
    """Async generator of body bytes: chunked, Content-Length, or until close."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        while True:
            line = await reader.readline()
            if not line:
                raise ConnectionError("connection closed inside a chunked body")
            try:
                size = int(line.split(b";")[0].strip(), 16)
            except ValueError:
                raise ConnectionError("bad chunk size line %r" % line[:40]) from None
            if size == 0:
                for _ in range(64):  # trailers
                    t = await reader.readline()
                    if t in (b"\r\n", b"\n", b""):
                        break
                return
            data = await reader.readexactly(size)
            await reader.readexactly(2)
            yield data
    elif "content-length" in headers:
        try:
            left = int(headers["content-length"])
        except ValueError:
            raise ConnectionError("bad Content-Length") from None
        while left > 0:
            data = await reader.read(min(left, 65536))
            if not data:
                raise ConnectionError("connection closed inside the body")
            left -= len(data)
            yield data
    else:
        while True:
            data = await reader.read(65536)
            if not data:
                return
            yield data


def _request_bytes(target, method, path, headers, body):
    lines = ["%s %s HTTP/1.1" % (method, path), "Host: %s" % target.hostport, "Connection: close",
             "User-Agent: dserve-loadgen"]
    for k, v in headers.items():
        lines.append("%s: %s" % (k, v))
    if body is not None:
        lines.append("Content-Type: application/json")
        lines.append("Content-Length: %d" % len(body))
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + (body or b"")


async def http_get_json(target, path, headers, timeout):
    """GET path -> parsed JSON; raises HTTPError / OSError / ConnectionError / asyncio.TimeoutError."""
    async def go():
        reader, writer = await _open(target, timeout)
        try:
            writer.write(_request_bytes(target, "GET", path, headers, None))
            await writer.drain()
            status, hdrs = await _read_head(reader)
            body = b""
            async for d in _body(reader, hdrs):
                body += d
                if len(body) > (8 << 20):
                    raise HTTPError(status, "response too large")
            if status != 200:
                raise HTTPError(status, "HTTP %d: %s" % (status, body[:200].decode("utf-8", "replace")))
            try:
                return json.loads(body)
            except ValueError:
                raise HTTPError(status, "response is not JSON") from None
        finally:
            writer.close()
    return await asyncio.wait_for(go(), timeout)


def _sse_events(buf):
    """Split complete SSE events off bytearray buf (in place); returns list of data payload strings."""
    out = []
    while True:
        i = buf.find(b"\n\n")
        j = buf.find(b"\r\n\r\n")
        if i < 0 and j < 0:
            return out
        if j >= 0 and (i < 0 or j < i):
            block, cut = bytes(buf[:j]), j + 4
        else:
            block, cut = bytes(buf[:i]), i + 2
        del buf[:cut]
        data = []
        for line in block.decode("utf-8", "replace").splitlines():
            if line.startswith("data:"):
                data.append(line[5:][1:] if line[5:6] == " " else line[5:])
        if data:
            out.append("\n".join(data))


def _chunk_text(obj):
    text = ""
    for c in obj.get("choices") or []:
        if not isinstance(c, dict):
            continue
        t = c.get("text")
        if t is None:
            d = c.get("delta") or {}
            t = d.get("content") or d.get("reasoning_content") or ""
        text += t if isinstance(t, str) else ""
    return text


async def send_request(target, endpoint, headers, payload, t_ref, timeout):
    """POST one streaming request; returns a result dict (see summarize) plus 'text' (generated text)."""
    r = {"success": False, "status": CONN_ERROR, "ttft": None, "tpot": None, "e2e": None, "itl": [],
         "output_tokens": 0, "input_tokens": None, "usage_seen": False, "token_times": [], "error": "",
         "text": ""}
    start = time.perf_counter()
    r["start"] = start - t_ref
    writer = None

    async def go():
        nonlocal writer
        reader, writer = await _open(target, timeout)
        body = json.dumps(payload).encode("utf-8")
        writer.write(_request_bytes(target, "POST", target.path(endpoint), headers, body))
        await writer.drain()
        status, hdrs = await _read_head(reader)
        r["status"] = str(status)
        if status != 200:
            err = b""
            async for d in _body(reader, hdrs):
                err += d
                if len(err) > 4096:
                    break
            r["error"] = "HTTP %d: %s" % (status, err[:300].decode("utf-8", "replace").strip())
            return
        buf = bytearray()
        last = None
        chunks = 0
        pieces = []
        done = False
        async for data in _body(reader, hdrs):
            buf += data
            if len(buf) > (16 << 20):
                raise HTTPError(status, "SSE event too large")
            for ev in _sse_events(buf):
                if ev.strip() == "[DONE]":
                    done = True
                    break
                try:
                    obj = json.loads(ev)
                except ValueError:
                    raise HTTPError(status, "bad SSE data %r" % ev[:80]) from None
                if not isinstance(obj, dict):
                    continue
                if obj.get("error"):
                    e = obj["error"]
                    raise HTTPError(status, "error event: %s" % (e.get("message") if isinstance(e, dict) else e))
                u = obj.get("usage")
                if isinstance(u, dict):
                    if isinstance(u.get("completion_tokens"), int):
                        r["output_tokens"] = u["completion_tokens"]
                        r["usage_seen"] = True
                    if isinstance(u.get("prompt_tokens"), int):
                        r["input_tokens"] = u["prompt_tokens"]
                text = _chunk_text(obj)
                if text:
                    now = time.perf_counter()
                    if last is None:
                        r["ttft"] = now - start
                    else:
                        r["itl"].append(now - last)
                    last = now
                    chunks += 1
                    pieces.append(text)
                    r["token_times"].append(now - t_ref)
            if done:
                break
        end = time.perf_counter()
        if not done and "content-length" not in hdrs and "chunked" not in hdrs.get("transfer-encoding", ""):
            done = True  # close-delimited stream without [DONE]: the end of the body is the end
        if not done:
            raise HTTPError(status, "stream ended without [DONE]")
        if r["ttft"] is None:
            raise HTTPError(status, "no tokens in the stream")
        if not r["usage_seen"]:
            r["output_tokens"] = chunks
        r["e2e"] = end - start
        r["end"] = end - t_ref
        r["text"] = "".join(pieces)
        n = r["output_tokens"]
        r["tpot"] = (r["e2e"] - r["ttft"]) / (n - 1) if n > 1 else None
        r["success"] = True

    try:
        await asyncio.wait_for(go(), timeout)
    except asyncio.TimeoutError:
        r["status"], r["error"] = TIMEOUT, "no complete answer within %.0f s" % timeout
    except asyncio.CancelledError:  # the run's --max-time ran out while this request was in flight
        r["status"], r["error"], r["success"] = TIMEOUT, "cut off by the run's --max-time limit", False
    except HTTPError as e:
        r["status"], r["error"] = STREAM_ERROR, str(e)
    except (OSError, ConnectionError, asyncio.IncompleteReadError, asyncio.LimitOverrunError, ValueError) as e:
        if r["status"] == CONN_ERROR or r["status"] == "200":
            r["status"] = CONN_ERROR if r["status"] == CONN_ERROR else STREAM_ERROR
        r["error"] = "%s: %s" % (type(e).__name__, e)
    finally:
        if writer is not None:
            writer.close()
    if not r["success"]:
        r["end"] = time.perf_counter() - t_ref
        r["token_times"] = []
    return r


# ----------------------------------------------------------------------------------------------------------------
# The run


def make_payload(args, model, messages):
    """Request body for one turn; messages: list of {"role","content"} (rendered as text for /v1/completions)."""
    max_tokens = messages[-1].pop("_max_tokens")
    if args.endpoint.endswith("/chat/completions"):
        body = {"model": model, "messages": [dict(m) for m in messages], "max_tokens": max_tokens}
    else:
        if len(messages) == 1:
            prompt = messages[0]["content"]
        else:
            prompt = "".join("%s: %s\n" % ("User" if m["role"] == "user" else "Assistant", m["content"])
                             for m in messages) + "Assistant:"
        body = {"model": model, "prompt": prompt, "max_tokens": max_tokens}
    body.update({"stream": True, "stream_options": {"include_usage": True}, "temperature": args.temperature})
    if args.ignore_eos:
        body["ignore_eos"] = True
    body.update(args.extra_body)
    return body


class Progress:
    """A one-line progress bar on a terminal (out None: silent): requests done of total, failures, elapsed time."""

    def __init__(self, total, out):
        self.total, self.out, self.t0, self.shown = max(1, total), out, time.perf_counter(), 0.0

    def update(self, results, final=False):
        now = time.perf_counter()
        if self.out is None or (not final and now - self.shown < 0.1 and len(results) < self.total):
            return
        self.shown = now
        done = len(results)
        failed = sum(1 for r in results if r["status"] != "200")
        width = 30
        fill = min(width, width * done // self.total)
        self.out.write("\r[%s%s] %d/%d requests, %d failed, %.1f s " % (
            "#" * fill, "." * (width - fill), done, self.total, failed, now - self.t0))
        if final or done >= self.total:
            self.out.write("\n")
        self.out.flush()


class Runner:
    """One benchmark run: arrivals, concurrency limit, conversations, and the collected results."""

    def __init__(self, args, target, model, headers):
        self.args = args
        self.target = target
        self.model = model
        self.headers = headers
        self.results = []
        self.progress = Progress(args.num_requests, sys.stderr if not args.quiet and sys.stderr.isatty() else None)
        self.sem = asyncio.Semaphore(args.max_concurrency) if args.max_concurrency else None
        self.consec_conn_errors = 0
        self.aborted = ""
        self.t_ref = 0.0
        self.deadline = None

    async def one(self, messages, counted=True):
        payload = make_payload(self.args, self.model, messages)
        if self.sem:
            async with self.sem:
                r = await send_request(self.target, self.args.endpoint, self.headers, payload, self.t_ref,
                                       self.args.timeout)
        else:
            r = await send_request(self.target, self.args.endpoint, self.headers, payload, self.t_ref,
                                   self.args.timeout)
        if counted:
            self.results.append(r)
            self.progress.update(self.results)
            if r["status"] in (CONN_ERROR,):
                self.consec_conn_errors += 1
                if self.args.max_conn_errors and self.consec_conn_errors >= self.args.max_conn_errors:
                    self.aborted = "%d connection errors in a row" % self.consec_conn_errors
            else:
                self.consec_conn_errors = 0
        return r

    def may_send(self):
        if self.aborted:
            return False
        if self.deadline is not None and time.perf_counter() >= self.deadline:
            return False
        return True

    async def conversation(self, turns, budget):
        """Replay turns one after another, each answer appended to the history; budget: turns allowed (list of 1)."""
        history = []
        for t in turns:
            if budget[0] <= 0 or not self.may_send():
                return
            budget[0] -= 1
            history.append({"role": "user", "content": t["prompt"]})
            msgs = [dict(m) for m in history]
            msgs[-1]["_max_tokens"] = t["max_tokens"]
            r = await self.one(msgs)
            if not r["success"]:
                return
            history.append({"role": "assistant", "content": r["text"]})

    async def run(self, items, intervals, num_requests):
        self.t_ref = time.perf_counter()
        if self.args.duration:
            self.deadline = self.t_ref + self.args.duration
        hard = self.t_ref + self.args.max_time if self.args.max_time else None
        if hard is not None:
            self.deadline = hard if self.deadline is None else min(self.deadline, hard)
        budget = [num_requests]
        tasks = []
        target_t = self.t_ref
        for i, conv in enumerate(items):
            if budget[0] <= 0 or not self.may_send():
                break
            tasks.append(asyncio.ensure_future(self.conversation(conv, budget)))
            target_t += intervals[i]
            delay = target_t - time.perf_counter()
            if self.deadline is not None:
                delay = min(delay, self.deadline - time.perf_counter())
            if delay > 0:
                await asyncio.sleep(delay)
            else:
                await asyncio.sleep(0)
        if tasks:
            left = None if hard is None else max(0.0, hard - time.perf_counter())
            _, pending = await asyncio.wait(tasks, timeout=left)
            if pending:
                self.aborted = "the --max-time limit of %g s" % self.args.max_time
                for t in pending:
                    t.cancel()
                await asyncio.gather(*pending, return_exceptions=True)
        return time.perf_counter() - self.t_ref


async def resolve_model(args, target, headers):
    """The first model of GET /v1/models; LoadgenError (the run stops before sending anything) when it fails."""
    url = "%s://%s%s" % (target.scheme, target.hostport, target.path("/v1/models"))
    hint = "is the server up at this address? --model NAME skips this check"
    try:
        data = await http_get_json(target, target.path("/v1/models"), headers, min(args.timeout, 30.0))
    except HTTPError as e:
        raise LoadgenError("GET %s failed (%s); %s" % (url, e, hint)) from None
    except (OSError, ConnectionError, asyncio.TimeoutError, asyncio.IncompleteReadError) as e:
        raise LoadgenError("cannot reach %s (%s: %s); %s" % (url, type(e).__name__, e or "timeout", hint)) from None
    models = data.get("data") if isinstance(data, dict) else None
    if isinstance(models, list) and models and isinstance(models[0], dict) and models[0].get("id"):
        return str(models[0]["id"])
    raise LoadgenError("GET %s listed no models; give --model NAME" % url)


def lengths_of(args):
    """The configured prompt and output lengths, as the report and the plot's title show them."""
    if args.dataset == "sharegpt":
        return "sharegpt lengths" + (", out %d" % args.sharegpt_output_len if args.sharegpt_output_len else "")
    if args.dataset == "shared-prefix":
        inp = "in %d+%d" % (args.prefix_len, args.suffix_len)
    else:
        inp = "in %d" % args.input_len
    r = " ±%g%%" % (args.range_ratio * 100) if args.range_ratio else ""
    turns = " x%d turns" % args.turns if args.dataset == "multi-turn" else ""
    return "%s, out %d%s%s" % (inp, args.output_len, r, turns)


async def run_benchmark(args):
    """Run the whole benchmark; returns the report dict."""
    target = Target(args.base_url)
    headers = {"Accept": "text/event-stream"}
    if args.api_key:
        headers["Authorization"] = "Bearer " + args.api_key
    notes = []
    model = args.model
    if not model:
        model = await resolve_model(args, target, headers)
    rng = random.Random(args.seed)
    turns = args.turns if args.dataset == "multi-turn" else 1
    n_conv = int(math.ceil(args.num_requests / turns))
    items = build_dataset(args, n_conv + args.warmup, rng)
    warm, items = items[:args.warmup], items[args.warmup:]
    intervals = arrival_intervals(args.request_rate, args.burstiness, len(items), random.Random(args.seed + 1))
    runner = Runner(args, target, model, headers)
    warm_fail = 0
    for conv in warm:  # warm-up: one after another, not counted
        msgs = [{"role": "user", "content": conv[0]["prompt"], "_max_tokens": conv[0]["max_tokens"]}]
        r = await runner.one(msgs, counted=False)
        if not r["success"]:
            warm_fail += 1
    if warm_fail:
        notes.append("%d of %d warm-up requests failed" % (warm_fail, len(warm)))
    duration = await runner.run(items, intervals, args.num_requests)
    if len(runner.results) < args.num_requests:
        runner.progress.update(runner.results, final=True)
    sent = len(runner.results)
    if runner.aborted:
        notes.append("stopped after %s; %d requests not sent" % (runner.aborted, args.num_requests - sent))
    extra = {
        "base_url": args.base_url, "endpoint": args.endpoint, "model": model, "dataset": args.dataset,
        "lengths": lengths_of(args),
        "request_rate": "inf" if args.request_rate == float("inf") else args.request_rate,
        "burstiness": args.burstiness, "max_concurrency": args.max_concurrency,
        "num_requests": args.num_requests, "warmup": args.warmup, "aborted": runner.aborted or None,
        "notes": notes,
    }
    rep = summarize(runner.results, duration, parse_slo(args.slo), extra)
    rep["requests"] = [
        {k: r.get(k) for k in ("status", "start", "end", "ttft", "tpot", "e2e", "input_tokens", "output_tokens",
                               "error")} | ({"itl": r["itl"]} if args.save_itl else {})
        for r in runner.results]
    return rep


# ----------------------------------------------------------------------------------------------------------------
# CLI


def _rate(text):
    if text.lower() in ("inf", "infinity"):
        return float("inf")
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text) from None
    if not v > 0:
        raise argparse.ArgumentTypeError("must be > 0 (or inf)")
    return v


def _pos_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text) from None
    if v < 1:
        raise argparse.ArgumentTypeError("must be >= 1")
    return v


def _nonneg_int(text):
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not an integer: %r" % text) from None
    if v < 0:
        raise argparse.ArgumentTypeError("must be >= 0")
    return v


def _pos_float(text):
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError("not a number: %r" % text) from None
    if not (v > 0 and math.isfinite(v)):
        raise argparse.ArgumentTypeError("must be a positive number")
    return v


def parse_args(argv):
    p = argparse.ArgumentParser(description="Streaming load generator for OpenAI-compatible servers.",
                                formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--base-url", default="http://127.0.0.1:8080",  # dserve serve's and the configs' router port
                   help="the server, with or without /v1 (http://HOST:PORT or http://HOST:PORT/v1)")
    p.add_argument("--endpoint", default="/v1/completions", choices=["/v1/completions", "/v1/chat/completions"])
    p.add_argument("--model", default="", help="model name (default: first of GET /v1/models)")
    p.add_argument("--api-key", default=None, help="bearer key; absent: $OPENAI_API_KEY")
    p.add_argument("--request-rate", type=_rate, default=float("inf"), help="requests/s (inf: all at once)")
    p.add_argument("--burstiness", type=_pos_float, default=1.0, help="gamma shape; 1 = Poisson")
    p.add_argument("--max-concurrency", type=_nonneg_int, default=0, help="0 = unlimited")
    p.add_argument("--num-requests", type=_pos_int, default=100)
    p.add_argument("--duration", type=_pos_float, default=None, help="stop sending after this many seconds")
    p.add_argument("--warmup", type=_nonneg_int, default=0, help="requests sent first, not counted")
    p.add_argument("--timeout", type=_pos_float, default=600.0, help="per-request limit (s)")
    p.add_argument("--max-time", type=_pos_float, default=None,
                   help="hard limit on the whole run (s): requests still in flight then count as timeouts")
    p.add_argument("--max-conn-errors", type=_nonneg_int, default=10,
                   help="stop sending after this many connection errors in a row (0 = never)")
    p.add_argument("--dataset", default="random", choices=["random", "shared-prefix", "multi-turn", "sharegpt"])
    p.add_argument("--dataset-path", default="")
    p.add_argument("--input-len", type=_pos_int, default=128, help="~words per prompt")
    p.add_argument("--output-len", type=_pos_int, default=64, help="max_tokens")
    p.add_argument("--range-ratio", type=float, default=0.0, help="lengths uniform in [L*(1-r), L*(1+r)]")
    p.add_argument("--prefix-len", type=_pos_int, default=256)
    p.add_argument("--suffix-len", type=_pos_int, default=32)
    p.add_argument("--num-prefixes", type=_pos_int, default=4)
    p.add_argument("--turns", type=_pos_int, default=3)
    p.add_argument("--sharegpt-output-len", type=_pos_int, default=None)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--ignore-eos", action="store_true", help="send ignore_eos: true (vLLM extension)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--extra-body", type=_json_object, default={},
                   help="a JSON object merged into every request body, e.g. a response_format")
    p.add_argument("--slo", default="", help="ttft:MS,tpot:MS,e2e:MS (any subset) for goodput")
    p.add_argument("--json-out", default="")
    p.add_argument("--save-itl", action="store_true", help="keep every ITL per request in the JSON")
    p.add_argument("--plot", default="", help="PNG file: latency CDFs, TTFT/TPOT and throughput over time "
                   "(needs matplotlib: run with %s, the venv scripts/setup.sh makes)" % VENV_PYTHON)
    p.add_argument("--quiet", action="store_true", help="no report on stdout")
    helps = {"num_requests": "requests counted (multi-turn: turns)", "dataset_path": "file for --dataset sharegpt",
             "prefix_len": "shared-prefix: ~words of each prefix", "suffix_len": "shared-prefix: ~words after it",
             "num_prefixes": "shared-prefix: distinct prefixes", "turns": "multi-turn: turns per conversation",
             "sharegpt_output_len": "sharegpt: max_tokens (default: the answer's length)",
             "temperature": "sampling temperature", "seed": "seed of prompts and arrivals",
             "dataset": "prompt source", "endpoint": "API route driven"}
    for a in p._actions:  # every option says its default in --help (ArgumentDefaultsHelpFormatter needs a help)
        if a.help is None:
            a.help = helps.get(a.dest, a.dest.replace("_", " "))
    args = p.parse_args(argv)
    if args.api_key is None:
        args.api_key = os.environ.get("OPENAI_API_KEY", "")
    if not 0.0 <= args.range_ratio < 1.0:
        p.error("--range-ratio must be in [0, 1)")
    return args


def _json_object(text):
    try:
        v = json.loads(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError("not JSON: %s" % e)
    if not isinstance(v, dict):
        raise argparse.ArgumentTypeError("want a JSON object")
    return v


def main(argv=None):
    """Entry point; returns the exit status (0: at least one request succeeded, 1: none did or an error)."""
    try:
        args = parse_args(argv)
    except SystemExit as e:
        return int(e.code or 0)
    if args.plot:  # before the run: a long benchmark must not end without the plot it was started for
        why = plot_unavailable()
        if why:
            print("loadgen: error: --plot needs matplotlib, which %s cannot import: %s. scripts/setup.sh makes a "
                  "venv with it: run %s bench/loadgen.py ... (or leave out --plot)" % (sys.executable, why,
                                                                                     VENV_PYTHON), file=sys.stderr)
            return 2
    try:
        parse_slo(args.slo)
        rep = asyncio.run(run_benchmark(args))
    except LoadgenError as e:
        print("loadgen: error: %s" % e, file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print("loadgen: interrupted", file=sys.stderr)
        return 130
    if not args.quiet:
        print(format_report(rep))
    if args.json_out:
        try:
            with open(args.json_out, "w", encoding="utf-8") as f:
                json.dump(rep, f, indent=1)
        except OSError as e:
            print("loadgen: error: cannot write %s: %s" % (args.json_out, e.strerror or e), file=sys.stderr)
            return 1
    if args.plot:
        why = plot(rep, args.plot)
        print("plot skipped: %s" % why if why else "plot written to %s" % args.plot, file=sys.stderr)
    if rep["successful_requests"] == 0:
        print("loadgen: error: all %d requests failed (%s)" % (rep["num_requests_sent"], first_error(rep) or
                                                              "none sent"), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
