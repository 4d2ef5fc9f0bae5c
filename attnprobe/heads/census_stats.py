"""The census reducer: every statistic of :mod:`attnprobe.heads.stats` read off one
:class:`~attnprobe.heads.tile.Tile` per block of rows, so the quantities they share (row
entropies and maxima, sink keys, key-class masses) are computed once per block.

Statistic names and meanings are the statistics' own declarations; the score table built
from them is :func:`attnprobe.heads.scores.wide_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property
from typing import ClassVar

import torch

from attnprobe.core.display import counted, describe
from attnprobe.core.reducers import REDUCERS, Sums
from attnprobe.core.row_blocks import RowBlock
from attnprobe.errors import InputError
from attnprobe.heads.sinks import SinkRule
from attnprobe.heads.stats import STATS, Stat
from attnprobe.heads.tile import Tile, TileSpec


def stat_groups() -> frozenset[str]:
    """The groups of statistics a census may ask for: each registered statistic's
    ``group``."""
    return frozenset(stat.group for stat in STATS.values())


@REDUCERS.register("census")
@dataclass(frozen=True, eq=False)
class CensusStats:
    """The census reducer (see the module docstring).

    Args:
        classes: token class -> ids, from :func:`attnprobe.core.tokens.token_classes`; empty
            without a tokenizer.
        max_offset: offsets beyond ±max_offset are pooled into ``offset@far``/``argmax@far``.
        groups: which statistics to compute (:func:`stat_groups`; None: every registered
            statistic); those that read token ids (``classes``, ``match``, ``segments``) are
            left out of blocks without ids and no token classes (``sinks`` uses ids for the
            start tokens when present).
        prefix: prepended to the token-match names (``rep_`` for the repeated-token probe).
        sinks: how column sinks are found (:class:`~attnprobe.heads.sinks.SinkRule`).

    Example:
        >>> import torch
        >>> from attnprobe.heads import CensusStats, RowBlock
        >>> a = torch.full((1, 1, 3, 3), 1 / 3)  # [batch, head, query, key]: uniform rows
        >>> pos = torch.arange(3)[None]
        >>> block = RowBlock(a, torch.ones(1, 3, dtype=torch.bool), pos, pos, torch.tensor([3]))
        >>> sums = CensusStats(groups=frozenset({"rows"}))(block)
        >>> round(float(sums["max_weight"][0]), 4)  # three rows of max 1/3
        1.0
    """

    classes: dict[str, torch.Tensor] = field(default_factory=dict)
    max_offset: int | None = None
    groups: frozenset[str] | None = None
    prefix: str = ""
    sinks: SinkRule = field(default_factory=SinkRule)
    name: str = "census"
    summary: ClassVar[str] = ("every census statistic (`heads/stats/`), read off one Tile per "
                              "block of rows; what `ap.heads.census` sums")

    def __post_init__(self) -> None:
        known = stat_groups()
        unknown = sorted(set(self.groups or ()) - known)
        if unknown:
            raise InputError(f"unknown statistic group(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(sorted(known))}")

    def __repr__(self) -> str:
        return describe("CensusStats", ", ".join(sorted(self.groups)) if self.groups is not None
                        else "every statistic",
                        counted(len(self.classes), "token class", "token classes"),
                        f"max offset {self.max_offset}" if self.max_offset else "every offset",
                        f"prefix {self.prefix!r}" if self.prefix else None)

    @cached_property
    def spec(self) -> TileSpec:
        return TileSpec(self.classes, self.max_offset, self.sinks, self.prefix)

    @cached_property
    def stats(self) -> tuple[Stat, ...]:
        """The statistics asked for, in the registry's order."""
        return tuple(stat for stat in STATS.values()
                     if self.groups is None or stat.group in self.groups)

    def __call__(self, block: RowBlock) -> dict[str, Sums]:
        with_ids = bool(self.classes) or block.key_ids is not None
        tile = Tile(block, self.spec)
        out: dict[str, Sums] = {}
        for stat in self.stats:
            if stat.needs_ids and not with_ids:
                continue
            out.update(stat(tile))
        return out
