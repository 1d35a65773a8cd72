"""tests/e2e/test_kvquant.py: kv_type q8_0 serves both models colocated and 1P1D within the f16 run's tolerance policy, moves 0.53x the bytes per handoff, and a prefill and a decode worker of different kv_type never pair."""

import os
import sys
import time
import unittest

import e2e_util as u

LONG = ("The history of the printing press begins in the fifteenth century, when Johannes Gutenberg combined "
        "movable metal type, oil-based ink and a wooden press adapted from those used for wine. Within fifty years "
        "presses were running in more than two hundred cities across Europe, and the price of books fell sharply. "
        "Summarize the consequences of this invention in one sentence:")
PROMPTS = ["The three primary colors are", "A short poem about the sea:\n", LONG]
MAX_TOKENS = 24

# The tolerance policy of the llama.cpp golden tests (tests/models): greedy tokens equal, except at a near-tie, where
# the reference run's own margin between its token and ours is below the model's tie margin (SmolLM2 0.75, Gemma 3
# 0.5: test_llama.cc's and test_gemma.cc's kTieMargin); after a tie the continuations are not comparable, so the
# comparison stops there.
TIE_MARGIN = {u.MODEL: 0.75, u.GEMMA: 0.5}


def complete(port, prompt):
    """Greedy completion with the top-5 log-probabilities of every token: (status, [(token, {tok: lp})])."""
    st, b = u.post(port, "/v1/completions", {"prompt": prompt, "max_tokens": MAX_TOKENS, "temperature": 0,
                                             "logprobs": 5})
    if st != 200:
        return st, b
    lp = b["choices"][0]["logprobs"]
    return st, list(zip(lp["tokens"], lp["top_logprobs"]))


def within_policy(test, ref, got, margin, what):
    """got's greedy tokens are ref's up to the first near-tie (ref's margin between its token and got's < margin)."""
    for i, ((rt, rtop), (gt, _)) in enumerate(zip(ref, got)):
        if rt == gt:
            continue
        test.assertIn(gt, rtop, "%s: step %d chose %r, not in the f16 run's top 5 %r" % (what, i, gt, rtop))
        test.assertLess(rtop[rt] - rtop[gt], margin, "%s: step %d chose %r over the f16 run's %r" % (what, i, gt, rt))
        return i
    test.assertEqual(len(ref), len(got), what)
    return len(ref)


