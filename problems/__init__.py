"""Problems with checkable answers: the tiny world's generators and the loader for real data."""

from problems.types import Problem

__all__ = ["Problem"]
