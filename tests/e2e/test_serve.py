"""tests/e2e/test_serve.py: a llama-server user's first hour (issue 33): `dserve serve MODEL.gguf` with the flags they know and no config file, answered by the official openai client; `dserve launch` overrides on a copied config; --version and every subcommand's --help."""

import json
import os
import shutil
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
        self.check(["serve", u.MODEL, "--no-such-flag"], "unknown or incomplete option '--no-such-flag'")
        self.check(["serve", u.MODEL, "--port"], "--port needs a value")
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
