"""`python -m cli.work_pools`, against a real Prefect server: the pools the deployments name are
made as `prefect work-pool create NAME --type process` makes them, and one that exists is left
as it is."""

from __future__ import annotations

import pytest

from cli.work_pools import ensure_pools, main

pytestmark = pytest.mark.usefixtures("prefect_server")


def test_missing_pools_are_made_as_process_pools_with_the_workers_template():
    from prefect import get_client
    from prefect.workers.process import ProcessWorker

    with get_client(sync_client=True) as client:
        assert ensure_pools(client, ["made-a", "made-b"]) == ["made-a", "made-b"]
        for name in ("made-a", "made-b"):
            pool = client.read_work_pool(name)
            assert pool.type == "process"
            assert pool.base_job_template == ProcessWorker.get_default_base_job_template()
        assert ensure_pools(client, ["made-a", "made-b"]) == []


def test_an_existing_pool_is_left_as_it_is(capsys):
    from prefect import get_client
    from prefect.client.schemas.actions import WorkPoolCreate

    with get_client(sync_client=True) as client:
        client.create_work_pool(WorkPoolCreate(name="kept", type="process", is_paused=True))
        assert main(["kept", "new-one"]) == 0
        assert client.read_work_pool("kept").is_paused  # not made again
        assert client.read_work_pool("new-one").type == "process"
    assert capsys.readouterr().out == "created the work pools new-one (process)\n"
