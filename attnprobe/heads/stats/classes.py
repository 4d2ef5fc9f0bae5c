"""Mass on the first token and on each class of token (Clark et al. §3: heads that look at
``[CLS]``, ``[SEP]``, punctuation; Xiao et al.'s attention sink on the first token)."""

from __future__ import annotations

from typing import ClassVar

from attnprobe.core.reducers import Sums
from attnprobe.heads.stats.base import STATS, Column, Stat, register_means
from attnprobe.heads.tile import Tile

RANK = 40  # place in the tally's statistic order (attnprobe.core.plugins)

CLASS_COLUMNS = (
    Column("cls", "mass on `[CLS]`-like start tokens (those the tokenizer has)"),
    Column("sep", "mass on `[SEP]`-like separators"),
    Column("bos", "mass on the BOS token"),
    Column("eos", "mass on the EOS token"),
    Column("special", "mass on all special tokens"),
    Column("punct", "mass on punctuation tokens"),
)


class Classes(Stat):
    """``first`` always; one column per token class of the tile spec (those of
    :func:`~attnprobe.core.tokens.token_classes` the tokenizer has)."""

    group: ClassVar[str] = "classes"
    needs_ids: ClassVar[bool] = True
    columns: ClassVar[tuple[Column, ...]] = (
        Column("first", "mass on the first real token (attention sink, Xiao et al.; Gu et "
                        "al.'s α_1)"),
        *CLASS_COLUMNS,
    )

    def __call__(self, tile: Tile) -> dict[str, Sums]:
        tile.block.require_ids("token-class")
        masses = tile.class_masses
        names = ("first", *tile.spec.classes)
        sums = tile.row_sums([masses[name] for name in names], tile.rows[:, None, :])
        return dict(zip(names, sums, strict=True))


STATS.register("classes")(Classes())
register_means("first", ("first",), "mass on the first real token (Xiao et al.'s attention "
               "sink; Gu et al.'s α_1)", 300, always=True)
register_means("classes", tuple(c.name for c in CLASS_COLUMNS), "mass on each special token "
               "the tokenizer has (`[CLS]`, `[SEP]`, BOS, EOS), on all special tokens, and on "
               "punctuation", 301)
