"""Graders declared in YAML with OpenAI's grader keys, usable as rewards (docs/graders.md)."""

from graders.base import Grader, Outcome, make_sample, passed
from graders.build import build_grader, load_grader
from graders.reward import GraderReward, grader_reward
from graders.spec import GraderFileError, load_spec

__all__ = [
    "Grader",
    "GraderFileError",
    "GraderReward",
    "Outcome",
    "build_grader",
    "grader_reward",
    "load_grader",
    "load_spec",
    "make_sample",
    "passed",
]