class KvQuant(unittest.TestCase):
    def serve(self, model, workers, tag, threshold=1000):
        c = u.Cluster(workers, model=model, tag=tag, disagg_threshold=threshold)
        self.addCleanup(c.close)
        c.start()
        return c

    def run_model(self, model):
        u.require_env(self)
        if not os.path.exists(model):
            self.skipTest("the model %s is missing: run scripts/setup.sh" % model)
        runs = {}
        for kv in ("f16", "q8_0"):
            co = self.serve(model, [{"name": "w0", "role": "both", "kv_type": kv}], "kvq-coloc-" + kv)
            runs[kv] = [complete(co.port, p) for p in PROMPTS]
            co.close()
        pd = {}
        for kv in ("f16", "q8_0"):
            c = self.serve(model, [{"name": "p0", "role": "prefill", "kv_type": kv, "kvxfer": {"backend": "shm"}},
                                   {"name": "d0", "role": "decode", "kv_type": kv, "kvxfer": {"backend": "shm"}}],
                           "kvq-1p1d-" + kv, threshold=0)
            m0 = u.metrics(c.port)
            pd[kv] = [complete(c.port, LONG)]
            self.assertEqual(pd[kv][0][0], 200, pd[kv][0])
            deadline = time.time() + 10 * u.SCALE  # handoffs are counted when the decode worker's `done` comes
            while (u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"] <
                   m0["dserve:kv_transfer_time_seconds_count"] + 1 and time.time() < deadline):
                time.sleep(0.05)
            m1 = u.metrics(c.port)
            self.assertEqual(m1["dserve:kv_transfer_time_seconds_count"] - m0["dserve:kv_transfer_time_seconds_count"],
                             1, kv + ": the prompt was not handed off")
            pd[kv].append(m1["dserve:kv_transfer_bytes_total"] - m0["dserve:kv_transfer_bytes_total"])
            c.close()
        for kv in ("f16", "q8_0"):
            for p, (st, _) in zip(PROMPTS, runs[kv]):
                self.assertEqual(st, 200, (kv, p))
            self.assertEqual(pd[kv][0][0], 200, kv)
        # the same kv_type colocated and 1P1D: the same tokens (a handoff moves the cache's bytes as they are)
        for kv in ("f16", "q8_0"):
            self.assertEqual([t for t, _ in pd[kv][0][1]], [t for t, _ in runs[kv][2][1]], kv + " 1P1D vs colocated")
        # q8_0 against f16: within the tolerance policy, colocated and 1P1D
        same = [within_policy(self, ref[1], got[1], TIE_MARGIN[model], "colocated q8_0, %r" % p[:30])
                for p, ref, got in zip(PROMPTS, runs["f16"], runs["q8_0"])]
        same.append(within_policy(self, runs["f16"][2][1], pd["q8_0"][0][1], TIE_MARGIN[model], "1P1D q8_0"))
        print("%s: q8_0 greedy tokens equal to f16's before the first near-tie: %s of %d" % (
            os.path.basename(model), same, MAX_TOKENS), file=sys.stderr)
        # bytes per handoff: 34 / 64 of f16's (each 32 values: 32 bytes and a 2-byte scale, instead of 64 bytes)
        self.assertGreater(pd["f16"][1], 0)
        self.assertAlmostEqual(pd["q8_0"][1] / pd["f16"][1], 34 / 64, places=6)

    def test_smollm2(self):
        self.run_model(u.MODEL)

    def test_gemma3(self):
        self.run_model(u.GEMMA)


class KvTypeMismatch(unittest.TestCase):
    """A prefill worker of kv_type f16 beside a decode worker of q8_0: their link would be refused at the hello (the
    error naming both types: tests/kv/test_kvquant.cc), so the router never pairs them; the decode worker computes
    the prompt itself and the text is the q8_0 colocated one. Never bytes read as the other type."""

    def test_never_paired(self):
        u.require_env(self)
        req = {"prompt": LONG, "max_tokens": 8}
        co = u.Cluster([{"name": "w0", "role": "both", "kv_type": "q8_0"}], tag="kvq-mismatch-ref")
        self.addCleanup(co.close)
        co.start()
        want = u.complete(co.port, "completions", req)
        co.close()
        self.assertEqual(want["status"], 200, want)
        c = u.Cluster([{"name": "p0", "role": "prefill", "kv_type": "f16", "kvxfer": {"backend": "shm"}},
                       {"name": "d0", "role": "decode", "kv_type": "q8_0", "kvxfer": {"backend": "shm"}}],
                      tag="kvq-mismatch", disagg_threshold=0)
        self.addCleanup(c.close)
        c.start()
        m0 = u.metrics(c.port)
        got = u.complete(c.port, "completions", req)
        self.assertEqual(got["status"], 200, got)
        self.assertEqual(got["text"], want["text"])
        # The decode worker's `done` has been taken in when the decode-time histogram counts it (the same step would
        # count a handoff): only then is "no handoff" a finding.
        dec = "dserve:request_decode_time_seconds_count"
        self.assertTrue(u.wait_until(lambda: u.metrics(c.port)[dec] > m0[dec], 10 * u.SCALE), u.metrics(c.port))
        self.assertEqual(u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"],
                         m0["dserve:kv_transfer_time_seconds_count"], "a handoff between f16 and q8_0 workers")


if __name__ == "__main__":
    unittest.main()
