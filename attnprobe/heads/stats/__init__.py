"""The census statistics, one module each: what it sums per head (:class:`Column`) and the
score columns it gives (:class:`Score`). A new score is one statistic module here: it is
discovered (:func:`discover_stats`), so no list names it.

Each module declares ``RANK`` (:mod:`attnprobe.core.plugins`): the modules are imported in
rank order, which is the order of the tally's statistics (``base`` holds the machinery).
"""

from types import ModuleType

from attnprobe.core.plugins import import_modules
from attnprobe.heads.stats.base import (
    SCORES,
    STATS,
    Column,
    Means,
    Score,
    Stat,
    ranked_scores,
    score_columns,
)

__all__ = ["SCORES", "STATS", "Column", "Means", "Score", "Stat", "discover_stats",
           "ranked_scores", "score_columns"]


def discover_stats() -> list[ModuleType]:
    """Import every statistic module of this package (those already imported are kept), in
    declared-rank order; each registers its statistics and scores on import.

    Example:
        >>> [m.__name__.rsplit(".", 1)[1] for m in discover_stats()][:3]
        ['rows', 'offsets', 'sinks']
    """
    return import_modules(__name__, skip=("base",))


discover_stats()
