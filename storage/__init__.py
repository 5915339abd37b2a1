"""Where things are kept: the state folder, MLflow tracking, the DuckDB store, content digests."""
