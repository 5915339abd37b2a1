"""The tiny world: each family's problems drawn from its own seeded stream, split into training
and held-out problems that never share a problem (by key)."""

from __future__ import annotations

import random
from collections.abc import Iterator
from itertools import islice

from configs.data import WorldConfig
from problems.functions import draw_function_tasks
from problems.generators import draw_problems
from problems.puzzles import draw_puzzles
from problems.types import Problem

# Each family's seed offset: adding or leaving out a family keeps the others' problems.
_OFFSETS = {"math": 0, "code": 101, "logic": 202}


def family_streams(spec: WorldConfig) -> list[tuple[str, Iterator[Problem], int, int]]:
    """(family, stream, training count, held-out count) per family in the world."""
    share = spec.second_script_share
    streams = []
    if spec.math is not None:
        stream = draw_problems(spec.math, spec.seed, share)
        streams.append(("math", stream, spec.math.n_train, spec.math.n_heldout))
    if spec.code is not None:
        stream = draw_function_tasks(spec.code, spec.seed + _OFFSETS["code"], share)
        streams.append(("code", stream, spec.code.n_train, spec.code.n_heldout))
    if spec.logic is not None:
        stream = draw_puzzles(spec.logic, spec.seed + _OFFSETS["logic"], share)
        streams.append(("logic", stream, spec.logic.n_train, spec.logic.n_heldout))
    return streams


def split_world(spec: WorldConfig) -> tuple[list[Problem], list[Problem]]:
    """Training and held-out problems of every family, each list shuffled (seeded)."""
    train: list[Problem] = []
    heldout: list[Problem] = []
    for family, stream, n_train, n_heldout in family_streams(spec):
        drawn = list(islice(stream, n_train + n_heldout))
        random.Random(spec.seed + 1 + _OFFSETS[family]).shuffle(drawn)
        heldout += drawn[:n_heldout]
        train += drawn[n_heldout:]
    random.Random(spec.seed + 1).shuffle(train)
    random.Random(spec.seed + 2).shuffle(heldout)
    return train, heldout
