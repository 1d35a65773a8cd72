"""tests/scripts/test_gpu_e2e_policy.py: the greedy-token tolerance policy of scripts/gpu_e2e.py (what gpu-check's end-to-end stage accepts), on made-up answers."""

import os
import sys
import unittest

sys.path.insert(0, os.path.join(os.environ.get("DSERVE_SOURCE_DIR") or
                                os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."), "scripts"))
import gpu_e2e  # noqa: E402


def ans(words, gaps=None):
    """An answer: (token, gap) pairs, every gap clear (3.0) unless given."""
    return [(w, (gaps or {}).get(i, 3.0)) for i, w in enumerate(words.split())]


class Policy(unittest.TestCase):
    ref = [ans("a b c d e f g h"), ans("one two three four", {2: 0.1})]

    def test_equal_answers_pass(self):
        ok, n, t, note = gpu_e2e.compare([list(x) for x in self.ref], self.ref, 0.5)
        self.assertTrue(ok, note)
        self.assertEqual((n, t), (12, 12))

    def test_divergence_at_a_near_tie_passes(self):
        got = [ans("a b c d e f g h"), ans("one two THREE x")]
        ok, n, t, note = gpu_e2e.compare(got, self.ref, 0.5)
        self.assertTrue(ok, note)
        self.assertEqual(n, 10)
        self.assertIn("near tie (gap 0.100 < 0.50)", note)
        # the same divergence under the tighter tolerance between GPU runs is a failure
        ok, _, _, note = gpu_e2e.compare(got, self.ref, 0.05)
        self.assertFalse(ok)
        self.assertIn("NOT a near tie", note)

    def test_clear_divergence_fails(self):
        got = [ans("a b X d e f g h"), ans("one two three four")]
        ok, _, _, note = gpu_e2e.compare(got, self.ref, 0.5)
        self.assertFalse(ok)
        self.assertIn("answer 0 differs at token 2 ('X' instead of 'c', gap 3.000): NOT a near tie", note)

    def test_length_difference_fails(self):
        got = [ans("a b c d e f g"), ans("one two three four extra")]
        ok, _, _, note = gpu_e2e.compare(got, self.ref, 0.5)
        self.assertFalse(ok)
        self.assertIn("its end", note)

    def test_early_near_ties_cannot_make_it_vacuous(self):
        ref = [ans("a b c d e f g h", {0: 0.01}), ans("one two three four", {0: 0.01})]
        got = [ans("x b c d e f g h"), ans("y two three four")]
        ok, n, t, note = gpu_e2e.compare(got, ref, 0.5)
        self.assertFalse(ok)
        self.assertEqual(n, 0)
        self.assertIn("only 0 of 12 tokens compared", note)


if __name__ == "__main__":
    unittest.main()
