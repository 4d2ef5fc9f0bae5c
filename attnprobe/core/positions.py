"""Where a metric reads: the positions of a batch it averages over (``positions=``).

Positions count each example's real tokens from 0 (left padding is skipped): ``"last"`` (each
example's last real token), ``"all"`` (every real position), one list of positions for every
example, one list per example, or a ``[batch, seq]`` bool mask.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import torch

from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = ["Batch", "Positions", "batch_rows", "positions_mask", "real_positions"]

Batch = Mapping[str, torch.Tensor]
Positions = str | Sequence[int] | Sequence[Sequence[int]] | torch.Tensor


def batch_rows(batch: Batch) -> int | None:
    """Rows of a batch (its ``input_ids``), or None without them."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return int(ids.shape[0]) if isinstance(ids, torch.Tensor) else None


def real_positions(batch: Batch) -> torch.Tensor:
    """``[batch, seq]`` bool: real (non-padding) positions."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


def positions_mask(positions: Positions, batch: Batch, *, needs_next: bool = False
                   ) -> torch.Tensor:
    """``[batch, seq]`` bool: the positions a metric averages over (module docstring).

    Positions count real tokens from 0 (left padding is skipped). ``needs_next``: only
    positions whose next token is real (the ``:next`` metrics and ``loss``); a chosen
    position without one is an error.

    Example:
        >>> ids = {"input_ids": torch.ones(2, 4, dtype=torch.long),   # [batch, seq]
        ...        "attention_mask": torch.tensor([[0, 1, 1, 1], [1, 1, 1, 1]])}
        >>> positions_mask("last", ids).long()
        tensor([[0, 0, 0, 1],
                [0, 0, 0, 1]])
        >>> positions_mask([0], ids).long()             # real token 0: after the left padding
        tensor([[0, 1, 0, 0],
                [1, 0, 0, 0]])
        >>> positions_mask("all", ids, needs_next=True).long()   # tokens with a next one
        tensor([[0, 1, 1, 0],
                [1, 1, 1, 0]])
    """
    real = real_positions(batch)
    n, seq = real.shape
    order = real.long().cumsum(-1) - 1  # position of each slot among the real tokens
    has_next = torch.zeros_like(real)
    has_next[:, :-1] = real[:, :-1] & real[:, 1:]
    usable = real & has_next if needs_next else real
    if isinstance(positions, str):
        if positions == "all":
            chosen = usable
        elif positions == "last":
            last = torch.zeros_like(real)
            last[torch.arange(n), seq - 1 - real.flip(-1).long().argmax(-1)] = True
            chosen = last
            if needs_next:
                raise InputError("the last position has no next token: choose positions=... "
                                 "(e.g. 'all') for this metric")
        else:
            raise InputError(one_of("positions", positions, ("last", "all"))
                             + ", a list of positions, one list per example, or a bool mask")
    elif isinstance(positions, torch.Tensor) and positions.dtype == torch.bool:
        if positions.shape != real.shape:
            raise InputError(f"a positions mask must be [batch, seq] = {list(real.shape)}; got "
                             f"{list(positions.shape)}")
        chosen = positions.to(real.device) & real
    else:
        chosen = _listed(positions, order, real, n)
    bad = chosen & ~usable
    if bad.any():
        b, slot = bad.nonzero()[0].tolist()
        raise InputError(f"position {int(order[b, slot])} of example {b} has no next token; "
                         "this metric reads the token after each position")
    empty = ~chosen.any(-1)
    if empty.any():
        raise InputError(f"example {int(empty.nonzero()[0])} has no position to measure")
    return chosen


def _listed(positions: Sequence[Any], order: torch.Tensor, real: torch.Tensor,
            n: int) -> torch.Tensor:
    items = list(positions.tolist() if isinstance(positions, torch.Tensor) else positions)
    per_example = bool(items) and all(isinstance(p, (list, tuple)) for p in items)
    if per_example and len(items) != n:
        raise InputError(f"positions gives {len(items)} lists for {n} examples")
    lists = items if per_example else [items] * n
    chosen = torch.zeros_like(real)
    for b, wanted in enumerate(lists):
        length = int(real[b].sum())
        for p in wanted:
            if isinstance(p, bool) or not isinstance(p, int):
                raise InputError(f"positions must be integers; got {p!r}")
            q = p + length if p < 0 else p
            if not 0 <= q < length:
                raise InputError(f"position {p} is out of range for example {b} ({length} "
                                 "tokens)")
            chosen[b] |= real[b] & (order[b] == q)
    return chosen
