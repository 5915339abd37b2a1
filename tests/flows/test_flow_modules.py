"""The flow modules load light: `prefect deploy` (scripts/serve.sh, every start of the stack)
imports each for its signature alone, and a module that loaded its stages' libraries made that
18 s of a 34 s start on 2 cores. Their signatures still resolve whole: the deployments'
parameter schemas name the profile's model."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

from prefect.utilities.callables import parameter_schema

ROOT = Path(__file__).resolve().parents[2]
FLOW_MODULES = ("flows.r1_pipeline", "flows.distill", "flows.r1_zero", "flows.evaluate_registered")
HEAVY = ("torch", "transformers", "mlflow", "deepspeed", "datasets", "duckdb", "ray", "pyarrow")


def test_importing_every_flow_module_loads_none_of_the_stages_libraries():
    script = (
        f"import importlib, json, sys\n"
        f"for name in {FLOW_MODULES!r}:\n"
        f"    importlib.import_module(name)\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.splitlines()[-1]) == []


def test_the_flows_parameter_schemas_name_the_profiles_model():
    """Prefect evaluates a flow's annotations for its schema and, where one does not resolve,
    falls back to their text: `config` would lose its model."""
    from flows.distill import distill
    from flows.r1_pipeline import r1_pipeline
    from flows.r1_zero import r1_zero

    for flow in (r1_pipeline, r1_zero, distill):
        schema = parameter_schema(flow).model_dump()
        assert schema["properties"]["config"]["anyOf"][0] == {
            "$ref": "#/definitions/PipelineConfig"
        }, flow.name
        assert "PipelineConfig" in schema["definitions"], flow.name
