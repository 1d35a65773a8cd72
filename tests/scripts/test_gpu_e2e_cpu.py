"""tests/scripts/test_gpu_e2e_cpu.py: scripts/gpu_e2e.py (gpu-check's end-to-end stage) runs its cases with every worker on the cpu (--device cpu) and passes, on a copy of the model cut to 4 layers by scripts/gguf_truncate.py (the model it carries to a GPU machine without network)."""

import os
import shutil
import subprocess
import sys
import tempfile
import unittest

ROOT = os.environ.get("DSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
MODEL = os.path.join(ROOT, "models", "weights", "SmolLM2-135M-Instruct.Q4_1.gguf")
DSERVE = os.environ.get("DSERVE_BINARY", "")


class GpuE2eOnCpu(unittest.TestCase):
    @classmethod
    def setUpClass(cls):
        if not DSERVE or not os.access(DSERVE, os.X_OK):
            raise unittest.SkipTest("DSERVE_BINARY is not set to an executable (run through ctest)")
        if not os.path.exists(MODEL):
            raise unittest.SkipTest("the model %s is missing: run scripts/setup.sh" % MODEL)
        cls.tmp = tempfile.mkdtemp(prefix="gpue2e-")
        cls.addClassCleanup(shutil.rmtree, cls.tmp, True)
        cls.small = os.path.join(cls.tmp, "smol4.gguf")
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gguf_truncate.py"), MODEL, "4", cls.small],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120)
        assert p.returncode == 0, p.stdout

    def test_truncated_model_is_small_and_loads(self):
        self.assertLess(os.path.getsize(self.small), 48 << 20)  # carried to a GPU machine in the 64 MiB allowance
        p = subprocess.run([DSERVE, "inspect", self.small], stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
        self.assertEqual(p.returncode, 0, p.stdout)
        self.assertRegex(p.stdout.decode(), r"block count +4\n")

    def test_truncate_refuses_bad_input(self):
        script = os.path.join(ROOT, "scripts", "gguf_truncate.py")
        for args, rc in (([MODEL, "0", "x"], 2), ([MODEL, "99", os.path.join(self.tmp, "x")], 1),
                         ([__file__, "2", os.path.join(self.tmp, "y")], 1)):
            p = subprocess.run([sys.executable, script, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
            self.assertEqual(p.returncode, rc, p.stdout)
            self.assertIn(b"gguf_truncate", p.stdout)

    def test_stage_passes_on_cpu(self):
        p = subprocess.run([sys.executable, os.path.join(ROOT, "scripts", "gpu_e2e.py"), "--dserve", DSERVE,
                            "--model", self.small, "--device", "cpu", "--nccl", "0"],
                           stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=600)
        out = p.stdout.decode(errors="replace")
        self.assertEqual(p.returncode, 0, out)
        self.assertIn("e2e: NOT RUN: 1P1D over nccl: this build has no NCCL", out)
        self.assertRegex(out, r"e2e: 1P1D cpu -> cpu, tcp \+ host staging: ok, (\d+)/\1 tokens")
        self.assertRegex(out, r"e2e: cpu prefill -> cpu decode, tcp \+ host staging: ok, (\d+)/\1 tokens")
        self.assertIn("e2e summary: ", out)


if __name__ == "__main__":
    unittest.main()
