"""tests/archs/test_archs_serve.py: each architecture's tiny GGUF (Q8_0 weights) served and answered through the
official openai client: `dserve serve` colocated with q8_0 KV, and one prefill + one decode worker (`dserve launch`,
f16 KV, every prompt handed off); a streamed and a non-streamed chat completion, and a repeated prompt read back from
the prefix store. The weights are random, so the checks are on status, token counts and finish_reason, not text; and
a prefix fetched from a peer prefill worker gives the greedy tokens the 1P1D cluster computed without it (a
sliding-window model computes the prefix instead, as docs/protocol.md says, and gives them too); a stream whose decode
worker is killed mid-stream moves to the other decode worker and ends with the undisturbed run's greedy tokens. A
handoff moves exactly the prompt's blocks of the model's KV geometry as its GGUF describes it (K and V, or an MLA
model's latent row: dserve:kv_pushed_bytes_total, what the prefill worker wrote over kvxfer). /v1/embeddings, colocated
and on the decode worker, against llama.cpp's llama-embedding on the same file (tests/models/golden/embeddings.json.gz)."""

import os
import shutil
import signal
import tempfile
import unittest

import tiny_util as t
import e2e_util as u
import oai_util as o
from test_serve import Launched
from test_embeddings import cosine, floor_for, golden_doc

MAX_TOKENS = 8
MIGRATE_TOKENS = 200  # (about 1 s of decode at 1 thread: the kill lands mid-stream)
# Token ids (the completions API takes them as the prompt): a 160-token prefix (10 blocks) and a question after it.
FETCH_PREFIX = [(i * 37) % 4000 + 100 for i in range(160)]
FETCH_QUESTION = [(i * 53) % 3000 + 200 for i in range(24)]
# A prompt no other request shares (100 tokens: 7 blocks, the last partial), handed off for its bytes.
HANDOFF_PROMPT = [(i * 41) % 3500 + 150 for i in range(100)]
# Models whose pool keeps layer groups apart do not fetch prefixes from peers (docs/protocol.md, "Prefix fetch").
SLIDING_WINDOW = {"gemma2", "gemma3"}
# about 70 tokens: four full 16-token KV blocks for the prefix store
PROMPT = ("The river rises in the hills north of the town, runs south through three villages and a forest of old "
          "oaks, and meets the sea at a small harbour where fishing boats have landed their catch for centuries. "
          "Describe the river in one sentence.")


