"""Progress bars where a person watches: on a terminal, not in a log file."""

from __future__ import annotations

from typing import Any

from tqdm.auto import tqdm


def progress_bar(shown: bool = True, **kwargs: Any) -> tqdm:
    """A tqdm bar drawn only when its stream is a terminal (and `shown`). In a log file a bar's
    redraws are fragments that the log's own lines land on; there the progress lines the stages
    log every tenth of their steps say how far they are."""
    return tqdm(disable=None if shown else True, **kwargs)
