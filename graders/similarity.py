"""Text similarity metrics, pure Python: fuzzy match, BLEU, GLEU, ROUGE-N and ROUGE-L.

Every metric returns a float in [0, 1] for a candidate text against one reference text.
- BLEU: sentence BLEU up to 4-grams with uniform weights and the brevity penalty; orders the
  candidate is too short to have are left out (effective order), and an order with no match
  counts as 1 / (2^k * total), k counting such orders so far (the "exp" smoothing sacreBLEU uses
  for sentences). Tokens: words and single punctuation marks, case kept.
- GLEU: Google's sentence GLEU, min(precision, recall) over all 1- to 4-grams pooled.
- ROUGE-N / ROUGE-L: F1 of n-gram overlap / of the longest common subsequence, on lower-cased
  word tokens.
- fuzzy match: rapidfuzz's `fuzz.ratio` / 100, 2*LCS/T over characters, computed here exactly
  (bit-parallel LCS), so the score does not depend on whether rapidfuzz is installed.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from collections.abc import Callable, Sequence

_BLEU_TOKEN = re.compile(r"\w+|[^\w\s]")
_ROUGE_TOKEN = re.compile(r"\w+")


def bleu_tokens(text: str) -> list[str]:
    return _BLEU_TOKEN.findall(text)


def rouge_tokens(text: str) -> list[str]:
    return _ROUGE_TOKEN.findall(text.lower())


def ngrams(tokens: Sequence[str], n: int) -> Counter[tuple[str, ...]]:
    return Counter(tuple(tokens[i : i + n]) for i in range(len(tokens) - n + 1))


def overlap(candidate: Counter, reference: Counter) -> int:
    """Clipped matches: each candidate n-gram counts at most as often as the reference has it."""
    return sum((candidate & reference).values())


def bleu(candidate: str, reference: str, max_n: int = 4) -> float:
    """Sentence BLEU of `candidate` against `reference` (see the module notes)."""
    cand, ref = bleu_tokens(candidate), bleu_tokens(reference)
    if not cand or not ref:
        return 0.0
    log_sum, orders, zero_orders = 0.0, 0, 0
    for n in range(1, max_n + 1):
        total = len(cand) - n + 1
        if total <= 0:
            break
        matches = overlap(ngrams(cand, n), ngrams(ref, n))
        if matches == 0:
            zero_orders += 1
            precision = 1.0 / (2**zero_orders * total)
        else:
            precision = matches / total
        log_sum += math.log(precision)
        orders += 1
    penalty = 1.0 if len(cand) > len(ref) else math.exp(1 - len(ref) / len(cand))
    return penalty * math.exp(log_sum / orders)


def gleu(candidate: str, reference: str, max_n: int = 4) -> float:
    """Google sentence GLEU: matched n-grams over the larger of the two n-gram totals."""
    cand, ref = bleu_tokens(candidate), bleu_tokens(reference)
    matches = cand_total = ref_total = 0
    for n in range(1, max_n + 1):
        c, r = ngrams(cand, n), ngrams(ref, n)
        matches += overlap(c, r)
        cand_total += sum(c.values())
        ref_total += sum(r.values())
    denominator = max(cand_total, ref_total)
    return matches / denominator if denominator else 0.0


def f1(matches: int, cand_total: int, ref_total: int) -> float:
    if matches == 0 or cand_total == 0 or ref_total == 0:
        return 0.0
    precision, recall = matches / cand_total, matches / ref_total
    return 2 * precision * recall / (precision + recall)


def rouge_n(candidate: str, reference: str, n: int) -> float:
    """ROUGE-N F1: shared n-grams (clipped) against both texts' n-gram counts."""
    c, r = ngrams(rouge_tokens(candidate), n), ngrams(rouge_tokens(reference), n)
    return f1(overlap(c, r), sum(c.values()), sum(r.values()))


def lcs_length(a: Sequence[str], b: Sequence[str]) -> int:
    """Length of the longest common subsequence, in O(len(a) * len(b)) time, O(len(b)) space."""
    previous = [0] * (len(b) + 1)
    for x in a:
        current = [0]
        for j, y in enumerate(b):
            current.append(previous[j] + 1 if x == y else max(previous[j + 1], current[j]))
        previous = current
    return previous[-1]


def rouge_l(candidate: str, reference: str) -> float:
    """ROUGE-L F1: the longest common subsequence of word tokens against both lengths."""
    c, r = rouge_tokens(candidate), rouge_tokens(reference)
    return f1(lcs_length(c, r), len(c), len(r))


def char_lcs_length(a: str, b: str) -> int:
    """Longest common subsequence of two strings' characters, bit-parallel (Hyyro 2004, the
    algorithm rapidfuzz uses): one pass over `b` with big-int masks over `a`."""
    if not a or not b:
        return 0
    masks: dict[str, int] = {}
    for i, ch in enumerate(a):
        masks[ch] = masks.get(ch, 0) | (1 << i)
    full = (1 << len(a)) - 1
    row = full
    for ch in b:
        matches = row & masks.get(ch, 0)
        row = ((row + matches) | (row - matches)) & full
    return len(a) - bin(row).count("1")


def fuzzy_match(candidate: str, reference: str) -> float:
    """rapidfuzz's `fuzz.ratio` / 100: the normalized InDel similarity 2*LCS / (len_a + len_b)
    over characters; two empty strings match fully. (difflib's ratio is not this: its greedy
    matching blocks undercount reordered text, e.g. 0.42 for 'x = 3, y = 4' / 'y = 4, x = 3'
    where rapidfuzz gives 0.67.)"""
    total = len(candidate) + len(reference)
    if total == 0:
        return 1.0
    return 2 * char_lcs_length(candidate, reference) / total


METRICS: dict[str, Callable[[str, str], float]] = {
    "fuzzy_match": fuzzy_match,
    "bleu": bleu,
    "gleu": gleu,
    **{f"rouge_{n}": (lambda c, r, n=n: rouge_n(c, r, n)) for n in range(1, 6)},
    "rouge_l": rouge_l,
}

# Metrics OpenAI's text_similarity grader names that cannot run here, and why.
UNSUPPORTED_METRICS: dict[str, str] = {
    "cosine": "it needs an embedding model (use a score_model or python grader instead)",
    "meteor": "it needs WordNet synonyms and a stemmer, which are not shipped offline",
}
