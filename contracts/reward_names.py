"""The reward names a config may use. `rewards.registry` provides a function for each and checks
at import that it provides exactly these; configs check names against this list without loading
any reward."""

from __future__ import annotations

# Rule rewards: pure functions of the completion and its problem's columns.
RULE_REWARDS = (
    "accuracy",
    "countdown",
    "format",
    "tag_count",
    "language",
    "overlong",
    "repetition",
)
# Rewards built from their params when a config's rewards are built.
BUILT_REWARDS = ("grader", "code")
# Verifiers with a hole planted on purpose (rewards/holes.py), which `faults.hacks` swaps in for
# the honest ones to show the RL guard catching a policy that exploits them.
HOLED_REWARDS = {"accuracy_digits": "accuracy", "code_trusts_ok": "code"}  # -> the honest one
# Rewards that need a trained model, which only exists at run time: the stage that has it
# supplies the function.
PREFERENCE = "preference"
RUNTIME_REWARDS = {PREFERENCE: "the reward model's score (where general data trains one)"}
# The columns a GRPO stage passes every reward beside the prompts and completions
# (rl/scoring.py), by which a grader file's `{{ item.<column> }}` is checked when it loads.
REWARD_COLUMNS = ("answer", "language", "kind", "family", "tests", "numbers", "completion_tokens")
# Of those, the columns whose value is a list (of text, of numbers): `{{ item.tests.0 }}` reads
# an element; every other column holds one value, with nothing to read inside it.
LIST_COLUMNS = ("tests", "numbers")


def known_rewards() -> list[str]:
    return sorted([*RULE_REWARDS, *BUILT_REWARDS, *HOLED_REWARDS, *RUNTIME_REWARDS])
