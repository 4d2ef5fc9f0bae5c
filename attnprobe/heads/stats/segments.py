"""Segment attention on sentence pairs: the share of a row's far content attention (beyond
the neighbouring tokens) kept in its own segment (``[SEP]`` closes a segment). Only inputs
with two segments or more count."""

from __future__ import annotations

from typing import ClassVar

import torch

from attnprobe.core.reducers import Sums
from attnprobe.heads.stats.base import STATS, Column, Stat, register_means
from attnprobe.heads.tile import Tile

RANK = 60  # place in the tally's statistic order (attnprobe.core.plugins)


def segment_index(key_ids: torch.Tensor, real: torch.Tensor, separators: torch.Tensor
                  ) -> torch.Tensor:
    """``[batch, key]`` segment index; a separator closes the segment it ends."""
    is_sep = (torch.isin(key_ids, separators) & real).long()
    return torch.cumsum(is_sep, -1) - is_sep


class Segments(Stat):
    group: ClassVar[str] = "segments"
    needs_ids: ClassVar[bool] = True
    columns: ClassVar[tuple[Column, ...]] = (
        Column("block", "share of content attention beyond the neighbours kept in the "
                        "query's own segment (sentence pairs only)", "own"),
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        if "sep" not in tile.spec.classes:
            return {}
        block, real, content = tile.block, tile.real, tile.content
        q_ids, k_ids = (ids.to(tile.device) for ids in block.require_ids("block"))
        segment = segment_index(k_ids, real, tile.spec.classes["sep"].to(tile.device))
        n_segments = torch.where(content, segment, -1).amax(-1) + 1  # [batch]
        if int(n_segments.max()) < 2:  # no input is a pair
            return {}
        rel = tile.rel
        at = (block.key_pos[:, None, :] == block.query_pos[:, :, None]).to(tile.device) & \
            real[:, None, :]
        q_segment = (at.long() * torch.where(real, segment, 0)[:, None, :]).sum(-1)
        far = content[:, None, :] & (rel.abs() > 1)  # [batch, query, key]
        own = far & (segment[:, None, :] == q_segment[:, :, None])
        mass = torch.einsum("bhqk,bqkg->bhqg", tile.a, torch.stack([own, far], -1).to(tile.a))
        content_row = tile.rows & ~torch.isin(q_ids, tile.spec.special.to(tile.device))
        rows = content_row & far.any(-1) & (n_segments >= 2)[:, None]
        counted = rows[:, None, :] & (mass[..., 1] > 0)
        share = mass[..., 0] / mass[..., 1].clamp(min=1e-30)
        return {"block": (torch.where(counted, share, 0.0).sum(dim=(0, 2), dtype=torch.float64),
                          counted.sum(dim=(0, 2)).to(torch.float64))}


STATS.register("segments")(Segments())
register_means("block", ("block",), "share of content attention beyond the neighbours kept "
               "inside the query's own segment (sentence pairs, `[SEP]`-separated)", 500)
