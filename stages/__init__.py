"""Stage implementations: `run(config, inputs, tracker) -> outputs`; no Prefect, no MLflow."""
