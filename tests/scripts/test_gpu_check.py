"""tests/scripts/test_gpu_check.py: scripts/gpu-check.sh fails loudly, or exits 3, where CUDA sees no GPU, and judges ctest logs (skips count once and fail); runs without a GPU, builds only the one-file probe."""

import os
import shutil
import subprocess
import tempfile
import unittest

ROOT = os.environ.get("DSERVE_SOURCE_DIR") or os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..")
SCRIPT = os.path.join(ROOT, "scripts", "gpu-check.sh")

# One result line per test, as ctest prints them, and its closing list (which must not count a skip again).
PASS = " 1/3 Test #31: CudaTest.AllocUploadDownload ..................   Passed    0.21 sec\n"
SKIP = (" 2/3 Test #32: CudaTest.MatmulMatchesReference ..............***Skipped   0.01 sec\n"
        " 3/3 Test #33: CudaAttn.Prefill .............................***Skipped   0.00 sec\n")
FAIL = " 2/2 Test #34: CudaTest.RopeMatchesReference ................***Failed    0.30 sec\n"
TAIL_SKIPPED = ("\nThe following tests did not run:\n\t 32 - CudaTest.MatmulMatchesReference (Skipped)\n"
                "\t 33 - CudaAttn.Prefill (Skipped)\n")


class GpuCheck(unittest.TestCase):
    def setUp(self):
        self.tmp = tempfile.mkdtemp(prefix="gpucheck-")
        self.addCleanup(shutil.rmtree, self.tmp, True)

    def fake_smi(self, out, rc):
        """A stand-in nvidia-smi that prints out for -L and exits rc."""
        path = os.path.join(self.tmp, "nvidia-smi")
        with open(path, "w") as f:
            f.write("#!/bin/sh\ncat <<'X'\n%sX\nexit %d\n" % (out, rc))
        os.chmod(path, 0o755)
        return path

    def run_check(self, *args, smi=None, hide_cuda=True, env_extra=None):
        env = dict(os.environ, GPU_CHECK_LOGS=os.path.join(self.tmp, "logs"), BUILD_DIR=os.path.join(self.tmp, "build"))
        env.pop("CUDA_VISIBLE_DEVICES", None)
        env.pop("GPU_CHECK_PROBE", None)
        env.update(env_extra or {})
        env["NVIDIA_SMI"] = smi or os.path.join(self.tmp, "no-such-nvidia-smi")
        if hide_cuda:
            env["CUDA_VISIBLE_DEVICES"] = "-1"  # the CUDA runtime sees no device here, also on a machine with one
        p = subprocess.run(["bash", SCRIPT, *args], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=120)
        return p.returncode, p.stdout.decode(errors="replace")

    def verdict(self, text):
        log = os.path.join(self.tmp, "ctest.log")
        with open(log, "w") as f:
            f.write(text)
        return self.run_check("--ctest-verdict", log)

    def test_gpu_listed_but_unusable_fails_loudly(self):
        smi = self.fake_smi("GPU 0: NVIDIA H200 (UUID: GPU-0000)\n", 0)
        for args in (("--probe-only",), ()):
            rc, out = self.run_check(*args, smi=smi)
            self.assertEqual(rc, 1, out)
            self.assertIn("FAILED: device: nvidia-smi lists 1 GPU(s) but the CUDA runtime can use none", out)
            self.assertIn("CUDA_VISIBLE_DEVICES is set to '-1'", out)
            self.assertFalse(os.path.exists(os.path.join(self.tmp, "build")), "it built before checking the device")

    def test_no_gpu_exits_3(self):
        for smi in (None, self.fake_smi("No devices were found\n", 6)):
            for args in (("--probe-only",), ()):
                rc, out = self.run_check(*args, smi=smi)
                self.assertEqual(rc, 3, out)
                self.assertIn("no GPU on this machine", out)
                self.assertIn("nothing measured", out)
                self.assertFalse(os.path.exists(os.path.join(self.tmp, "build")))

    def test_driver_unreachable_fails(self):
        smi = self.fake_smi("NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n", 9)
        rc, out = self.run_check("--probe-only", smi=smi)
        self.assertEqual(rc, 1, out)
        self.assertIn("FAILED: device", out)
        self.assertIn("couldn't communicate with the NVIDIA driver", out)

    def fake_probe(self, n):
        """A stand-in for the CUDA probe (GPU_CHECK_PROBE) that reports n usable devices."""
        path = os.path.join(self.tmp, "probe")
        with open(path, "w") as f:
            f.write("#!/bin/sh\necho 'cuda devices %d'\n" % n)
            for i in range(n):
                f.write("echo 'cuda device %d: NVIDIA H200, sm_90, bus 0000:0%d:00.0'\n" % (i, i))
        os.chmod(path, 0o755)
        return path

    def test_fewer_gpus_than_listed_fails_unless_hidden_on_purpose(self):
        smi = self.fake_smi("GPU 0: NVIDIA H200 (UUID: GPU-0)\nGPU 1: NVIDIA H200 (UUID: GPU-1)\n", 0)
        probe = {"GPU_CHECK_PROBE": self.fake_probe(1)}
        rc, out = self.run_check("--probe-only", smi=smi, hide_cuda=False, env_extra=probe)
        self.assertEqual(rc, 1, out)
        self.assertIn("nvidia-smi lists 2 GPU(s) but the CUDA runtime can use 1", out)
        rc, out = self.run_check("--probe-only", smi=smi, hide_cuda=False, env_extra=dict(probe, CUDA_VISIBLE_DEVICES="0"))
        self.assertEqual(rc, 0, out)
        self.assertIn("CUDA uses 1 of the 2 GPU(s) nvidia-smi lists (CUDA_VISIBLE_DEVICES='0')", out)
        self.assertIn("probe only: CUDA can use 1 GPU(s)", out)

    def test_skips_fail_and_count_once(self):
        rc, out = self.verdict("Test project /b\n" + PASS + SKIP + TAIL_SKIPPED)
        self.assertEqual(rc, 1, out)
        self.assertIn("3 gpu tests: 1 passed, 0 failed, 2 skipped", out)
        self.assertIn("not passed: CudaTest.MatmulMatchesReference", out)
        self.assertIn("not passed: CudaAttn.Prefill", out)

    def test_failure_and_nothing_run_fail(self):
        rc, out = self.verdict(PASS.replace(" 1/3", " 1/2") + FAIL)
        self.assertEqual(rc, 1, out)
        self.assertIn("2 gpu tests: 1 passed, 1 failed, 0 skipped", out)
        rc, out = self.verdict("Test project /b\nNo tests were found!!!\n")
        self.assertEqual(rc, 1, out)
        self.assertIn("no gpu test ran", out)

    def test_all_passed(self):
        rc, out = self.verdict(PASS.replace(" 1/3", " 1/1") + "\n100% tests passed, 0 tests failed out of 1\n")
        self.assertEqual(rc, 0, out)
        self.assertIn("1 gpu tests: 1 passed, 0 failed, 0 skipped", out)

    def test_bad_usage(self):
        for args in (("--nope",), ("--ctest-verdict",), ("--ctest-verdict", "/no/such/log"), ("--probe-only", "x")):
            rc, out = self.run_check(*args)
            self.assertEqual(rc, 2, (args, out))
            self.assertIn("usage", out)


if __name__ == "__main__":
    unittest.main()
