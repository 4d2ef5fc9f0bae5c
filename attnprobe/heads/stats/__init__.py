"""The census statistics, one module each: what it sums per head (:class:`Column`) and the
score columns it gives (:class:`Score`). A new score is one statistic module here (imported
below) and, for a label, one rule entry in :mod:`attnprobe.heads.label_rules`.

The import order is the order of the tally's statistics.
"""

from attnprobe.heads.stats import rows, offsets, sinks, classes  # noqa: F401, I001
from attnprobe.heads.stats import copies, segments, joined  # noqa: F401
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

__all__ = ["SCORES", "STATS", "Column", "Means", "Score", "Stat", "ranked_scores",
           "score_columns"]
