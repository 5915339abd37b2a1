"""Writing systems: which script a text is in, and the tiny world's second language.

Language consistency is measured by script (the share of letters in the prompt's script), the
same signal DeepSeek-R1 uses for its Chinese/English mixing. The tiny world's second language is
English written in Greek letters: a different script with the same grammar, so a model can mix
the two mid-sentence just as R1-Zero mixes languages.
"""

from __future__ import annotations

import re
import unicodedata
from collections import Counter
from functools import lru_cache

_LATIN = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ"
_GREEK = "αβψδεφγηιξκλμνοπϙρστθϝωχυζΑΒΨΔΕΦΓΗΙΞΚΛΜΝΟΠϘΡΣΤΘϜΩΧΥΖ"
_TO_GREEK = str.maketrans(_LATIN, _GREEK)
_TO_LATIN = str.maketrans(_GREEK, _LATIN)
# The format's own tags and LaTeX's math commands are ASCII whatever the language; any other
# tag or command name counts as letters, so that words cannot hide in markup.
_TAGS = re.compile(r"</?(?:think|answer)>")
_COMMAND = re.compile(r"\\([a-zA-Z]+)")
MATH_COMMANDS = frozenset(
    """frac dfrac tfrac sqrt cdot times div pm mp le leq ge geq ne neq approx equiv sim propto
    left right big Big bigg Bigg sum prod int oint lim infty partial nabla cdots ldots dots
    boxed text mathrm mathbf mathit mathbb mathcal operatorname quad qquad sin cos tan cot
    sec csc arcsin arccos arctan sinh cosh tanh log ln exp min max gcd lcm mod bmod pmod
    binom choose alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota
    kappa lambda mu nu xi pi varpi rho sigma tau upsilon phi varphi chi psi omega Gamma
    Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega in notin subset subseteq supset cup
    cap emptyset forall exists neg land lor to rightarrow leftarrow Rightarrow
    Leftrightarrow implies iff mid circ angle triangle perp parallel overline underline hat
    bar vec dot ddot tilde begin end displaystyle
    """.split()  # noqa: SIM905 - a word list reads best as words
)

SCRIPTS = ("latin", "greek")


def to_script(text: str, script: str) -> str:
    """Render tiny-world text in `script` ("latin" leaves it as is)."""
    if script == "latin":
        return text
    if script == "greek":
        return text.translate(_TO_GREEK)
    raise ValueError(f"unknown script {script!r}; expected one of {SCRIPTS}")


def to_latin(text: str) -> str:
    """Tiny-world text in Latin letters, whichever script it was rendered in."""
    return text.translate(_TO_LATIN)


def char_script(ch: str) -> str | None:
    """Script of one letter, from its Unicode name ("LATIN SMALL LETTER A" -> "latin")."""
    if not ch.isalpha():
        return None
    name = unicodedata.name(ch, "")
    return name.split(" ", 1)[0].lower() if name else None


@lru_cache(maxsize=1 << 14)
def _known_char_script(ch: str) -> str | None:
    """`char_script`, remembered: a data set's texts share a few hundred characters, and a
    Unicode name looked up for each of each text's distinct letters was most of the time a
    100,000-row file took to load."""
    return char_script(ch)


def strip_markup(text: str) -> str:
    """Drop the format's tags and LaTeX math commands (MATH_COMMANDS), which are ASCII whatever
    the language; other markup stays, and its letters count."""
    text = _TAGS.sub(" ", text)
    return _COMMAND.sub(lambda m: " " if m.group(1) in MATH_COMMANDS else m.group(0), text)


def script_counts(text: str) -> Counter[str]:
    """Letters per script in `text`, markup aside."""
    counts: Counter[str] = Counter()
    # each distinct character's script looked up once a text, and remembered across texts
    for ch, n in Counter(strip_markup(text)).items():
        script = _known_char_script(ch)
        if script:
            counts[script] += n
    return counts


@lru_cache(maxsize=1)
def _script_names() -> frozenset[str]:
    letters = (chr(code) for code in range(0x30000))
    return frozenset(filter(None, map(char_script, letters)))


def is_script(name: str) -> bool:
    """Whether `name` is a script `char_script` can tell ("latin", "cjk", "cyrillic"), not a
    language's code ("en", "zh") or name."""
    return name in _script_names()


def dominant_script(text: str, default: str = "latin") -> str:
    counts = script_counts(text)
    return counts.most_common(1)[0][0] if counts else default


def script_share(text: str, script: str) -> float:
    """Share of the letters of `text` (markup aside) written in `script`; 1.0 with no letters."""
    counts = script_counts(text)
    total = sum(counts.values())
    return counts[script] / total if total else 1.0
