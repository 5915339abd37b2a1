"""Micro-batches: a step's rows in groups of bounded size, their gradients accumulated into one
update, so that a step's memory is set by `engine.micro_batch_tokens`, not by the step's size.

The loss of a micro-batch is its rows' share of the whole step's loss (each trainer divides by
the step's denominator, summed over the ranks), so the accumulated gradient is the one-pass
gradient. Data-parallel ranks must run the same number of forward and backward passes (ZeRO
reduces gradients at every backward, ZeRO-3 gathers parameters at every forward): a rank with
fewer micro-batches runs the difference at zero weight (`padded_plan`).
"""

from __future__ import annotations

from collections.abc import Sequence

from training.collective import Collective


def micro_batches(lengths: Sequence[int], budget: int) -> list[list[int]]:
    """Consecutive row indices grouped so that each group's tokens stay within `budget`; a row
    longer than the budget is a group of its own. [] for no rows."""
    groups: list[list[int]] = []
    size = 0
    for row, length in enumerate(lengths):
        if groups and size + length <= budget:
            groups[-1].append(row)
            size += length
        else:
            groups.append([row])
            size = length
    return groups


def padded_plan(groups: list[list[int]], collective: Collective) -> tuple[list[list[int]], int]:
    """`groups`, and how many zero-weight passes this rank adds so that every rank runs as many
    micro-batches as the rank with the most."""
    most = int(collective.max([float(len(groups))])[0])
    return groups, most - len(groups)
