"""Causal-LM training on one process: examples, the loop, checkpoints that resume."""
