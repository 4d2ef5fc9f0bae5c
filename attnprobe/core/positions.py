"""Where a metric reads: the positions of a batch it averages over (``positions=``; the
causal experiments call it ``metric_positions=``).

Positions count each example's real tokens from 0 (left padding is skipped); a negative one
counts from the end (``-1`` is the last real token): ``"last"`` (each example's last real
token), ``"all"`` (every real position), one position (an int) or one list of positions for
every example, one list per example, or a ``[batch, seq]`` bool mask. ``None`` is the
default: ``"last"``, or ``"all"`` for a metric that reads the token after each position (the
last one has none). Anything else is a one-line error naming the argument
(:func:`check_positions`); a position past an example's end is an error naming the example,
never dropped, and so is a mask that marks padding or does not fit the inputs
(:func:`fit_positions` checks a corpus before any forward).
"""

from __future__ import annotations

import numbers
from collections.abc import Mapping, Sequence
from typing import Any

import torch

from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = ["Batch", "Positions", "batch_rows", "check_positions", "fit_positions",
           "positions_mask", "real_positions"]

Batch = Mapping[str, torch.Tensor]
Positions = str | int | Sequence[int] | Sequence[Sequence[int]] | torch.Tensor
NAMED = ("last", "all")
KINDS = ("'last', 'all', a position, a list of positions, one list per example or a "
         "[example, seq] bool mask")


def batch_rows(batch: Batch) -> int | None:
    """Rows of a batch (its ``input_ids``), or None without them."""
    ids = batch.get("input_ids") if isinstance(batch, Mapping) else None
    return int(ids.shape[0]) if isinstance(ids, torch.Tensor) else None


def real_positions(batch: Batch) -> torch.Tensor:
    """``[batch, seq]`` bool: real (non-padding) positions."""
    ids = batch["input_ids"]
    mask = batch.get("attention_mask")
    return torch.ones_like(ids, dtype=torch.bool) if mask is None else mask.bool()


def check_positions(positions: Any, name: str = "positions") -> Positions | None:
    """``positions`` in the one form the readers take (module docstring), or a one-line
    :class:`~attnprobe.errors.InputError` naming ``name``.

    ``None``, ``"last"``, ``"all"`` and a ``[example, seq]`` bool mask stay as they are; one
    position becomes a one-item list; an integer tensor or array becomes (lists of) ints.

    Example:
        >>> check_positions(3), check_positions(torch.tensor([[1], [2]])), check_positions(None)
        ([3], [[1], [2]], None)
    """
    if positions is None:
        return None
    if isinstance(positions, str):
        if positions.strip() in NAMED:
            return positions.strip()
        raise InputError(one_of(name, positions, NAMED) + ", a position, a list of positions, "
                         "one list per example or a [example, seq] bool mask")
    if isinstance(positions, torch.Tensor) and positions.dtype == torch.bool:
        if positions.ndim != 2:
            raise InputError(f"a {name} mask must be [example, seq]; got "
                             f"{list(positions.shape)}")
        return positions
    if isinstance(positions, torch.Tensor) and (positions.is_floating_point()
                                                or positions.is_complex()):
        raise InputError(f"{name} must be integers; got a {positions.dtype} tensor")
    if not isinstance(positions, (list, tuple)) and callable(getattr(positions, "tolist", None)):
        positions = positions.tolist()  # an integer tensor or array: (lists of) ints
    if _is_integer(positions):
        return [int(positions)]
    if not isinstance(positions, (list, tuple)):
        raise InputError(f"{name} must be {KINDS}; got {type(positions).__name__}")
    items = list(positions)
    if items and all(isinstance(p, (list, tuple)) for p in items):
        return [[_integer(p, name) for p in row] for row in items]
    return [_integer(p, name) for p in items]


def _is_integer(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _integer(value: Any, name: str) -> int:
    if not _is_integer(value):
        raise InputError(f"{name} must be integers; got {value!r}")
    return int(value)


def fit_positions(positions: Any, lengths: Sequence[int | None], name: str = "positions"
                  ) -> Positions | None:
    """:func:`check_positions`, then checked against the inputs before any forward.

    ``lengths`` are the token counts of the caller's inputs (``None``: an input left out,
    not checked). A bool mask must be ``[inputs, longest input]`` exactly and mark no
    position past an input's end; integer positions must lie in ``[-length, length)`` of
    every input they apply to. Each fault is a one-line error naming the example (its index
    in the caller's list) and the position.

    Example:
        >>> fit_positions([-1, 0], [3, 2])
        [-1, 0]
        >>> fit_positions([2], [3, 2])
        Traceback (most recent call last):
        attnprobe.errors.InputError: positions: position 2 is out of range for example 1 (2 tokens)
    """
    positions = check_positions(positions, name)
    n = len(lengths)
    kept = [(i, int(length)) for i, length in enumerate(lengths) if length is not None]
    if isinstance(positions, torch.Tensor):
        width = max((length for _, length in kept), default=0)
        if list(positions.shape) != [n, width]:
            raise InputError(f"the {name} mask is {list(positions.shape)}; the inputs need "
                             f"[{n}, {width}] (rows: one per input; columns: the longest "
                             f"input's {width} tokens)")
        for i, length in kept:
            past = positions[i, length:].nonzero()
            if len(past):
                raise InputError(f"the {name} mask marks position {length + int(past[0])} of "
                                 f"example {i} ({length} tokens), past its end")
        return positions
    if isinstance(positions, list):
        per_example = bool(positions) and all(isinstance(p, list) for p in positions)
        if per_example and len(positions) != n:
            raise InputError(f"{name} gives {len(positions)} lists for {n} examples")
        for i, length in kept:
            for p in positions[i] if per_example else positions:
                if not -length <= p < length:
                    raise InputError(f"{name}: position {p} is out of range for example {i} "
                                     f"({length} tokens)")
    return positions


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
    positions = check_positions(positions, "positions")
    if positions is None:  # the default: the next-token prediction, or every position
        positions = "all" if needs_next else "last"
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
    elif isinstance(positions, torch.Tensor):
        if positions.shape != real.shape:
            raise InputError(f"a positions mask must be [batch, seq] = {list(real.shape)}; got "
                             f"{list(positions.shape)}")
        chosen = positions.to(real.device)
        stray = chosen & ~real
        if stray.any():  # dropping it would measure fewer positions than were asked for
            b, slot = stray.nonzero()[0].tolist()
            raise InputError(f"the positions mask marks slot {slot} of example {b}, which is "
                             "padding")
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


def _listed(items: list[Any], order: torch.Tensor, real: torch.Tensor, n: int
            ) -> torch.Tensor:
    per_example = bool(items) and all(isinstance(p, (list, tuple)) for p in items)
    if per_example and len(items) != n:
        raise InputError(f"positions gives {len(items)} lists for {n} examples")
    lists = items if per_example else [items] * n
    chosen = torch.zeros_like(real)
    for b, wanted in enumerate(lists):
        length = int(real[b].sum())
        for p in wanted:
            q = p + length if p < 0 else p
            if not 0 <= q < length:
                raise InputError(f"position {p} is out of range for example {b} ({length} "
                                 "tokens)")
            chosen[b] |= real[b] & (order[b] == q)
    return chosen
