"""bench/ppl_figures.py: the figures bench/ppl.sh and bench/accuracy.sh read out of dserve perplexity's and
llama-perplexity's outputs, which print them in the same words (dserve copies llama-perplexity's summary)."""
import re
import sys

PATTERNS = {
    "ppl": r"Final estimate: PPL = ([0-9.]+)",        # a plain run, and dserve's --kl-base run
    "ppl_q": r"Mean PPL\(Q\) +: +([0-9.]+)",           # llama-perplexity --kl-divergence (it prints no estimate)
    "kld": r"Mean +KLD: +(-?[0-9.]+)",
    "kld_err": r"Mean +KLD: +-?[0-9.]+ ± +([0-9.]+)",
    "p99": r"99\.0% +KLD: +(-?[0-9.]+)",
    "top": r"Same top p: +([0-9.]+)",
}

LABELS = {"SmolLM2-135M-Instruct.Q4_1.gguf": "SmolLM2-135M Q4_1", "gemma-3-270m-q4_k_m.gguf": "Gemma-3-270M Q4_K_M"}


def figure(what, out):
    m = re.search(PATTERNS[what], out)
    if not m:
        sys.exit(f"ppl_figures: no match for {what} ({PATTERNS[what]!r})")
    return float(m.group(1))


def tokens(out):  # dserve --kl-base --file: does its tokenization of the text give the base file's tokens?
    return "agree" if re.search(r"^tokens: the first \d+ tokens .* agree", out, re.M) else "DIFFER"

