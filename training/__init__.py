"""Causal-LM training on one process: examples, the loop, checkpoints that resume."""

PROGRESS = "progress/fraction"  # metric: the share of a long stage's work done so far
