"""A Bradley-Terry preference reward model: pure loss and metrics, and a scalar-head transformer."""
