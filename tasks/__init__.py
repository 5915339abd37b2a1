"""Prefect tasks, one per stage: resolve inputs, run the stage, record outputs and lineage."""
