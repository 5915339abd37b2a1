"""Overlong shaping (DAPO's soft overlong punishment).

No penalty up to `max_tokens - buffer` completion tokens, then a linear penalty reaching -1 at
`max_tokens`; a completion at or past the limit (truncated) gets -1.
"""

from __future__ import annotations


def overlong_penalty(n_tokens: int, max_tokens: int, buffer: int) -> float:
    if buffer <= 0 or max_tokens <= 0:
        raise ValueError(f"need max_tokens > 0 and buffer > 0, got {max_tokens}, {buffer}")
    start = max_tokens - buffer
    if n_tokens <= start:
        return 0.0
    return -min(1.0, (n_tokens - start) / buffer)


def overlong_reward(
    prompts: list[str],
    completions: list[str],
    completion_tokens: list[int],
    max_tokens: int = 200,
    buffer: int = 40,
    **_: object,
) -> list[float | None]:
    return [overlong_penalty(n, max_tokens, buffer) for n in completion_tokens]
