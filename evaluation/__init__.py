"""Evaluation metrics: pass@k, cons@k, format and language rates (pure, no I/O)."""
