"""The census reducer: every statistic of :mod:`attnprobe.heads.stats` read off one
:class:`~attnprobe.heads.tile.Tile` per block of rows, so the quantities they share (row
entropies and maxima, sink keys, key-class masses) are computed once per block.

Statistic names and meanings are the statistics' own declarations; the score table built
from them is :func:`attnprobe.heads.scores.wide_scores`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import torch

from attnprobe.core.display import counted, describe
from attnprobe.core.reducers import REDUCERS, RowBlock, Sums
from attnprobe.errors import InputError
from attnprobe.heads.sinks import SinkRule
from attnprobe.heads.stats import STATS, Stat
from attnprobe.heads.tile import Tile, TileSpec


def census_parts() -> frozenset[str]:
    """The parts a census may ask for: each registered statistic's ``part``."""
    return frozenset(stat.part for stat in STATS.values())


@REDUCERS.register("census")
@dataclass(frozen=True, eq=False)
class CensusStats:
    """The census reducer (see the module docstring).

    Args:
        classes: token class -> ids, from :func:`attnprobe.core.tokens.token_classes`; empty
            without a tokenizer.
        max_offset: offsets beyond ±max_offset are pooled into ``offset@far``/``argmax@far``.
        parts: which statistics to compute (:func:`census_parts`; None: every registered
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
        >>> sums = CensusStats(parts=frozenset({"rows"}))(block)
        >>> round(float(sums["max_weight"][0]), 4)  # three rows of max 1/3
        1.0
    """

    classes: dict[str, torch.Tensor] = field(default_factory=dict)
    max_offset: int | None = None
    parts: frozenset[str] | None = None
    prefix: str = ""
    sinks: SinkRule = field(default_factory=SinkRule)
    name: str = "census"

    def __post_init__(self) -> None:
        known = census_parts()
        unknown = sorted(set(self.parts or ()) - known)
        if unknown:
            raise InputError(f"unknown census part(s) {', '.join(unknown)}; choose from "
                             f"{', '.join(sorted(known))}")

    def __repr__(self) -> str:
        return describe("CensusStats", ", ".join(sorted(self.parts)) if self.parts is not None
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
                     if self.parts is None or stat.part in self.parts)

    def __call__(self, block: RowBlock) -> dict[str, Sums]:
        with_ids = bool(self.classes) or block.key_ids is not None
        tile = Tile(block, self.spec)
        out: dict[str, Sums] = {}
        for stat in self.stats:
            if stat.needs_ids and not with_ids:
                continue
            out.update(stat(tile))
        return out
