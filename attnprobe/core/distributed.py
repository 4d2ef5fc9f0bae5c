"""Outgrowing one machine: split a corpus's work over the ranks of a ``torch.distributed``
process group and gather the results in their original order on every rank.

Every corpus analysis (census, compare, perturbation experiments, extract) cuts its work into
units (batches or texts) that do not depend on each other, runs ``units[rank::world]`` on each
rank, and gathers ``(index, result)`` pairs. Results are put back in unit order, so a run on
``n`` processes gives the same table as one process (the census even bit for bit, since its
sums are added in the same order).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from attnprobe.core.progress import progress_bar
from attnprobe.errors import InputError

__all__ = ["is_distributed", "rank_and_world", "run_sharded"]

U = TypeVar("U")
R = TypeVar("R")


def is_distributed(distributed: bool | None = None) -> bool:
    """Whether to shard: ``distributed`` when given, else whether a process group is up."""
    dist = torch.distributed
    up = dist.is_available() and dist.is_initialized()
    if distributed and not up:
        raise InputError("distributed=True needs an initialised torch.distributed process "
                         "group (torch.distributed.init_process_group, or run under torchrun)")
    return up if distributed is None else bool(distributed)


def rank_and_world(distributed: bool | None = None) -> tuple[int, int]:
    """``(rank, world_size)``; ``(0, 1)`` when not sharding."""
    if not is_distributed(distributed):
        return 0, 1
    return torch.distributed.get_rank(), torch.distributed.get_world_size()


def run_sharded(fn: Callable[[U], R], units: Sequence[U], *, distributed: bool | None = None,
                progress: bool = False, desc: str = "", unit: str = "batch") -> list[R]:
    """``[fn(u) for u in units]``, with the units split over the ranks when sharding.

    ``progress`` shows a bar over this rank's share (drawn on rank 0 only). Results are
    exchanged as Python objects (``all_gather_object``), so any backend works, gloo on CPU
    and nccl with the model on each rank's GPU alike.
    """
    rank, world = rank_and_world(distributed)
    mine = list(enumerate(units))[rank::world]
    done = [(i, fn(item)) for i, item in progress_bar(mine, enabled=progress, desc=desc,
                                                      unit=unit, total=len(mine), rank=rank)]
    if world > 1:
        gathered: list[Any] = [None] * world
        torch.distributed.all_gather_object(gathered, done)
        done = [pair for part in gathered for pair in part]
    return [result for _, result in sorted(done, key=lambda pair: pair[0])]
