#!/usr/bin/env python3
"""scripts/gpu_e2e.py: gpu-check.sh's end-to-end stage: router + prefill + decode workers on CUDA (KV over host staging with tcp, over nccl with two GPUs, and CPU prefill to GPU decode), greedy tokens against the colocated CPU run.

Usage: gpu_e2e.py --dserve BIN [--model M.gguf] [--gpus N] [--nccl 0|1] [--device cuda:0|cpu]
--model: default models/weights/SmolLM2-135M-Instruct.Q4_1.gguf; on a machine without network, a copy cut to a few
layers by scripts/gguf_truncate.py (real tokenizer, small enough to carry) serves. --device cpu runs the same cases
with every "GPU" worker on the cpu: a check of this script itself where there is no GPU.
Prints "e2e: ..." lines, "e2e: NOT RUN: ..." for a case this machine cannot run, and one "e2e summary: ..." line.
Exit status: 0 every case that ran passed; 1 a case failed (its reason printed); 2 bad usage or no model/binary.

Tolerance policy (greedy decoding, temperature 0). The CPU backend quantizes activations to int8 and the CUDA one
runs f32 GEMVs and f16 GEMMs, so their logits differ by rounding (tests/cuda allows 1% of the largest logit, about
0.2 for SmolLM2's logits of 20 to 30) and a token whose two best logits lie closer than twice that may flip. So:
  - each answer must equal the reference token for token up to its end, or up to a first divergence at a position
    where the reference's two best logprobs (= logits) are closer than the gap tolerance; after a divergence the
    contexts differ and the rest is not compared;
  - against the CPU run the gap tolerance is CPU_GAP (0.5); between GPU runs (1P1D against the colocated GPU run:
    the same kernels, KV copied byte for byte) it is GPU_GAP (0.05), which only admits rounding from batch shapes;
  - at least MIN_COVERAGE of the reference's tokens must have been compared, so that early divergences cannot make
    the check vacuous; and the KV of every request must have moved between the workers (router metrics).
"""

import argparse
import os
import sys
import tempfile

CPU_GAP = 0.5
GPU_GAP = 0.05
MIN_COVERAGE = 0.5

LONG = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a wooden press adapted from those used for wine. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell sharply. "
        "Summarize the consequences of this invention in one sentence:")
PROMPTS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three primary colors."}],
    [{"role": "user", "content": "Write two sentences about the sea."}],
    [{"role": "user", "content": LONG}],
]
MAX_TOKENS = 24


def answers(u, port):
    """Per prompt: [(token, gap between the two best logprobs)] of the greedy answer; raises on an HTTP error."""
    out = []
    for msgs in PROMPTS:
        st, b = u.post(port, "/v1/chat/completions", {"messages": msgs, "max_tokens": MAX_TOKENS, "temperature": 0,
                                                      "logprobs": True, "top_logprobs": 2})
        if st != 200:
            raise RuntimeError("HTTP %s: %s" % (st, b))
        toks = []
        for e in b["choices"][0]["logprobs"]["content"]:
            top = sorted((t["logprob"] for t in e["top_logprobs"]), reverse=True)
            gap = top[0] - top[1] if len(top) >= 2 else float("inf")
            toks.append((e["token"], gap))
        out.append(toks)
    return out


