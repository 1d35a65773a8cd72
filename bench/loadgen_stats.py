"""bench/loadgen_stats.py: what a load run measured: percentiles, SLO goodput, the summary, the report, the comparison
table and the plot (pure functions, no I/O but the optional plot file); bench/loadgen.py runs the load."""

import html
import math

CONN_ERROR = "conn_error"
TIMEOUT = "timeout"
STREAM_ERROR = "stream_error"


class LoadgenError(Exception):
    """A clean, user-facing error (bad arguments, unreadable dataset); printed without a traceback."""


# ----------------------------------------------------------------------------------------------------------------
# Statistics (pure functions)


def percentile(values, p):
    """Linear-interpolation percentile (numpy's default) of a list of numbers; None for an empty list."""
    if not values:
        return None
    xs = sorted(values)
    if len(xs) == 1:
        return float(xs[0])
    pos = (len(xs) - 1) * (p / 100.0)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(xs) - 1)
    frac = pos - lo
    return float(xs[lo] + (xs[hi] - xs[lo]) * frac)


def describe(values):
    """mean/median/p90/p99/std/min/max/count of a list of numbers (all None when empty)."""
    if not values:
        return {"mean": None, "median": None, "p90": None, "p99": None, "std": None,
                "min": None, "max": None, "count": 0}
    n = len(values)
    mean = sum(values) / n
    var = sum((v - mean) ** 2 for v in values) / n
    return {"mean": mean, "median": percentile(values, 50), "p90": percentile(values, 90),
            "p99": percentile(values, 99), "std": math.sqrt(var), "min": float(min(values)),
            "max": float(max(values)), "count": n}


def parse_slo(text):
    """'ttft:MS,tpot:MS,e2e:MS' (any subset) -> {'ttft': ms, ...}; raises LoadgenError on bad input."""
    slo = {}
    if not text:
        return slo
    for part in text.split(","):
        part = part.strip()
        if not part:
            continue
        if ":" not in part:
            raise LoadgenError("bad --slo item %r (want name:ms, e.g. ttft:500)" % part)
        name, val = part.split(":", 1)
        name = name.strip().lower()
        if name not in ("ttft", "tpot", "e2e"):
            raise LoadgenError("bad --slo metric %r (known: ttft, tpot, e2e)" % name)
        try:
            ms = float(val)
        except ValueError:
            raise LoadgenError("bad --slo value %r for %s (want milliseconds)" % (val, name)) from None
        if not (ms > 0 and math.isfinite(ms)):
            raise LoadgenError("--slo %s must be a positive number of milliseconds" % name)
        slo[name] = ms
    return slo


def request_meets_slo(r, slo):
    """True when a successful request result (dict with ttft/tpot/e2e in seconds) meets every given SLO (ms)."""
    if not r.get("success"):
        return False
    for name, ms in slo.items():
        v = r.get(name)
        if name == "tpot" and v is None:
            v = 0.0  # one output token: no decode time per token (vLLM's convention)
        if v is None or v * 1000.0 > ms:
            return False
    return True


