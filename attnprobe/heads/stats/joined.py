"""Score columns another analysis computes and the census table joins (so the label rules
and the README's score table know them): :func:`~attnprobe.heads.retrieval_scores` and
:func:`~attnprobe.heads.syntax`."""

from __future__ import annotations

from attnprobe.heads.stats.base import SCORES, Score

RANK = 70  # place in the tally's statistic order (attnprobe.core.plugins)

SCORES.register("retrieval")(Score(
    "retrieval", "share of copy steps at which the head's argmax key is the copied needle "
    "token (Wu et al.; `retrieval_scores`, joined to the census table)",
    lambda means: None, 700))
SCORES.register("syntax")(Score(
    "syntax_*", "the head's best dependency relation (`syntax_relation`, `syntax_direction`), "
    "its accuracy, the best fixed-offset baseline's, their margin and the number of arcs "
    "(Clark et al.; `syntax`, joined to the census table)", lambda means: None, 800,
    ("syntax_accuracy", "syntax_baseline", "syntax_margin", "syntax_count")))
