#!/usr/bin/env python3
"""bench/spec_run.py: one side of bench/spec_bench.sh: every prompt of a workload kind at N streams (temperature 0)
against one server, with the texts, token counts, completion tok/s and the server's speculation counters, as JSON."""

import argparse
import concurrent.futures
import json
import re
import sys
import time
import urllib.request

import openai

SPEC_COUNTERS = ("spec_decode_num_drafts_total", "spec_decode_num_draft_tokens_total",
                 "spec_decode_num_accepted_tokens_total")


def counters(base_url):
    """The server's speculation counters from /metrics ({} where it has none: a build without speculation)."""
    try:
        text = urllib.request.urlopen(base_url + "/metrics", timeout=30).read().decode()
    except OSError:
        return {}
    out = {}
    for name in SPEC_COUNTERS:
        m = re.search(r"^dserve:%s(?:\{[^}]*\})?\s+([0-9.eE+]+)$" % name, text, re.M)
        if m:
            out[name] = float(m.group(1))
    return out


def one(client, model, item):
    t0 = time.monotonic()
    r = client.chat.completions.create(model=model, messages=item["messages"], max_tokens=item["max_tokens"],
                                       temperature=0, seed=1)
    return {"text": r.choices[0].message.content, "finish_reason": r.choices[0].finish_reason,
            "completion_tokens": r.usage.completion_tokens, "seconds": time.monotonic() - t0}


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--base-url", required=True, help="http://HOST:PORT")
    p.add_argument("--prompts", required=True, help="the workload file (bench/spec_prompts.json)")
    p.add_argument("--streams", type=int, required=True, help="requests in flight")
    p.add_argument("--kinds", default="extractive,chat,replay")
    p.add_argument("--out", required=True)
    a = p.parse_args()
    if a.streams < 1:
        sys.exit("spec_run: --streams must be >= 1")
    prompts = json.load(open(a.prompts, encoding="utf-8"))["prompts"]
    client = openai.OpenAI(base_url=a.base_url + "/v1", api_key="none", timeout=1800, max_retries=0)
    model = client.models.list().data[0].id
    # A warm-up request outside every kind (the first request pays for page faults in the weights).
    one(client, model, {"messages": [{"role": "user", "content": "Say hello."}], "max_tokens": 8})
    res = {"streams": a.streams, "kinds": {}}
    for kind in a.kinds.split(","):
        items = [x for x in prompts if x["kind"] == kind]
        if not items:
            sys.exit("spec_run: no prompts of kind %r in %s" % (kind, a.prompts))
        before = counters(a.base_url)
        t0 = time.monotonic()
        with concurrent.futures.ThreadPoolExecutor(a.streams) as pool:
            outs = list(pool.map(lambda x: one(client, model, x), items))
        wall = time.monotonic() - t0
        after = counters(a.base_url)
        toks = sum(o["completion_tokens"] for o in outs)
        res["kinds"][kind] = {"wall_s": wall, "completion_tokens": toks, "tok_s": toks / wall, "requests": outs,
                              "spec": {k: after[k] - before.get(k, 0) for k in after}}
        print("spec_run: %-10s %d streams: %d requests, %d tokens in %.1f s, %.1f tok/s" %
              (kind, a.streams, len(outs), toks, wall, toks / wall), file=sys.stderr)
    json.dump(res, open(a.out, "w"), indent=1, ensure_ascii=False)


if __name__ == "__main__":
    main()
