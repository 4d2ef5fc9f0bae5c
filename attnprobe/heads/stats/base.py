"""What a census statistic is: a small object that declares the columns it sums and the
scores it gives, and reads them off a :class:`~attnprobe.heads.tile.Tile`.

seaborn's ``Stat`` is the model: each statistic says what it produces and how it merges,
and the tables are derived from those declarations — the per-head sums of a
:class:`~attnprobe.core.reducers.Tally`, the wide score table
(:func:`attnprobe.heads.scores.wide_scores`), the label rules' list of scores and the
README's score table.

- A :class:`Column` is one sum per head: its mean over the rows seen (``mean="rows"``), over
  its own count of rows where it is defined (``"own"``: the statistic returns ``(sums,
  counts)``), or — for sink-free statistics — weighted by each row's mass left (``"rest"``:
  also ``(sums, weights)``).
- A :class:`Score` is one column of the wide table, computed from the means of the columns
  (``compute(means)`` -> one value per head, or ``None`` when its statistics are absent).

Every statistic is an entry of :data:`STATS` and every score of :data:`SCORES`, in the order
the tables show them.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Literal

import numpy as np
import pandas as pd

from attnprobe.core.reducers import Sums
from attnprobe.core.registry import Registry

__all__ = ["SCORES", "STATS", "Column", "Means", "Score", "Stat", "ranked_scores",
           "register_means", "score_columns"]

Mean = Literal["rows", "own", "rest"]


@dataclass(frozen=True)
class Column:
    """One statistic summed per head: ``name`` (``<d>`` stands for an offset, ``<class>``
    for a token class), what it means, and how its mean is taken."""

    name: str
    meaning: str
    mean: Mean = "rows"


class Means:
    """The wide table of one tally's means (``statistic`` -> ``[head rows]``), and their
    counts, as :class:`Score` computations read them; ``window``: offsets ±window get a
    score column of their own."""

    def __init__(self, wide: pd.DataFrame, counts: pd.DataFrame, window: int = 3) -> None:
        self.wide = wide
        self.counts = counts
        self.window = window

    def has(self, name: str) -> bool:
        return name in self.wide

    def get(self, name: str) -> np.ndarray | None:
        """The means of ``name``, or None when no head has it."""
        return self.wide[name].to_numpy() if name in self.wide else None

    def column(self, name: str) -> np.ndarray:
        """The means of ``name``, NaN where no head has it (a column every table shows)."""
        found = self.get(name)
        return found if found is not None else np.full(len(self.wide), np.nan)

    def count(self, name: str) -> np.ndarray | None:
        """How many rows each head's mean of ``name`` is over (None when absent)."""
        return self.counts[name].to_numpy() if name in self.counts else None

    def prefixed(self, prefix: str) -> list[str]:
        """Statistics named ``<prefix>@<something>``."""
        return [c for c in self.wide.columns if c.startswith(prefix + "@")]


@dataclass(frozen=True)
class Score:
    """One column of the wide score table (or several: ``compute`` may return a dict of
    ``name -> [head rows]``, e.g. ``offset-3 .. offset+3``): its name, meaning, and ``rank``
    (the tables order scores by it; the README's score table is these declarations), and
    ``compute(means)`` -> ``[head rows]``, a dict, or None when its statistics are absent."""

    name: str
    meaning: str
    compute: Callable[[Means], np.ndarray | dict[str, np.ndarray] | None]
    rank: float = 0.0
    columns: tuple[str, ...] = ()  # the columns a dict-valued compute gives

    @property
    def names(self) -> tuple[str, ...]:
        """The table columns this score gives (its ``columns``, else its ``name``)."""
        return self.columns or (self.name,)


class Stat:
    """Base of the census statistics: ``group`` names the group it belongs to (a census, or
    the probe, asks for groups), ``needs_ids`` whether it reads token ids, ``columns`` what it
    sums; ``__call__(tile)`` returns ``{column: Sums}``."""

    group: ClassVar[str] = ""
    needs_ids: ClassVar[bool] = False
    columns: ClassVar[tuple[Column, ...]] = ()

    def __call__(self, tile: object) -> dict[str, Sums]:
        raise NotImplementedError


STATS: Registry[Stat] = Registry("census statistic")
SCORES: Registry[Score] = Registry("score")


def ranked_scores() -> list[Score]:
    """Every registered score in table order (by rank)."""
    return sorted(SCORES.values(), key=lambda score: score.rank)


def score_columns() -> tuple[str, ...]:
    """Every score column a census table may have, in table order."""
    return tuple(name for score in ranked_scores() for name in score.names)


def register_means(key: str, names: tuple[str, ...], meaning: str, rank: float, *,
                   always: bool = False) -> None:
    """Register one score giving the means of the statistics ``names`` as columns of the same
    names (shown as one row of the README's score table); ``always``: a NaN column where no
    head has the statistic, else no column."""

    def compute(means: Means) -> dict[str, np.ndarray]:
        if always:
            return {name: means.column(name) for name in names}
        return {name: means.get(name) for name in names if means.has(name)}

    SCORES.register(key)(Score(", ".join(names), meaning, compute, rank, names))
