"""The simple per-head reducers, as views of the census statistics.

Entropy, the largest weight and the mass at an offset are numbers the census already sums
(:mod:`attnprobe.heads.stats.rows`, :mod:`attnprobe.heads.stats.offsets`). So that each has
one definition, :class:`Entropy`, :class:`MaxWeight` and :class:`OffsetMass` compute nothing
themselves: each is a :class:`StatView` — a registered census statistic run by its own code
on the block's :class:`~attnprobe.heads.tile.Tile`, and a selection of its columns under
the reducer's names. A streaming ``Reduce``, :func:`~attnprobe.heads.summary.summarize` and
the census therefore agree by construction. The views of one block share its tile (one
entropy and one row maximum per block, whichever views ask).

They are registered in :data:`~attnprobe.core.reducers.REDUCERS`, which is how the capture
(a lower floor) finds the default summary (:func:`~attnprobe.core.reducers.default_reducers`).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import ClassVar

import torch

from attnprobe.core.packed_sums import Sums
from attnprobe.core.reducers import REDUCERS, offset_name
from attnprobe.core.row_blocks import RowBlock
from attnprobe.heads.stats import STATS
from attnprobe.heads.tile import Tile, TileSpec

__all__ = ["Entropy", "MaxWeight", "OffsetMass", "StatView"]


@dataclass(frozen=True)
class StatView:
    """A reducer that reads one census statistic (``stat``, a :data:`~attnprobe.heads.stats.
    STATS` name) and keeps the columns :meth:`selected` names, renamed. A column the
    statistic gave no sum for (e.g. an offset no row of the block reaches) sums to 0."""

    stat: ClassVar[str] = ""

    def selected(self) -> dict[str, str]:
        """Census column -> the reducer's statistic name, in output order."""
        raise NotImplementedError

    def max_offset(self) -> int | None:
        """The tile's offset limit (:class:`~attnprobe.heads.tile.TileSpec`): the offset bins
        the statistic computes."""
        return None

    def __call__(self, block: RowBlock) -> dict[str, Sums]:
        limit = self.max_offset()
        block = block.shared("finite", lambda: _finite_padding(block))
        tile = block.shared(("tile", limit), lambda: Tile(block, TileSpec(max_offset=limit)))
        sums = block.shared(("stat", self.stat, limit), lambda: STATS.get(self.stat)(tile))
        zero = None
        out: dict[str, Sums] = {}
        for column, name in self.selected().items():
            found = sums.get(column)
            if found is None:
                if zero is None:
                    zero = torch.zeros(block.pattern.shape[1], dtype=torch.float64,
                                       device=tile.device)
                found = zero
            out[name] = found
        return out


def _finite_padding(block: RowBlock) -> RowBlock:
    """``block``, or a copy whose padding rows hold 0 where the model left NaN in them (fully
    masked rows): a statistic that sums rows before it masks them (the offset diagonals)
    would carry the NaN into real rows' sums. Only the padding rows are read to check."""
    pad = ~block.query_valid.to(block.pattern.device)
    if not bool(pad.any()):
        return block
    if bool(torch.isfinite(block.pattern.transpose(1, 2)[pad]).all()):  # [rows, head, key]
        return block
    return replace(block, pattern=torch.where(pad[:, None, :, None], 0.0, block.pattern))


def _smoothed(block: RowBlock, smoothing: float) -> RowBlock:
    """``block`` with each row mixed with the uniform row over its real keys."""
    a = block.pattern
    real = block.real_keys()[:, None, None, :].to(a.device, a.dtype)
    uniform = real / block.key_len[:, None, None, None].to(a.device, a.dtype)
    return replace(block, pattern=(1 - smoothing) * a + smoothing * uniform)


@REDUCERS.register("entropy")
@dataclass(frozen=True)
class Entropy(StatView):
    """Row entropy ``-Σ_j a_ij ln a_ij`` in nats (``ln n`` for a uniform row over n keys):
    the census' ``entropy`` column.

    ``smoothing`` mixes in a uniform distribution over the real keys first
    (Clark et al. use 1e-4).
    """

    smoothing: float = 0.0
    name: str = "entropy"
    stat: ClassVar[str] = "rows"

    def selected(self) -> dict[str, str]:
        return {"entropy": self.name}

    def __call__(self, block: RowBlock) -> dict[str, Sums]:
        if self.smoothing:
            block = _smoothed(block, self.smoothing)
        return super().__call__(block)


@REDUCERS.register("max_weight")
@dataclass(frozen=True)
class MaxWeight(StatView):
    """Largest weight of each row (1.0 for a one-hot row, 1/n for a uniform one): the
    census' ``max_weight`` column."""

    name: str = "max_weight"
    stat: ClassVar[str] = "rows"

    def selected(self) -> dict[str, str]:
        return {"max_weight": self.name}


@REDUCERS.register("offset_mass")
@dataclass(frozen=True)
class OffsetMass(StatView):
    """Mass on the key at relative offset ``key - query`` (-1 previous, 0 self, +1 next):
    the census' ``offset@<d>`` columns.

    Statistics are named ``prev``, ``self``, ``next`` or ``offset+k``. A row whose offset
    falls outside the sentence contributes 0.
    """

    offsets: tuple[int, ...] = (-1, 0, 1)
    name: str = "offset_mass"
    stat: ClassVar[str] = "offsets"

    def max_offset(self) -> int | None:
        return max((abs(d) for d in self.offsets), default=0)

    def selected(self) -> dict[str, str]:
        return {f"offset@{d:+d}": offset_name(d) for d in self.offsets}
