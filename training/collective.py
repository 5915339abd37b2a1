"""What data-parallel ranks exchange while training, behind one small interface: a single process
is the world of one, where every exchange is the identity, so the trainers have one code path.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol, TypeVar

import torch

T = TypeVar("T")


class Collective(Protocol):
    rank: int
    world: int

    def sum(self, values: Sequence[float]) -> list[float]:
        """Element-wise sums over the ranks (every rank gets them)."""
        ...

    def max(self, values: Sequence[float]) -> list[float]:
        """Element-wise maxima over the ranks (every rank gets them)."""
        ...

    def gather(self, obj: T) -> list[T]:
        """Every rank's `obj`, in rank order (every rank gets them)."""
        ...

    def share(self, items: Sequence[T]) -> tuple[list[T], int]:
        """This rank's contiguous share of `items` and the index of its first item."""
        ...


class Solo:
    """One process: the whole batch is its share and nothing is exchanged."""

    rank = 0
    world = 1

    def sum(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def max(self, values: Sequence[float]) -> list[float]:
        return [float(v) for v in values]

    def gather(self, obj: T) -> list[T]:
        return [obj]

    def share(self, items: Sequence[T]) -> tuple[list[T], int]:
        return list(items), 0


class TorchCollective:
    """The ranks of the default torch.distributed process group (gloo on CPU, NCCL on GPU)."""

    def __init__(self) -> None:
        import torch.distributed as dist

        if not dist.is_initialized():
            raise RuntimeError("TorchCollective needs an initialised torch.distributed group")
        self._dist = dist
        self.rank, self.world = dist.get_rank(), dist.get_world_size()
        self._device = torch.device("cuda") if dist.get_backend() == "nccl" else torch.device("cpu")

    def sum(self, values: Sequence[float]) -> list[float]:
        total = torch.tensor(list(values), dtype=torch.float64, device=self._device)
        self._dist.all_reduce(total)
        return total.tolist()

    def max(self, values: Sequence[float]) -> list[float]:
        most = torch.tensor(list(values), dtype=torch.float64, device=self._device)
        self._dist.all_reduce(most, op=self._dist.ReduceOp.MAX)
        return most.tolist()

    def gather(self, obj: Any) -> list[Any]:
        out: list[Any] = [None] * self.world
        self._dist.all_gather_object(out, obj)
        return out

    def share(self, items: Sequence[T]) -> tuple[list[T], int]:
        if len(items) % self.world:
            raise ValueError(f"{len(items)} items do not split evenly over {self.world} ranks")
        size = len(items) // self.world
        return list(items[self.rank * size : (self.rank + 1) * size]), self.rank * size
