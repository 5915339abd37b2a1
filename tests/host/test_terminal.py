"""Progress bars draw on a terminal and stay out of a log file, where the log's own lines would
land on a bar's fragments."""

from __future__ import annotations

import io

from host.terminal import progress_bar


class Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def drawn(stream: io.StringIO, shown: bool = True) -> str:
    bar = progress_bar(shown, total=3, desc="grpo", file=stream, mininterval=0)
    for _ in range(3):
        bar.update(1)
    bar.close()
    return stream.getvalue()


def test_a_bar_draws_on_a_terminal_and_not_in_a_file():
    assert "grpo" in drawn(Terminal())
    assert drawn(io.StringIO()) == ""
    assert drawn(Terminal(), shown=False) == ""
