"""Prefect flows: they compose tasks and hold no logic. A flow module imports only what its
signature names; its stages' code loads when the flow runs (`prefect deploy` imports each module
for its signature: tests/flows/test_flow_modules.py)."""


def load_stage_code() -> None:
    """Import every module of `tasks`, and so the stages' libraries: `r1 run` does it while its
    Prefect server comes up, which a flow's own imports, made as it runs, would come after."""
    import importlib
    import pkgutil

    import tasks

    for module in pkgutil.iter_modules(tasks.__path__):
        importlib.import_module(f"tasks.{module.name}")


def deployment_run() -> bool:
    """Whether the flow running now is a deployment's run (`prefect deployment run`, a
    schedule), whose parameters come as JSON, rather than a call in this process (`r1 run`)."""
    from prefect.context import FlowRunContext

    context = FlowRunContext.get()
    flow_run = context.flow_run if context is not None else None
    return flow_run is not None and flow_run.deployment_id is not None