def summarize(results, duration, slo=None, extra=None):
    """Aggregate per-request results (list of dicts, times in seconds) over a run of `duration` seconds.

    Each result: success (bool), status (str: HTTP code, conn_error, timeout, stream_error), ttft, tpot, e2e (s or
    None), itl (list of s), output_tokens (int), input_tokens (int or None), start (s since run start),
    token_times (list of s since run start). Returns the report dict (latencies in ms)."""
    slo = slo or {}
    ok = [r for r in results if r.get("success")]
    hist = {}
    for r in results:
        hist[r["status"]] = hist.get(r["status"], 0) + 1
    ms = lambda xs: [x * 1000.0 for x in xs]  # noqa: E731
    ttfts = [r["ttft"] for r in ok if r.get("ttft") is not None]
    tpots = [r["tpot"] for r in ok if r.get("tpot") is not None]
    e2es = [r["e2e"] for r in ok if r.get("e2e") is not None]
    itls = [x for r in ok for x in (r.get("itl") or [])]
    out_tok = sum(r.get("output_tokens") or 0 for r in ok)
    in_known = [r["input_tokens"] for r in ok if r.get("input_tokens") is not None]
    in_tok = sum(in_known)
    dur = duration if duration and duration > 0 else 0.0
    good = sum(1 for r in ok if request_meets_slo(r, slo)) if slo else len(ok)
    rep = {
        "num_requests_sent": len(results),
        "successful_requests": len(ok),
        "failed_requests": len(results) - len(ok),
        "status_histogram": dict(sorted(hist.items())),
        "connection_errors": hist.get(CONN_ERROR, 0),
        "timeouts": hist.get(TIMEOUT, 0),
        "duration_s": dur,
        "total_input_tokens": in_tok,
        "input_tokens_unknown": len(ok) - len(in_known),
        "total_output_tokens": out_tok,
        "output_tokens_from_usage": sum(1 for r in ok if r.get("usage_seen")),
        "request_throughput": len(ok) / dur if dur else 0.0,
        "output_throughput": out_tok / dur if dur else 0.0,
        "total_token_throughput": (in_tok + out_tok) / dur if dur else 0.0,
        "ttft_ms": describe(ms(ttfts)),
        "tpot_ms": describe(ms(tpots)),
        "itl_ms": describe(ms(itls)),
        "e2e_ms": describe(ms(e2es)),
        "slo_ms": dict(slo),
        "good_requests": good,
        "goodput": (good / dur if dur else 0.0) if slo else None,
        "peak_concurrency": peak_concurrency(results),
        "throughput_timeline": timeline(results, dur),
    }
    if extra:
        rep.update(extra)
    return rep


def peak_concurrency(results):
    """Largest number of requests in flight at once, from each result's start and end (s since run start)."""
    ev = []
    for r in results:
        if r.get("start") is None or r.get("end") is None:
            continue
        ev.append((r["start"], 1))
        ev.append((r["end"], -1))
    ev.sort(key=lambda e: (e[0], e[1]))  # ends before starts at the same instant
    cur = best = 0
    for _, d in ev:
        cur += d
        best = max(best, cur)
    return best


def timeline(results, duration, bucket=1.0):
    """Output tokens and completed requests per `bucket` seconds over the run (for the plot and the JSON)."""
    nb = max(1, int(math.ceil(duration / bucket))) if duration else 1
    nb = min(nb, 100000)
    toks = [0] * nb
    done = [0] * nb
    for r in results:
        if not r.get("success"):
            continue
        times = r.get("token_times") or []
        # when usage says more tokens than content chunks arrived, spread the extra over the chunks' times
        scale = (r.get("output_tokens") or 0) / len(times) if times else 0
        for t in times:
            toks[min(nb - 1, max(0, int(t / bucket)))] += scale
        if r.get("end") is not None:
            done[min(nb - 1, max(0, int(r["end"] / bucket)))] += 1
    return {"bucket_s": bucket, "output_tokens_per_s": [round(t / bucket, 3) for t in toks],
            "requests_completed": done}


# ----------------------------------------------------------------------------------------------------------------
# Output


def _f(v, nd=2):
    return "n/a" if v is None else "%.*f" % (nd, v)


