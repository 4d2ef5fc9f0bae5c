"""Per-row statistics: entropy, normalised entropy, the uniform row's weight, the largest
weight (Clark et al. §3.3; Voita et al.'s confidence)."""

from __future__ import annotations

from typing import ClassVar

import torch

from attnprobe.core.reducers import Sums
from attnprobe.heads.stats.base import STATS, Column, Stat, register_means
from attnprobe.heads.tile import Tile

RANK = 10  # place in the tally's statistic order (attnprobe.core.plugins)


class Rows(Stat):
    group: ClassVar[str] = "rows"
    columns: ClassVar[tuple[Column, ...]] = (
        Column("entropy", "row entropy, nats"),
        Column("entropy_norm", "row entropy / ln(keys the row may attend to); 1.0 = uniform "
                               "(rows that may see two keys or more)", "own"),
        Column("chance_weight", "1 / (keys the row may attend to): the max weight of a "
                                "uniform row"),
        Column("max_weight", "largest weight of the row (Voita's confidence)"),
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        h, visible, rows = tile.entropy, tile.visible, tile.rows
        several = (visible > 1) & rows  # [batch, query]: the same rows for every head
        normed = torch.where(several[:, None, :], h / visible.clamp(min=2).log()[:, None, :],
                             0.0)
        n_heads = tile.a.shape[1]
        chance = torch.where(rows, 1 / visible, 0.0).sum(dtype=torch.float64)
        return {
            "entropy": tile.row_sum(h),
            "entropy_norm": (normed.sum(dim=(0, 2), dtype=torch.float64),
                             several.sum().to(torch.float64).expand(n_heads)),
            "chance_weight": chance.expand(n_heads),
            "max_weight": tile.row_sum(tile.top[0]),
        }

STATS.register("rows")(Rows())
register_means("entropy", ("entropy", "entropy_norm"), "row entropy in nats, and divided by "
               "ln(keys the row may see): 1.0 for uniform, also under a causal mask", 100,
               always=True)
register_means("chance_weight", ("chance_weight", "max_weight"), "mean 1/(keys the row may "
               "see), the largest weight of a uniform row; mean largest weight (Voita et al.'s "
               "confidence)", 110, always=True)
