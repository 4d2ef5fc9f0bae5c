"""Many patches per forward: what each batch row patches, and the one tensor op that does it.

A **unit** is one patch: a set of heads (``(layer, head)`` pairs along the site's head axis)
at one position or at every position. A patched forward runs ``b`` examples repeated once per
unit of a chunk of ``c`` units (``b · c <= batch_size`` rows, as the perturbation sweeps do):
row ``k·b + t`` is example ``t`` with unit ``k`` patched. :class:`RowPatch` turns a chunk into
index tensors per layer, so a layer's rewrite is one indexed copy
``tensor[rows, heads(, position)] = source[example, heads(, position)]`` — no loop over heads
or rows in the forward. :func:`placed_rows` turns a forward's metrics into table rows and
:func:`in_order` orders them; the chunks themselves are planned and run (split over the
ranks) by :func:`attnprobe.core.chunked.run_chunked`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from attnprobe.core.chunked import Chunk, forward_rows
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.patch.table import Row

__all__ = ["PER", "Placed", "RowPatch", "Unit", "at_positions", "chunks", "forward_rows",
           "in_order", "placed_rows", "tiled", "units_of"]

PER = ("head", "layer", "scope")  # a unit is one head, one layer's scoped heads, or all


@dataclass(frozen=True)
class Unit:
    """One patch: ``heads`` ``((layer, head), ...)`` along the site's head axis, at
    ``position`` (None: every position)."""

    heads: tuple[tuple[int, int], ...]
    position: int | None = None

    @property
    def layers(self) -> tuple[int, ...]:
        return tuple(sorted({layer for layer, _ in self.heads}))

    @property
    def layer(self) -> int | None:
        """The layer when the unit lies in one, else None."""
        layers = self.layers
        return layers[0] if len(layers) == 1 else None

    @property
    def head(self) -> int | None:
        """The head when the unit is one head, else None."""
        return self.heads[0][1] if len(self.heads) == 1 else None

    @property
    def scope(self) -> Scope:
        """The layers the unit patches, every head (the rewrite decides which heads change)."""
        return Scope(layers=self.layers)

    def at(self, position: int | None) -> Unit:
        return Unit(self.heads, position)


def axis_heads(scope: Scope, layer: int, n_heads: int, n_axis: int) -> tuple[int, ...]:
    """The scoped heads of ``layer`` along a head axis of ``n_axis`` heads: the query heads,
    or for grouped keys / values (``n_axis < n_heads``) the key/value heads serving them."""
    heads = scope.heads_of(layer, n_heads)
    if n_axis == n_heads:
        return heads
    group = n_heads // n_axis
    return tuple(sorted({h // group for h in heads}))


def units_of(scope: Scope, sizes: Mapping[int, tuple[int, int]], per: str) -> list[Unit]:
    """The units of ``scope`` (every position): each head, each layer's heads, or all of them
    at once (``per``), in layer then head order. ``sizes``: per layer ``(query heads, heads
    along the site's axis)``."""
    if per not in PER:
        raise InputError(f"unknown per {per!r}; choose one of {', '.join(PER)}")
    groups: list[tuple[tuple[int, int], ...]] = []
    for layer in sorted(sizes):
        if not scope.wants_layer(layer):
            continue
        n_heads, n_axis = sizes[layer]
        pairs = tuple((layer, h) for h in axis_heads(scope, layer, n_heads, n_axis))
        if not pairs:
            continue
        groups += [(p,) for p in pairs] if per == "head" else [pairs]
    if per == "scope" and groups:
        groups = [tuple(p for g in groups for p in g)]
    if not groups:
        raise InputError(f"the scope {scope} holds no head of this model")
    return [Unit(g) for g in groups]


SHARED = 8  # patches that amortise a forward's fixed cost: a chunk this long ends at a turn


def chunks(units: Sequence[Unit], per_forward: int) -> list[tuple[int, int]]:
    """``(start, stop)`` of each forward's units, in order: at most ``per_forward`` units, cut
    where the first patched layer changes (a forward repeats its examples only from its first
    patched layer on, and replays the layers before: :mod:`attnprobe.patch.late_tiling`)
    unless the chunk so far is under half full and under :data:`SHARED` units (then the next
    layer's patches share its forward rather than pay one of their own)."""
    found: list[tuple[int, int]] = []
    start = 0
    for i in range(1, len(units) + 1):
        full = i - start == per_forward
        turn = i < len(units) and min(units[i].layers) != min(units[i - 1].layers) \
            and 2 * (i - start) >= min(per_forward, 2 * SHARED)
        if i == len(units) or full or turn:
            found.append((start, i))
            start = i
    return found


def at_positions(units: Sequence[Unit], positions: str, lengths: Sequence[int],
                 span: slice) -> list[Unit]:
    """The units of a batch of examples (``span``): ``units`` at every position
    (``positions="all"``), or each at each position of the batch's longest example, unit
    by unit."""
    if positions == "all":
        return list(units)
    return [u.at(p) for u in units for p in range(max(lengths[span]))]


Placed = tuple[int, Row]  # (the unit's place among the scope's units, its row)


def head_row(example: int, unit: Unit, patched: float) -> Row:
    """The row of a patch of ``unit``'s heads on ``example``."""
    return Row(example, unit.layer, unit.head, unit.position, patched)


def placed_rows(chunk: Chunk[Unit], values: np.ndarray, lengths: Sequence[int],
                n_units: int, row: Callable[[int, Unit, float], Row] = head_row
                ) -> list[Placed]:
    """The rows of a chunk's forward: ``row(example, unit, values[k, t])`` for each unit
    ``k`` and example ``t`` (``values`` ``[unit, example]``), but a position past the end of
    a shorter example (padding). A batch's units are the scope's ``n_units`` units, each at
    every position or once per position of the batch; the place is the scope's unit."""
    width = chunk.total // n_units  # positions per scope unit (1: every position at once)
    return [((chunk.start + k) // width, row(example, unit, float(values[k, t])))
            for k, unit, t, example in chunk.rows()
            if unit.position is None or unit.position < lengths[example]]


def in_order(placed: Sequence[Placed]) -> list[Row]:
    """The rows by scope unit, then position, then example (the table's order)."""
    found = sorted(placed, key=lambda x: (x[0], x[1].position or 0, x[1].example))
    return [row for _, row in found]


def tiled(inputs: Mapping[str, torch.Tensor], k: int) -> dict[str, torch.Tensor]:
    """The batch repeated ``k`` times along the batch axis (copy ``j`` is rows ``j·b ..``)."""
    return {name: value.repeat(k, *[1] * (value.ndim - 1))
            if isinstance(value, torch.Tensor) and value.ndim else value
            for name, value in inputs.items()}


@dataclass(frozen=True)
class _Index:
    rows: torch.Tensor  # [n] batch rows of the forward
    heads: torch.Tensor  # [n] head along the site's axis
    examples: torch.Tensor  # [n] row of the source tensor
    positions: torch.Tensor | None  # [n], or None: every position

    def to(self, device: torch.device) -> _Index:
        return _Index(self.rows.to(device), self.heads.to(device), self.examples.to(device),
                      None if self.positions is None else self.positions.to(device))


class RowPatch:
    """Row ``k·b + t`` of a forward takes unit ``k``'s heads (at its position) from row ``t``
    of a source tensor ``[b, head, position, ...]`` (module docstring)."""

    def __init__(self, units: Sequence[Unit], b: int, device: torch.device) -> None:
        entries: dict[int, list[tuple[int, int, int, int]]] = {}
        for k, unit in enumerate(units):
            for layer, head in unit.heads:
                for t in range(b):
                    entries.setdefault(layer, []).append(
                        (k * b + t, head, t, -1 if unit.position is None else unit.position))
        every = {u.position is None for u in units}
        if len(every) > 1:
            raise InputError("one forward patches at every position or at one each, not both")
        self.layers = tuple(sorted(entries))
        # per layer, its index on each device a layer's tensor lives on (a dispatched model's
        # layers sit on several): copied once, not at every forward
        self.moved: dict[tuple[int, torch.device], _Index] = {}
        self.index: dict[int, _Index] = {}
        for layer, found in entries.items():
            table = torch.tensor(found, dtype=torch.long, device=device)  # [n, 4]
            self.index[layer] = _Index(table[:, 0], table[:, 1], table[:, 2],
                                       None if every == {True} else table[:, 3])

    def apply(self, layer: int, tensor: torch.Tensor, source: torch.Tensor) -> torch.Tensor:
        """``tensor`` ``[rows, head, position, ...]`` with the patched entries of ``layer``
        copied from ``source`` ``[b, head, position, ...]`` (in place; returned)."""
        index = self._on(layer, tensor.device)
        if index is None:
            return tensor
        source = source.to(tensor.device, tensor.dtype)  # recorded at this layer: no copy
        if index.positions is None:
            tensor[index.rows, index.heads] = source[index.examples, index.heads]
        else:
            tensor[index.rows, index.heads, index.positions] = \
                source[index.examples, index.heads, index.positions]
        return tensor

    def _on(self, layer: int, device: torch.device) -> _Index | None:
        index = self.index.get(layer)
        if index is None or index.rows.device == device:
            return index
        if (layer, device) not in self.moved:
            self.moved[(layer, device)] = index.to(device)
        return self.moved[(layer, device)]