def format_report(rep):
    """The report as vLLM's benchmark_serving prints it (plus failures, status histogram, goodput, E2E)."""
    L = []
    row = lambda k, v: L.append("{:<40} {:<10}".format(k, v))  # noqa: E731
    L.append("{s:{c}^{n}}".format(s=" Serving Benchmark Result ", n=50, c="="))
    row("Successful requests:", rep["successful_requests"])
    row("Failed requests:", rep["failed_requests"])
    row("HTTP status histogram:", " ".join("%s=%d" % kv for kv in rep["status_histogram"].items()) or "-")
    row("Connection errors:", rep["connection_errors"])
    if rep.get("max_concurrency"):
        row("Maximum request concurrency:", rep["max_concurrency"])
    if rep.get("request_rate") is not None:
        row("Traffic request rate:", rep["request_rate"])
    row("Benchmark duration (s):", _f(rep["duration_s"]))
    row("Total input tokens:", rep["total_input_tokens"])
    row("Total generated tokens:", rep["total_output_tokens"])
    row("Request throughput (req/s):", _f(rep["request_throughput"]))
    if rep.get("goodput") is not None:
        row("Request goodput (req/s):", _f(rep["goodput"]))
    row("Output token throughput (tok/s):", _f(rep["output_throughput"]))
    row("Total Token throughput (tok/s):", _f(rep["total_token_throughput"]))
    row("Peak concurrent requests:", rep["peak_concurrency"])
    for key, title, name in (("ttft_ms", "Time to First Token", "TTFT"),
                             ("tpot_ms", "Time per Output Token (excl. 1st token)", "TPOT"),
                             ("itl_ms", "Inter-token Latency", "ITL"),
                             ("e2e_ms", "End-to-end Latency", "E2EL")):
        L.append("{s:{c}^{n}}".format(s=title, n=50, c="-"))
        d = rep[key]
        row("Mean %s (ms):" % name, _f(d["mean"]))
        row("Median %s (ms):" % name, _f(d["median"]))
        row("P90 %s (ms):" % name, _f(d["p90"]))
        row("P99 %s (ms):" % name, _f(d["p99"]))
    if rep.get("slo_ms"):
        L.append("{s:{c}^{n}}".format(s="Goodput", n=50, c="-"))
        row("SLO (ms):", ",".join("%s:%g" % kv for kv in rep["slo_ms"].items()))
        row("Requests meeting every SLO:", rep["good_requests"])
    L.append("=" * 50)
    for n in rep.get("notes") or []:
        L.append("note: " + n)
    if rep["input_tokens_unknown"]:
        L.append("note: the server sent no usage for %d requests: input tokens unknown, output tokens counted as "
                 "streamed chunks" % rep["input_tokens_unknown"])
    return "\n".join(L)


def first_error(rep):
    for r in rep.get("requests") or []:
        if r.get("error"):
            return r["error"]
    return ""


def plot_unavailable():
    """None when plot() can draw, else why not (matplotlib does not import): main() checks before the run."""
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot  # noqa: F401
    except Exception as e:  # any import failure means: no plot
        return "matplotlib is not importable (%s: %s)" % (type(e).__name__, e)
    return None


def plot_title(rep):
    """The figure's title: what was run (model, lengths, offered rate), so a PNG read alone says what it shows."""
    rate = rep.get("request_rate")
    rate = "unlimited" if rate in ("inf", None) else "%g req/s" % rate
    return "%s · %s · %s · rate %s · %s" % (rep.get("model") or "?", rep.get("dataset") or "?",
                                            rep.get("lengths") or "?", rate, rep.get("base_url") or "?")