class Serve(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        t.require_env()
        u.require_env(cls)
        if o.openai is None:
            raise unittest.SkipTest("the openai package is not installed (scripts/setup.sh makes the test venv)")

    def chat(self, client, model, stream):
        kw = dict(model=model, messages=[{"role": "user", "content": PROMPT}], max_tokens=MAX_TOKENS, temperature=0,
                  extra_body={"ignore_eos": True})  # random weights may pick EOS at once: ask for every token
        if not stream:
            r = client.chat.completions.create(**kw)
            self.assertEqual(len(r.choices), 1)
            return r.choices[0].finish_reason, r.usage
        finish, usage, deltas = None, None, 0
        for ch in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kw):
            if ch.usage is not None:
                usage = ch.usage
            for c in ch.choices:
                deltas += 1
                finish = c.finish_reason or finish
        self.assertGreater(deltas, 0, "no chunk carried a choice")
        self.assertIsNotNone(usage, "the stream's last chunk carried no usage")
        return finish, usage

    def check_serving(self, port, what):
        client = o.client(port)
        model = client.models.list().data[0].id
        hits0 = u.metrics(port).get("dserve:prefix_cache_hits_total", 0)
        prompt_tokens = None
        for stream in (False, True, False):
            finish, usage = self.chat(client, model, stream)
            label = "%s, %s" % (what, "streamed" if stream else "not streamed")
            self.assertEqual(finish, "length", label)
            self.assertEqual(usage.completion_tokens, MAX_TOKENS, label)
            self.assertGreater(usage.prompt_tokens, 64, label)
            if prompt_tokens is not None:
                self.assertEqual(usage.prompt_tokens, prompt_tokens, label)
            prompt_tokens = usage.prompt_tokens
        # the third request repeats the first: its whole blocks come from the prefix store
        details = usage.prompt_tokens_details
        cached = details.cached_tokens if details is not None else 0
        self.assertGreaterEqual(cached, 64, "%s: the repeated prompt was not read from the prefix store" % what)
        # (the router's series follow the workers' periodic stats)
        hits = u.wait_until(lambda: u.metrics(port).get("dserve:prefix_cache_hits_total", 0) > hits0, 20 * u.SCALE)
        self.assertTrue(hits, "%s: dserve:prefix_cache_hits_total did not grow" % what)

    def check(self, arch):
        model = t.models(arch, ["Q8_0"])["Q8_0"]
        # colocated: dserve serve, q8_0 KV
        d = tempfile.mkdtemp(prefix="dserve-archs-%s-" % arch)
        self.addCleanup(shutil.rmtree, d, True)
        port = u.free_ports(1)[0]
        srv = Launched(["serve", model, "--port", str(port), "-t", "1", "--kv-type", "q8_0", "--kv-budget-mb", "32"], d)
        self.addCleanup(srv.stop)
        srv.wait_ready()
        self.check_serving(port, "%s colocated (q8_0 KV)" % arch)
        self.check_embedding(arch, model, port, "colocated (q8_0 KV)")
        srv.stop()
        # 1P1D: dserve launch, every prompt handed off over shm
        c = u.Cluster([{"name": "p0", "role": "prefill", "kvxfer": {"backend": "shm"}},
                       {"name": "d0", "role": "decode", "kvxfer": {"backend": "shm"}}],
                      disagg_threshold=0, model=model, tag="archs-1p1d-" + arch)
        self.addCleanup(c.close)
        c.start()
        moved0 = u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"]
        self.check_serving(c.port, "%s 1P1D" % arch)
        self.assertEqual(u.metrics(c.port)["dserve:kv_transfer_time_seconds_count"] - moved0, 3,
                         "each of the 3 requests should have been handed off")
        self.check_handoff_bytes(arch, model, c)
        self.check_embedding(arch, model, c.port, "1P1D, on the decode worker")
        fetch_body = {"prompt": FETCH_PREFIX + FETCH_QUESTION, "max_tokens": MAX_TOKENS, "ignore_eos": True}
        want = u.complete(c.port, "completions", fetch_body)
        self.assertEqual(want["status"], 200, want)
        c.close()
        self.check_fetch(arch, model, fetch_body, want)
        self.check_migration(arch, model)

    def check_embedding(self, arch, model, port, what):
        """/v1/embeddings of the golden's input (mean pooling: the tiny GGUFs have no pooling_type) against
        llama-embedding's on the very same file."""
        g = golden_doc()["archs"][arch]
        self.assertEqual(t.sha256(model), g["sha256"], "%s is not the file the embedding golden was made from: "
                         "regenerate it (scripts/golden/make_embeddings_golden.py)" % g["file"])
        r = o.client(port).embeddings.create(model=o.client(port).models.list().data[0].id, input=g["inputs"],
                                             encoding_format="float")
        c = cosine(r.data[0].embedding, g["embeddings"][0])
        self.assertGreaterEqual(c, floor_for(g["self_cosine"][0]), "%s %s: cosine %.5f with llama.cpp's embedding "
                                "(llama.cpp with itself: %.5f)" % (arch, what, c, g["self_cosine"][0]))

    def check_handoff_bytes(self, arch, model, cluster):
        """The bytes the prefill worker pushed over kvxfer for one fresh prompt (its stats) are the prompt's blocks of
        the GGUF's KV geometry: a latent row per layer for an MLA model, never per-head K and V; the decode worker
        counts the same (dserve:kv_transfer_bytes_total, per finished choice). A sliding-window model sends less (its
        local layers' early blocks): printed, not checked."""
        p0 = cluster.ports()["p0"]
        pushed0 = u.worker_stats(p0)["kv_bytes_pushed"]
        moved0 = u.metrics(cluster.port).get("dserve:kv_transfer_bytes_total", 0)
        r = u.complete(cluster.port, "completions", {"prompt": HANDOFF_PROMPT, "max_tokens": 1})
        self.assertEqual(r["status"], 200, r)
        pushed = u.worker_stats(p0)["kv_bytes_pushed"] - pushed0  # posted before the decode worker could answer
        moved = u.metrics(cluster.port).get("dserve:kv_transfer_bytes_total", 0) - moved0
        blocks = (r["prompt_tokens"] + 15) // 16
        print("%s 1P1D: %d prompt tokens handed off in %d bytes (%d per token; the decode worker counted %d)" % (
            arch, r["prompt_tokens"], pushed, pushed // (blocks * 16), moved))
        self.assertEqual(moved, pushed, "%s: the decode worker counted other bytes than were pushed" % arch)
        if arch not in SLIDING_WINDOW:
            self.assertEqual(pushed, blocks * 16 * t.kv_bytes_per_token(model),
                             "%s: not %d blocks of the GGUF's KV geometry" % (arch, blocks))

    def check_fetch(self, arch, model, body, want):
        """Two prefill workers and router.prefix_fetch (u.prefix_fetch_cluster): the prefix + question goes to the
        asker, which fetches the prefix's 10 blocks from the holder; its greedy answer is want's."""
        c, asker, holder = u.prefix_fetch_cluster(self, FETCH_PREFIX, True, "archs-fetch-" + arch, model=model)
        ports = c.ports()
        got = u.complete(c.port, "completions", body)
        self.assertEqual(got["status"], 200, got)
        sa, sh = u.worker_stats(ports[asker]), u.worker_stats(ports[holder])
        fetched = (sa["prefix_fetches"], sa["prefix_fetched_blocks"], sh["prefix_served_blocks"])
        if arch in SLIDING_WINDOW:  # docs/protocol.md, "Prefix fetch": such a worker computes the prefix instead
            self.assertEqual(fetched, (0, 0, 0), "%s: a sliding-window model fetched a prefix" % arch)
        else:
            self.assertEqual(fetched, (1, 10, 10), "%s: no fetch of the prefix's 10 blocks from %s" % (arch, holder))
        for k in ("text", "completion_tokens", "prompt_tokens", "finish_reason"):
            self.assertEqual(got[k], want[k], "%s with the prefix fetched: %s differs" % (arch, k))


    def check_migration(self, arch, model):
        """One prefill and two decode workers: kill -9 the decode worker of a stream after its 10th event; the stream
        goes on on the other (docs/protocol.md, "Mid-stream migration", which recomputes the KV of the prompt and the
        tokens so far) and its text and token count are the undisturbed run's."""
        c = u.Cluster([{"name": "p0", "role": "prefill", "kvxfer": {"backend": "shm"}},
                       {"name": "d0", "role": "decode", "kvxfer": {"backend": "shm"}},
                       {"name": "d1", "role": "decode", "kvxfer": {"backend": "shm"}}],
                      disagg_threshold=0, model=model, tag="archs-move-" + arch)
        self.addCleanup(c.close)
        c.start()
        ports = c.ports()
        body = {"prompt": FETCH_QUESTION, "max_tokens": MIGRATE_TOKENS, "ignore_eos": True}
        want = u.complete(c.port, "completions", body)
        self.assertEqual(want["status"], 200, want)
        moved0 = u.metrics(c.port).get("dserve:migrations_total", 0)
        killed = []

        def kill_its_decoder(i, _obj):
            if i == 10:
                busy = [n for n in ("d0", "d1") if u.worker_stats(ports[n])["running"] > 0]
                self.assertEqual(len(busy), 1, busy)
                os.kill(c.node.child_pid(busy[0]), signal.SIGKILL)
                killed.append(busy[0])
            return False

        got = u.stream(c.port, "completions", body, on_event=kill_its_decoder)
        self.assertEqual(len(killed), 1, "the stream ended before its 10th event: %r" % got)
        self.assertIsNone(got["error"], got)
        self.assertEqual((got["text"], got["completion_tokens"]), (want["text"], want["completion_tokens"]),
                         "%s: the stream moved from %s lost or changed tokens" % (arch, killed[0]))
        c.node.wait_for("worker %s is gone after" % killed[0], 10 * u.SCALE)
        self.assertEqual(u.metrics(c.port).get("dserve:migrations_total", 0) - moved0, 1)


for _arch in sorted(t.manifest()["kl"]):
    setattr(Serve, "test_" + _arch, lambda self, a=_arch: self.check(a))

if __name__ == "__main__":
    unittest.main()
