"""The Prefect server `r1 run` reports to when `PREFECT_API_URL` names one: said before the run
starts, and refused in one line when nothing answers there.

Prefect reads `PREFECT_API_URL` from the environment, from a `.env` file in the working folder,
and from its profile or a `prefect.toml` there: a shell set up for other work, or an address the
stack of `scripts/serve.sh` left behind after `serve.sh stop`, sends the run to a server the user
may not know is named. With nothing answering, the flow's first call failed after about 10 s
with `RuntimeError: Failed to reach API at ...`, which names neither the setting nor where it
was set.
"""

from __future__ import annotations

import os
from pathlib import Path

ENV_FILE = ".env"  # the file Prefect's settings read in the working folder
ANSWER_SECONDS = 5.0  # how long the check waits for the server to answer


class PrefectApiUnreachable(RuntimeError):
    """Nothing answers at the Prefect API `PREFECT_API_URL` names; the message says what to do."""


def configured_api_url() -> str | None:
    """The Prefect API this process would report to, as Prefect's settings read it (None: a
    temporary server of its own)."""
    from prefect.settings import PREFECT_API_URL

    return PREFECT_API_URL.value() or None


def api_url_origin(cwd: Path | None = None) -> tuple[str, str]:
    """Where `PREFECT_API_URL` was set, in the order Prefect's settings read it, and how to take
    it away."""
    if os.environ.get("PREFECT_API_URL"):
        return "set in the environment", "unset PREFECT_API_URL"
    env_file = (cwd or Path.cwd()) / ENV_FILE
    if env_file.is_file() and "PREFECT_API_URL" in env_file.read_text(errors="replace"):
        return f"set in {env_file}", f"take PREFECT_API_URL out of {env_file}"
    return (
        "set in Prefect's profile or a prefect.toml",
        "take it out of them (prefect config unset PREFECT_API_URL, for the profile)",
    )


def check_api_answers(url: str, timeout: float = ANSWER_SECONDS) -> None:
    """Raise PrefectApiUnreachable, naming the setting, where it was set and what to do, when no
    server answers at `url`. Any HTTP answer passes: what the server says to the run's requests
    (a key it wants, a version it refuses) is Prefect's to tell."""
    import httpx

    try:
        httpx.get(f"{url.rstrip('/')}/health", timeout=timeout)
    except httpx.TransportError as error:
        where, drop = api_url_origin()
        raise PrefectApiUnreachable(
            f"PREFECT_API_URL={url} ({where}), and no Prefect server answers there "
            f"({type(error).__name__}: {error}): start that server (this project's stack: "
            f"bash scripts/serve.sh), or {drop} to run on a temporary server of the run's own"
        ) from None


def reported_to() -> str | None:
    """The line saying which Prefect server the run reports to, when `PREFECT_API_URL` names one;
    raises PrefectApiUnreachable when nothing answers there."""
    url = configured_api_url()
    if url is None:
        return None
    check_api_answers(url)
    return (
        f"prefect: the flow run reports to the Prefect server at {url} "
        f"(PREFECT_API_URL, {api_url_origin()[0]})"
    )
