"""tests/e2e/test_serve.py: a llama-server user's first hour (issue 33): `dserve serve MODEL.gguf` with the flags they know and no config file, answered by the official openai client; `dserve launch` overrides on a copied config; --version and every subcommand's --help."""

import json
import os
import shutil
import socket
import subprocess
import tempfile
import unittest

import oai_util as o
import e2e_util as u

CMDS = ["inspect", "tokenize", "generate", "perplexity", "serve", "launch", "router", "both", "prefill", "decode",
        "kvxfer-bench"]


class Launched(u.Proc):
    """A `dserve serve|launch ...` process run in cwd, its output in cwd/out.log; waits for its ready line."""

    def __init__(self, argv, cwd):
        super().__init__(argv, os.path.join(cwd, "out.log"), cwd=cwd)

    def wait_ready(self, timeout=90.0):
        self.wait_for("ready (router", timeout * u.SCALE)

    def stop(self):
        return super().stop(term_s=20 * u.SCALE)


def run(argv, cwd=None, timeout=60):
    p = subprocess.run([u.DSERVE] + argv, cwd=cwd, capture_output=True, text=True, timeout=timeout * u.SCALE,
                       stdin=subprocess.DEVNULL)
    return p.returncode, p.stdout + p.stderr


class ServeGemma(unittest.TestCase):
    """The issue's target: from anywhere, `dserve serve <gemma> --port P` answers chat (with a chat template
    override: this GGUF ships none) and completions, with no config written."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        if o.openai is None:
            raise unittest.SkipTest("the openai package is not installed (scripts/setup.sh makes the test venv)")
        if not os.path.exists(u.GEMMA):
            raise unittest.SkipTest("the Gemma model is missing: run scripts/setup.sh")
        cls.dir = tempfile.mkdtemp(prefix="dserve-serve-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        with open(os.path.join(cls.dir, "keys"), "w") as f:
            f.write("# keys\nsk-first\nsk-second\n")
        cls.port = u.free_ports(1)[0]
        rel_model = os.path.relpath(u.GEMMA, cls.dir)  # relative to the working directory, as a user types it
        cls.srv = Launched(["serve", rel_model, "--port", str(cls.port), "-t", "1", "-c", "2048",
                            "--chat-template", "gemma", "--alias", "gemma3", "--api-key-file", "keys"], cls.dir)
        cls.addClassCleanup(cls.srv.stop)
        cls.srv.wait_ready()
        cls.client = o.openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % cls.port, api_key="sk-second",
                                     max_retries=0, timeout=300 * u.SCALE)

    def test_models_lists_the_alias(self):
        self.assertEqual([m.id for m in self.client.models.list().data], ["gemma3"])

    def test_chat(self):
        r = self.client.chat.completions.create(model="gemma3", max_tokens=16, temperature=0,
                                                messages=[{"role": "user", "content": "What is the capital of France?"}])
        self.assertTrue(r.choices[0].message.content.strip())
        self.assertIn(r.choices[0].finish_reason, ("stop", "length"))
        self.assertGreater(r.usage.prompt_tokens, 8)

    def test_completions(self):
        r = self.client.completions.create(model="gemma3", prompt="The capital of France is", max_tokens=8,
                                           temperature=0)
        self.assertTrue(r.choices[0].text.strip())

    def test_the_key_file_is_enforced(self):
        bad = o.openai.OpenAI(base_url="http://127.0.0.1:%d/v1" % self.port, api_key="sk-wrong", max_retries=0)
        with self.assertRaises(o.openai.AuthenticationError):
            bad.models.list()

    def test_ctx_sizes_the_pool_in_tokens(self):
        self.assertIn("128 KV blocks", self.srv.text())  # -c 2048 / 16 tokens a block

    def test_ctx_is_the_bound(self):
        """Issue 45: after -c the 8,997-token prompts of the trial were served (the bound was the GGUF's 32768)."""
        self.assertEqual(self.client.models.list().data[0].max_model_len, 2048)
        with self.assertRaises(o.openai.BadRequestError) as e:
            self.client.completions.create(model="gemma3", prompt="the quick brown fox " * 2250, max_tokens=4)
        self.assertEqual(e.exception.code, "context_length_exceeded")
        self.assertIn("maximum context length is 2048 tokens", e.exception.message)
        with self.assertRaises(o.openai.BadRequestError) as e:  # prompt + max_tokens past the bound
            self.client.completions.create(model="gemma3", prompt="Hello", max_tokens=2047)
        self.assertIn("2048", e.exception.message)
        self.assertEqual(e.exception.param, "max_tokens")

    def test_template_said_at_start(self):
        self.assertIn("chats render with the gemma family (config chat_template)", self.srv.text())


class ServeFlags(unittest.TestCase):
    """Issue 45: -c split by -np (llama-server's slots) with a fixed --worker-port; any model name with one model
    served and the file's stem as the id; /tokenize's content; a GGUF without a chat template said at start-up."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)
        if not os.path.exists(u.GEMMA):
            raise unittest.SkipTest("the Gemma model is missing: run scripts/setup.sh")
        cls.dir = tempfile.mkdtemp(prefix="dserve-serve-flags-")
        cls.addClassCleanup(shutil.rmtree, cls.dir, True)
        cls.port, cls.wport = u.free_ports(2)
        # -c 1024 over 2 slots: 512 tokens each (llama-server's n_ctx_seq), a pool of 1024
        cls.srv = Launched(["serve", u.GEMMA, "--port", str(cls.port), "-t", "1", "-c", "1024", "-np", "2",
                            "--worker-port", str(cls.wport)], cls.dir)
        cls.addClassCleanup(cls.srv.stop)
        cls.srv.wait_ready()

    def test_ctx_split_among_slots(self):
        status, body = u.get(self.port, "/v1/models")
        m = json.loads(body)["data"][0]
        self.assertEqual((status, m["max_model_len"]), (200, 512), body)
        self.assertIn("64 KV blocks", self.srv.text())  # the pool holds both slots: 1024 / 16
        status, obj = u.post(self.port, "/v1/completions", {"prompt": "Hello there", "max_tokens": 511})
        self.assertEqual(status, 400, obj)
        self.assertEqual(obj["error"]["code"], "context_length_exceeded")
        self.assertIn("maximum context length is 512 tokens", obj["error"]["message"])

    def test_fixed_worker_port(self):
        self.assertIn("worker listening on 127.0.0.1:%d " % self.wport, self.srv.text())
        rc, out = run(["serve", u.GEMMA, "--port", str(u.free_ports(1)[0]), "--worker-port", str(self.wport)])
        self.assertEqual(rc, 2, out)
        self.assertIn("--worker-port %d: 127.0.0.1:%d is in use" % (self.wport, self.wport), out)
        self.assertNotIn("ready (router", out)

    def test_id_is_the_file_stem_and_any_name_is_it(self):
        status, body = u.get(self.port, "/v1/models")
        self.assertEqual(json.loads(body)["data"][0]["id"], "gemma-3-270m-q4_k_m")
        for name in ("gemma-3-270m-q4_k_m", "gpt-4o", "anything at all"):
            status, obj = u.post(self.port, "/v1/completions", {"model": name, "prompt": "Hello", "max_tokens": 2})
            self.assertEqual(status, 200, (name, obj))
            self.assertEqual(obj["model"], "gemma-3-270m-q4_k_m")

    def test_tokenize_content(self):
        a = u.post(self.port, "/tokenize", {"content": "Hello world"})
        b = u.post(self.port, "/tokenize", {"prompt": "Hello world"})
        self.assertEqual(a[0], 200, a)
        self.assertEqual(a[1]["tokens"], b[1]["tokens"])
        status, obj = u.post(self.port, "/tokenize", {"content": "a", "prompt": "a"})
        self.assertEqual((status, obj["error"]["param"]), (400, "content"), obj)
        status, obj = u.post(self.port, "/tokenize", {"content": "a", "messages": [{"role": "user", "content": "a"}]})
        self.assertEqual((status, obj["error"]["param"]), (400, "content"), obj)
        status, obj = u.post(self.port, "/tokenize", {"content": 5})
        self.assertEqual((status, obj["error"]["param"]), (400, "content"), obj)

    def test_no_template_said_and_how_to_fix(self):
        self.assertIn("chats: no template", self.srv.text())
        self.assertIn("chat requests get 400 model_not_chat", self.srv.text())
        status, obj = u.post(self.port, "/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}]})
        self.assertEqual((status, obj["error"]["code"]), (400, "model_not_chat"), obj)
        self.assertIn("--chat-template NAME", obj["error"]["message"])


class ServeReadmeExample(unittest.TestCase):
    """README's own request (its model name, the bundled SmolLM2) against `dserve serve` without --alias, and the
    template that renders it said at start-up."""

    def test_readme_request(self):
        u.require_env(self)
        d = tempfile.mkdtemp(prefix="dserve-serve-readme-")
        self.addCleanup(shutil.rmtree, d, True)
        port = u.free_ports(1)[0]
        srv = Launched(["serve", u.MODEL, "--port", str(port), "-t", "1", "-c", "1024"], d)
        self.addCleanup(srv.stop)
        srv.wait_ready()
        self.assertIn("chats render with the GGUF's tokenizer.chat_template (Jinja)", srv.text())
        status, obj = u.post(port, "/v1/chat/completions", {"model": "smollm2-135m-instruct", "max_tokens": 8,
                                                           "messages": [{"role": "user", "content": "Hello!"}]})
        self.assertEqual(status, 200, obj)
        self.assertTrue(obj["choices"][0]["message"]["content"])
        self.assertEqual(obj["model"], "SmolLM2-135M-Instruct.Q4_1")


class ServeErrors(unittest.TestCase):
    """Every bad command line is a non-zero exit with a message, quickly, and starts nothing."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)

    def check(self, argv, *needles):
        rc, out = run(argv)
        self.assertEqual(rc, 2, out)
        for n in needles:
            self.assertIn(n, out)
        self.assertNotIn("ready (router", out)

    def test_bad_lines(self):
        self.check(["serve"], "no model")
        self.check(["serve", "/no/such/model.gguf"], "/no/such/model.gguf", "cannot read the model")
        self.check(["serve", u.MODEL, "--port", "80x"], "--port", "expected an integer")
        self.check(["serve", u.MODEL, "--port", "70000"], "router.port")
        self.check(["serve", u.MODEL, "--threads", "0"], "workers[0].threads")
        self.check(["serve", u.MODEL, "--kv-type", "q9"], "workers[0].kv_type")
        self.check(["serve", u.MODEL, "--spec", "on"], "workers[0].spec", '"on" is not one of: auto, off')
        self.check(["serve", u.MODEL, "--no-such-flag"], "unknown option '--no-such-flag'")
        self.check(["serve", u.MODEL, "--port"], "--port needs a value")
        self.check(["serve", u.MODEL, "--worker-port", "0"], "--worker-port", "1..65535")
        self.check(["serve", u.MODEL, "-c", "-5"], "-c", "not a context")

    def test_hints_not_usage(self):
        """Issue 45: llama-server's flags dserve does not take get one line saying what to do, never the usage."""
        for argv, hint in [(["-ngl", "99"], "dserve has no layer offload: --device cuda puts the whole model on the GPU"),
                           (["--n-gpu-layers", "99"], "no layer offload"),
                           (["--jinja"], "--chat-template-file F"),
                           (["-fa", "on"], "flash attention is always on"),
                           (["--mlock"], "never locked"),
                           (["--embeddings"], "/v1/embeddings is always served"),
                           (["--kvxfer-port", "9000"], "no kvxfer port"),
                           (["--no-such-flag"], "unknown option '--no-such-flag'")]:
            for cmd in (["serve", u.MODEL], ["launch", "--config", "x.json", "--node", "local"]):
                rc, out = run(cmd + argv)
                if cmd[0] == "launch" and argv[0] == "--kvxfer-port":
                    continue  # serve's own
                self.assertEqual(rc, 2, (argv, out))
                self.assertIn(hint, out)
                self.assertIn("(see dserve %s --help)" % cmd[0], out)
                self.assertEqual(out.count("\n"), 1, out)  # one line, not the usage
        self.check(["launch", "--config", "/no/such.json", "--node", "local", "--port", "1"], "/no/such.json")

    def test_print_config(self):
        d = tempfile.mkdtemp(prefix="dserve-serve-")
        self.addCleanup(shutil.rmtree, d, True)
        rc, out = run(["serve", os.path.relpath(u.MODEL, d), "--print-config", "-np", "4", "--temp", "0.5",
                       "--spec", "off"], cwd=d)
        self.assertEqual(rc, 0, out)
        cfg = json.loads(out)
        self.assertEqual(os.path.realpath(cfg["model"]), os.path.realpath(u.MODEL))  # absolute: means the same anywhere
        self.assertTrue(cfg["model"].startswith("/"))
        self.assertEqual(cfg["workers"][0]["max_seqs"], 4)
        self.assertEqual(cfg["workers"][0]["spec"], "off")
        self.assertEqual(cfg["sampling"]["temperature"], 0.5)
        self.assertEqual(cfg["router"]["port"], 8080)
        # no -c: the model's context (8192), split among the -np slots as llama-server's n_ctx 0 is
        self.assertEqual((cfg["max_model_len"], cfg["workers"][0]["kv_budget_tokens"]), (2048, 8192))

    def test_ctx_as_llama_server(self):
        """-c is llama-server's context: split among explicit -np slots (each padded to 256), whole with a unified
        cache (--kv-unified, or no -np); the pool holds it."""
        for flags, bound, pool in [(["-c", "4096"], 4096, 4096), (["--ctx-size", "4096", "-np", "4"], 1024, 4096),
                                   (["-c", "4096", "-np", "3"], 1536, 4608), (["-c", "4096", "-np", "4", "-kvu"], 4096, 4096),
                                   (["-c", "1000"], 1024, 1024),
                                   (["-np", "4", "--kv-unified", "-no-kvu", "-c", "2048"], 512, 2048),
                                   (["-np", "3"], 2816, 8448), (["-c", "0", "-np", "2"], 4096, 8192)]:
            rc, out = run(["serve", u.MODEL, "--print-config"] + flags)
            self.assertEqual(rc, 0, out)
            cfg = json.loads(out)
            self.assertEqual((cfg["max_model_len"], cfg["workers"][0]["kv_budget_tokens"]), (bound, pool), flags)
        for flags in (["-np", "4", "-kvu"], []):  # a unified cache without -c: the model's context, the MiB pool
            rc, out = run(["serve", u.MODEL, "--print-config"] + flags)
            self.assertEqual(rc, 0, out)
            self.assertNotIn("max_model_len", json.loads(out), flags)
        # launch: the same flags over a config's every worker
        rc, out = run(["launch", "--config", os.path.join(u.SOURCE_DIR, "configs", "1p1d.json"), "--print-config",
                       "-c", "8192", "-np", "2"])
        self.assertEqual(rc, 0, out)
        cfg = json.loads(out)
        self.assertEqual(cfg["max_model_len"], 4096)
        self.assertEqual({w["kv_budget_tokens"] for w in cfg["workers"]}, {8192})
        # launch -np without -c: the config's model's context (SmolLM2's 8192), split as serve's
        rc, out = run(["launch", "--config", os.path.join(u.SOURCE_DIR, "configs", "1p1d.json"), "--print-config",
                       "-np", "4"])
        self.assertEqual(rc, 0, out)
        cfg = json.loads(out)
        self.assertEqual(cfg["max_model_len"], 2048)
        self.assertEqual({w["kv_budget_tokens"] for w in cfg["workers"]}, {8192})


class LaunchOverrides(unittest.TestCase):
    """A config copied elsewhere keeps meaning its own folder's paths; flags override it for this launch only."""

    @classmethod
    def setUpClass(cls):
        u.require_env(cls)

    def test_copied_config_with_overrides(self):
        d = tempfile.mkdtemp(prefix="dserve-launch-ovr-")
        self.addCleanup(shutil.rmtree, d, True)
        os.makedirs(os.path.join(d, "conf"))
        os.symlink(os.path.dirname(u.MODEL), os.path.join(d, "weights"))
        wport, rport = u.free_ports(2)
        cfg = {"model": "../weights/" + os.path.basename(u.MODEL),  # against conf/, not the working directory
               "router": {"port": 1}, "workers": [{"name": "w0", "role": "both", "port": wport, "threads": 2}]}
        path = os.path.join(d, "conf", "c.json")
        with open(path, "w") as f:
            json.dump(cfg, f)
        os.makedirs(os.path.join(d, "elsewhere"))
        srv = Launched(["launch", "--config", "../conf/c.json", "--node", "local", "--port", str(rport), "-t", "1",
                        "--grace-s", "5"], os.path.join(d, "elsewhere"))
        self.addCleanup(srv.stop)
        srv.wait_ready()
        self.assertIn("http://127.0.0.1:%d" % rport, srv.text())
        self.assertIn("1 threads", srv.text())
        status, body = u.post(rport, "/v1/completions", {"prompt": "Hello", "max_tokens": 4, "temperature": 0})
        self.assertEqual(status, 200, body)
        with open(path) as f:
            self.assertEqual(json.load(f), cfg)  # the file itself is untouched


class CliHelp(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        u.require_env(cls)

    def test_version_everywhere(self):
        rc, out = run(["--version"])
        self.assertEqual(rc, 0, out)
        self.assertRegex(out, r"^dserve \d+\.\d+\.\d+ ")
        for c in CMDS:
            rc2, out2 = run([c, "--version"])
            self.assertEqual((rc2, out2), (rc, out), c)

    def test_every_subcommand_answers_help(self):
        for c in CMDS:
            rc, out = run([c, "--help"])
            self.assertEqual(rc, 0, "%s: %s" % (c, out))
            self.assertIn("usage: dserve " + c, out)
            self.assertNotIn("unknown", out)


if __name__ == "__main__":
    unittest.main()
