"""tests/e2e/test_tools_1p1d.py: test_tools.py's checks against a 1P1D cluster (its own module, so each cluster gets its own ctest entry and time bound)."""

import unittest

import test_tools as t  # re-executes under the test venv's python when the openai package is missing here


class OneP1D(t.Tools, unittest.TestCase):
    """The prefill worker samples the first token under the call grammar; the decode worker replays it and goes on."""

    @classmethod
    def setUpClass(cls):
        t.start(cls, [{"name": "p0", "role": "prefill"}, {"name": "d0", "role": "decode", "max_seqs": 8}], 0,
                "tools-1p1d", extra=t.CHATML)


if __name__ == "__main__":
    unittest.main()