def compare(got, ref, gap_tol):
    """(ok, compared, total, note): got against ref under the policy above."""
    compared = total = 0
    notes = []
    ok = True
    for i, (g, r) in enumerate(zip(got, ref)):
        total += len(r)
        n = 0
        while n < len(g) and n < len(r) and g[n][0] == r[n][0]:
            n += 1
        compared += n
        if n == len(g) == len(r):
            continue
        if n < len(r) and n < len(g) and r[n][1] < gap_tol:
            notes.append("answer %d diverges at token %d, a near tie (gap %.3f < %.2f)" % (i, n, r[n][1], gap_tol))
            continue
        ok = False
        at = "its end" if n >= len(g) or n >= len(r) else "%r instead of %r, gap %.3f" % (g[n][0], r[n][0], r[n][1])
        notes.append("answer %d differs at token %d (%s): NOT a near tie" % (i, n, at))
    if total and compared < MIN_COVERAGE * total:
        ok = False
        notes.append("only %d of %d tokens compared (< %.0f%%)" % (compared, total, 100 * MIN_COVERAGE))
    return ok, compared, total, "; ".join(notes)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--dserve", required=True)
    ap.add_argument("--gpus", type=int, default=1)
    ap.add_argument("--nccl", type=int, choices=(0, 1), default=1)
    ap.add_argument("--model", default="")
    ap.add_argument("--device", default="cuda:0", choices=("cuda:0", "cpu"))
    a = ap.parse_args()
    if not os.access(a.dserve, os.X_OK):
        print("e2e: FAILED: %s is not an executable dserve" % a.dserve)
        return 2
    os.environ["DSERVE_BINARY"] = os.path.abspath(a.dserve)
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "e2e"))
    import e2e_util as u  # reads DSERVE_BINARY at import
    model = a.model or u.MODEL
    if not os.path.exists(model):
        print("e2e: FAILED: the model %s is missing" % model)
        return 2
    print("e2e: model %s, workers on %s" % (model, a.device))
    dev0, dev1 = (a.device, "cuda:1") if a.device != "cpu" else ("cpu", "cpu")

    class Cluster(u.Cluster):
        """u.Cluster on this model (u.Cluster's config takes the default model)."""

        def __init__(self, workers, disagg_threshold, tag):  # pylint: disable=super-init-not-called
            self.dir = tempfile.mkdtemp(prefix="dserve-%s-" % tag)
            self.config = os.path.join(self.dir, "c.json")
            self.port = u.local_config(self.config, workers, disagg_threshold, model=model)
            self.closed = False
            self.node = u.Node(self.config, backoff_ms=100)

    def run(name, workers, disagg):
        c = Cluster(workers, 0 if disagg else 1000, "gpu-" + name)
        try:
            # A worker that cannot start on its device is given up by the launcher within seconds: stop waiting then.
            u.wait_until(lambda: "failed permanently" in c.node.text() or "dserve: node local ready" in c.node.text(),
                         90)
            if "failed permanently" in c.node.text():
                raise RuntimeError("a worker failed permanently:\n" + c.node.text()[-3000:])
            c.start(timeout=90)
            m0 = u.metrics(c.port) if disagg else None
            got = answers(u, c.port)
            moved = None
            if disagg:
                m1 = u.metrics(c.port)
                moved = m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"]
            return got, moved
        except Exception as e:  # a worker that did not start or a request that failed: show its log
            print("e2e: %s: %s" % (name, e))
            return None, None
        finally:
            c.close()

    failed = []
    lines = []
    cpu, _ = run("cpu-coloc", [{"name": "w0", "role": "both"}], False)
    gpu, _ = run("gpu-coloc", [{"name": "w0", "role": "both", "device": dev0}], False)
    if cpu is None or gpu is None:
        print("e2e: FAILED: a colocated run did not complete")
        return 1
    ok, n, t, note = compare(gpu, cpu, CPU_GAP)
    lines.append("colocated %s vs cpu %d/%d tokens equal%s" % (dev0, n, t, "" if ok else " FAILED"))
    print("e2e: colocated %s against colocated cpu: %s, %d/%d tokens compared equal%s" %
          (dev0, "ok" if ok else "FAILED", n, t, (": " + note) if note else ""))
    if not ok:
        failed.append("colocated " + dev0)

    staged = {"backend": "tcp", "staging": "on"}
    cases = [("1P1D %s -> %s, tcp + host staging" % (dev0, dev0),
              [{"name": "p0", "role": "prefill", "device": dev0, "kvxfer": staged},
               {"name": "d0", "role": "decode", "device": dev0, "kvxfer": staged}], gpu, GPU_GAP),
             ("cpu prefill -> %s decode, tcp + host staging" % dev0,
              [{"name": "p0", "role": "prefill", "kvxfer": {"backend": "tcp"}},
               {"name": "d0", "role": "decode", "device": dev0, "kvxfer": staged}], cpu, CPU_GAP)]
    if a.gpus >= 2 and a.nccl:
        cases.append(("1P1D %s -> %s, nccl" % (dev0, dev1),
                      [{"name": "p0", "role": "prefill", "device": dev0, "kvxfer": {"backend": "nccl"}},
                       {"name": "d0", "role": "decode", "device": dev1, "kvxfer": {"backend": "nccl"}}], gpu,
                      GPU_GAP))
    elif not a.nccl:
        print("e2e: NOT RUN: 1P1D over nccl: this build has no NCCL")
    else:
        print("e2e: NOT RUN: 1P1D over nccl: one GPU (NCCL refuses two ranks on one device; prefill and decode "
              "need a GPU each)")
    for name, workers, ref, tol in cases:
        got, moved = run(name.split(",")[0].replace(" ", "-").replace(">", ""), workers, True)
        if got is None:
            failed.append(name)
            lines.append("%s FAILED (did not run)" % name)
            continue
        ok, n, t, note = compare(got, ref, tol)
        also = ""
        if ref is gpu:  # the GPU 1P1D also against the CPU, under the CPU tolerance
            ok2, n2, t2, note2 = compare(got, cpu, CPU_GAP)
            also = ", vs cpu %d/%d%s" % (n2, t2, "" if ok2 else " FAILED (" + note2 + ")")
            ok = ok and ok2
        if moved != len(PROMPTS):
            ok = False
            note = (note + "; " if note else "") + "KV moved for %s of %d requests" % (moved, len(PROMPTS))
        print("e2e: %s: %s, %d/%d tokens equal to the %s run%s%s" % (name, "ok" if ok else "FAILED", n, t,
              "colocated " + dev0 if ref is gpu else "colocated cpu", also, (": " + note) if note else ""))
        lines.append("%s %d/%d%s%s" % (name, n, t, also, "" if ok else " FAILED"))
        if not ok:
            failed.append(name)
    print("e2e summary: " + "; ".join(lines))
    if failed:
        print("e2e: FAILED: " + ", ".join(failed))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