def plot_figure(rep):
    """The figure plot() saves (latency CDFs, TTFT/TPOT over time, throughput over time); needs matplotlib."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    reqs = [r for r in rep["requests"] if r.get("status") == "200" and r.get("e2e") is not None]
    fig, axes = plt.subplots(1, 3, figsize=(17, 4.5))
    ax = axes[0]
    series = [(label, [r[key] * 1000 for r in reqs if r.get(key) is not None])
              for key, label in (("ttft", "TTFT"), ("tpot", "TPOT"), ("e2e", "E2E"))]
    series.append(("ITL", [x * 1000 for r in rep["requests"] for x in (r.get("itl") or [])]))
    for label, xs in series:
        xs = sorted(x for x in xs if x > 0)
        if xs:
            ax.step(xs, [(i + 1) / len(xs) for i in range(len(xs))], where="post", marker=".", label=label)
    ax.set_xscale("log")
    ax.set_xlabel("latency (ms)")
    ax.set_ylabel("CDF")
    ax.legend()
    ax.grid(True, alpha=0.3)
    ax = axes[1]  # each request's TTFT and TPOT at the time it started
    for key, label in (("ttft", "TTFT"), ("tpot", "TPOT")):
        pts = [(r["start"], r[key] * 1000) for r in reqs if r.get(key) is not None and r.get("start") is not None]
        if pts:
            ax.scatter([p[0] for p in pts], [p[1] for p in pts], s=8, label=label)
    ax.set_yscale("log")
    ax.set_xlabel("request start (s)")
    ax.set_ylabel("latency (ms)")
    ax.legend()
    ax.grid(True, alpha=0.3)
    ax = axes[2]
    tl = rep["throughput_timeline"]
    ts = [i * tl["bucket_s"] for i in range(len(tl["output_tokens_per_s"]))]
    ax.plot(ts, tl["output_tokens_per_s"], marker=".", label="output tok/s")
    ax.set_xlabel("time (s)")
    ax.set_ylabel("output tokens/s")
    ax2 = ax.twinx()
    ax2.plot(ts, tl["requests_completed"], color="tab:orange", marker=".", label="requests done/s")
    ax2.set_ylabel("requests/s")
    ax.grid(True, alpha=0.3)
    h1, l1 = ax.get_legend_handles_labels()  # one legend for both y axes' lines
    h2, l2 = ax2.get_legend_handles_labels()
    ax2.legend(h1 + h2, l1 + l2, loc="upper right")
    fig.suptitle(plot_title(rep))
    fig.tight_layout()
    return fig


def plot(rep, path):
    """Write plot_figure(rep) as a PNG; None on success or a reason string."""
    why = plot_unavailable()
    if why:
        return why
    import matplotlib.pyplot as plt
    fig = plot_figure(rep)
    fig.savefig(path, dpi=100)
    plt.close(fig)
    return None


def goodput_svg(runs, path, title="goodput against request rate"):
    """Write an SVG line chart of goodput (req/s within the SLO) against the offered rate, one line per server.

    runs: {server: {rate(float): report dict or None}}, as compare_table takes; an unlimited rate (inf) and missing
    reports are left out. Plain SVG text, so the plot needs no plotting package. Returns the number of points drawn."""
    pts = {s: sorted((r, rep["goodput"]) for r, rep in by.items()
                     if rep is not None and rep.get("goodput") is not None and math.isfinite(r))
           for s, by in runs.items()}
    xs = [r for p in pts.values() for r, _ in p] or [1.0]
    ys = [g for p in pts.values() for _, g in p] or [1.0]
    xmax, ymax = max(xs) * 1.05 or 1.0, max(max(ys), max(xs)) * 1.1 or 1.0
    W, H, L, B, T, R = 640, 400, 60, 50, 40, 150  # size, then margins: left, bottom, top, right (the legend)
    X = lambda v: L + v / xmax * (W - L - R)
    Y = lambda v: H - B - v / ymax * (H - B - T)
    out = ['<svg xmlns="http://www.w3.org/2000/svg" width="%d" height="%d" font-family="sans-serif" font-size="12">'
           % (W, H), '<rect width="100%" height="100%" fill="white"/>',
           '<text x="%d" y="22" font-size="14">%s</text>' % (L, html.escape(title))]
    for i in range(6):  # axes with 5 ticks each
        xv, yv = xmax * i / 5, ymax * i / 5
        out.append('<line x1="%.1f" y1="%d" x2="%.1f" y2="%d" stroke="#ddd"/>' % (X(xv), T, X(xv), H - B))
        out.append('<line x1="%d" y1="%.1f" x2="%d" y2="%.1f" stroke="#ddd"/>' % (L, Y(yv), W - R, Y(yv)))
        out.append('<text x="%.1f" y="%d" text-anchor="middle">%.2g</text>' % (X(xv), H - B + 16, xv))
        out.append('<text x="%d" y="%.1f" text-anchor="end">%.2g</text>' % (L - 6, Y(yv) + 4, yv))
    out.append('<text x="%d" y="%d" text-anchor="middle">offered rate (req/s)</text>' % ((L + W - R) // 2, H - 12))
    out.append('<text x="16" y="%d" transform="rotate(-90 16 %d)" text-anchor="middle">goodput (req/s)</text>'
               % ((T + H - B) // 2, (T + H - B) // 2))
    out.append('<line x1="%.1f" y1="%.1f" x2="%.1f" y2="%.1f" stroke="#999" stroke-dasharray="4 4"/>'
               % (X(0), Y(0), X(min(xmax, ymax)), Y(min(xmax, ymax))))  # goodput = rate: every request in the SLO
    colors = ["#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf"]
    n = 0
    for i, (s, p) in enumerate(pts.items()):
        c = colors[i % len(colors)]
        if len(p) > 1:
            out.append('<polyline fill="none" stroke="%s" stroke-width="2" points="%s"/>'
                       % (c, " ".join("%.1f,%.1f" % (X(r), Y(g)) for r, g in p)))
        for r, g in p:
            out.append('<circle cx="%.1f" cy="%.1f" r="3.5" fill="%s"><title>%s: %.3g req/s at %.3g</title></circle>'
                       % (X(r), Y(g), c, html.escape(s), g, r))
            n += 1
        ly = T + 10 + 18 * i
        out.append('<line x1="%d" y1="%d" x2="%d" y2="%d" stroke="%s" stroke-width="2"/>' % (W - R + 10, ly, W - R + 30, ly, c))
        out.append('<text x="%d" y="%d">%s</text>' % (W - R + 36, ly + 4, html.escape(s)))
    out.append("</svg>")
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    return n


def compare_table(runs, baseline, ttft_limit_ms=1000.0):
    """Table of goodput and p99 TTFT per rate for each server against `baseline`.

    runs: {server: {rate(float): report dict or None}}. Returns (text, knee_rate or None)."""
    servers = [s for s in runs if s != baseline]
    rates = sorted({r for s in runs.values() for r in s})
    base = runs.get(baseline, {})

    def gp(rep):
        return None if rep is None else rep.get("goodput")

    def p99(rep):
        return None if rep is None or not rep.get("successful_requests") else rep["ttft_ms"]["p99"]

    def ratio(a, b):
        return None if a is None or b is None or b == 0 else a / b

    knee = None
    for rate in rates:
        v = p99(base.get(rate))
        if v is not None and v > ttft_limit_ms:
            knee = rate
            break
    hdr = ["rate", "%s gp" % baseline, "%s p99ttft" % baseline]
    for s in servers:
        hdr += ["%s gp" % s, "%s p99ttft" % s, "gp ratio", "p99ttft ratio"]
    rows = []
    for rate in rates:
        b = base.get(rate)
        row = ["%g" % rate, _f(gp(b)), _f(p99(b), 0)]
        for s in servers:
            x = runs[s].get(rate)
            row += [_f(gp(x)), _f(p99(x), 0), _f(ratio(gp(x), gp(b))), _f(ratio(p99(x), p99(b)))]
        rows.append(row)
    w = [max(len(h), *(len(r[i]) for r in rows)) if rows else len(h) for i, h in enumerate(hdr)]
    out = ["  ".join(h.rjust(w[i]) for i, h in enumerate(hdr))]
    out += ["  ".join(c.rjust(w[i]) for i, c in enumerate(r)) for r in rows]
    out.append("(gp = goodput req/s; ratios are server/%s; p99ttft in ms)" % baseline)
    if knee is None:
        out.append("%s p99 TTFT never exceeded %g ms at the rates tried" % (baseline, ttft_limit_ms))
    else:
        out.append("rate where %s p99 TTFT first exceeds %g ms: %g req/s" % (baseline, ttft_limit_ms, knee))
        for s in servers:
            r = ratio(gp(runs[s].get(knee)), gp(base.get(knee)))
            verdict = "n/a" if r is None else ("meets" if r >= 1.5 else "misses")
            out.append("  %s/%s goodput at %g req/s: %s (target >= 1.5: %s)" % (s, baseline, knee, _f(r), verdict))
    return "\n".join(out), knee
