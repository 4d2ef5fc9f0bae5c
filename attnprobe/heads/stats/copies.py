"""Token matches: how much of a row's content attention goes to the previous token, to an
earlier copy of its own token (duplicate) and to the token after an earlier copy (induction,
Olsson et al.), and the same ahead of the row. Each is renormalised over the row's content
keys (no special token) and averaged over the content rows where the pattern exists, so
the statistic returns ``(sums, counts)``: the copying labels trust a score only over enough
rows (the ``*_rows`` columns).

Matches are read at the matching pairs only (a sparse gather), never through a ``[query,
key, pattern]`` product.
"""

from __future__ import annotations

from typing import ClassVar

import numpy as np
import torch

from attnprobe.core.reducers import Sums
from attnprobe.heads.stats.base import SCORES, STATS, Column, Means, Score, Stat, register_means
from attnprobe.heads.tile import Tile

COPIES = ("duplicate", "induction", "duplicate_ahead", "induction_ahead")


def previous_ids(ids: torch.Tensor, pos: torch.Tensor) -> torch.Tensor:
    """``[batch, key]``: the id of the real token before each key (-1 for the first and for
    padding)."""
    shifted = torch.roll(ids, 1, dims=-1)
    real_before = torch.roll(pos, 1, dims=-1) == pos - 1
    return torch.where((pos >= 1) & real_before, shifted, torch.full_like(ids, -1))


class Copies(Stat):
    """Names get the tile spec's prefix (``rep_`` on the repeated-token probe)."""

    part: ClassVar[str] = "match"
    needs_ids: ClassVar[bool] = True
    columns: ClassVar[tuple[Column, ...]] = (
        Column("prev", "content mass on the previous token", "own"),
        Column("duplicate", "content mass on earlier copies of the row's token", "own"),
        Column("induction", "content mass on tokens after earlier copies of the row's token "
                            "(not the previous token)", "own"),
        Column("duplicate_ahead", "content mass on later copies of the row's token", "own"),
        Column("induction_ahead", "content mass on tokens after later copies (not the next "
                                  "token)", "own"),
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        block = tile.block
        q_ids, k_ids = (ids.to(tile.device) for ids in block.require_ids(
            "duplicate/induction"))
        content = tile.content  # [batch, key]
        rel = tile.rel
        same = (q_ids[:, :, None] == k_ids[:, None, :]) & content[:, None, :]
        follows = (q_ids[:, :, None] == previous_ids(k_ids, block.key_pos.to(tile.device))[
            :, None, :]) & content[:, None, :]
        earlier, later = rel < 0, rel > 0
        prev_present = tile.key_at(content, -1)  # [batch, query]
        hits = {  # name -> ([batch, head, query] mass, [batch, query] pattern present)
            "prev": (tile.at_offset(-1) * prev_present[:, None, :], prev_present)}
        for name, pairs in (("duplicate", same & earlier),
                            ("induction", follows & earlier & (rel != -1)),
                            ("duplicate_ahead", same & later),
                            ("induction_ahead", follows & later & (rel != 1))):
            hits[name] = (tile.mass_on_pairs(pairs), pairs.any(-1))
        base = tile.class_masses["content"]  # [batch, head, query]
        content_row = tile.rows & ~torch.isin(q_ids, tile.spec.special.to(tile.device))
        has_base = base > 0
        safe = base.clamp(min=1e-30)
        out: dict[str, Sums] = {}
        for name, (mass, present) in hits.items():
            counted = (content_row & present)[:, None, :] & has_base
            sums = torch.where(counted, mass / safe, 0.0).sum(dim=(0, 2), dtype=torch.float64)
            counts = counted.sum(dim=(0, 2)).to(torch.float64)
            out[tile.spec.prefix + name] = (sums, counts)
        return out


def _rows(means: Means) -> dict[str, np.ndarray] | None:
    """How many rows each copy score is a mean over (0 for a head with none)."""
    found = {f"{name}_rows": means.count(name) for name in COPIES}
    found = {name: np.nan_to_num(rows).astype(int) for name, rows in found.items()
             if rows is not None}
    return found or None


STATS.register("copies")(Copies())
register_means("copies", COPIES, "mass on earlier (`_ahead`: later) copies of the query's "
               "token / on the token after them (Olsson et al.'s induction), over the rows "
               "where one exists; special keys excluded and the rest renormalised", 600)
register_means("rep", tuple("rep_" + c.name for c in Copies.columns), "the same and the "
               "previous token on repeated random tokens `x x` (TransformerLens / Olsson et "
               "al.; bidirectional variants for encoders) built through the tokenizer's own "
               "template: `[CLS] x x [SEP]` for BERT, `<s> x x` for LLaMA, `x x` for GPT-2 "
               "(`attnprobe.heads.probe`)", 610)
SCORES.register("copy_rows")(Score(
    "*_rows", "how many query rows each of duplicate, induction, duplicate_ahead, "
    "induction_ahead is a mean over (rows that hold an earlier / later copy of their token); "
    "the copying labels trust the corpus scores only over enough rows", _rows, 620,
    tuple(f"{name}_rows" for name in COPIES)))
