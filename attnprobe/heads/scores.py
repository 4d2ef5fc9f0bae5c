"""The census reducer and the wide per-head score table built from its tally.

Every column is a :class:`~attnprobe.heads.stats.Score` declared next to the statistic it
reads (:mod:`attnprobe.heads.stats`), in the order of their ranks; :func:`score_table`
lists them (the README's score table is generated from them: :mod:`attnprobe.readme.scores`).
Means are over every real query row unless a score says otherwise; ``syntax_*`` columns come
from :mod:`attnprobe.heads.dependencies`.
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from attnprobe.core.reducers import Reducer, Tally
from attnprobe.core.tokens import token_classes
from attnprobe.heads.census_stats import CensusStats
from attnprobe.heads.stats import Means, ranked_scores

INDEX = ["stack", "kind", "layer", "head", "head_id"]
DEFAULT_MAX_OFFSET = 64
"""Offsets beyond ±64 tokens share one ``far`` bin by default: a bin per offset would make
every block of a long input cost O(length) statistics (and ``.offsets()`` a table that long);
inputs of up to 65 tokens keep every offset."""


def census_reducers(tokenizer: Any = None, *, max_offset: int | None = DEFAULT_MAX_OFFSET,
                    classes: dict[str, torch.Tensor] | None = None) -> list[Reducer]:
    """The census statistics as one streaming reducer. Token-class, token-match and segment
    statistics need a tokenizer (for its special and punctuation ids), or its ``classes``
    (:func:`~attnprobe.core.tokens.token_classes`). Offsets beyond ``±max_offset`` are
    pooled into ``offset@far`` / ``argmax@far`` / ``argmax_nosink@far`` (``None``: a bin per
    offset, which costs O(length) statistics per block on long inputs)."""
    if classes is None:
        classes = token_classes(tokenizer) if tokenizer is not None else {}
    return [CensusStats(classes=classes, max_offset=max_offset)]


def wide_scores(tally: Tally, *, window: int = 3, extra: pd.DataFrame | None = None
                ) -> pd.DataFrame:
    """One row per head with every score column (:func:`score_table`) from a tally.

    ``window``: offsets ±window get a column each; ``extra``: more per-head columns (e.g.
    syntax) merged on ``stack, kind, layer, head``.
    """
    wide, counts = tally.wide()
    if wide.empty:
        return pd.DataFrame(columns=INDEX)
    means = Means(wide.reset_index(drop=True), counts.reset_index(drop=True), window)
    columns: dict[str, Any] = {}
    for score in ranked_scores():
        found = score.compute(means)
        if found is not None:
            columns.update(found if isinstance(found, dict) else {score.name: found})
    out = pd.concat([wide.index.to_frame(index=False), pd.DataFrame(columns)], axis=1)
    if extra is not None and not extra.empty:
        keys = ["stack", "kind", "layer", "head"]
        out = out.merge(extra.drop(columns=["head_id"], errors="ignore"), on=keys, how="left")
    return out


def score_table() -> pd.DataFrame:
    """Every score column and what it means, in table order (``score``, ``meaning``)."""
    scores = ranked_scores()
    return pd.DataFrame({"score": [score.name for score in scores],
                         "meaning": [score.meaning for score in scores]})


def offset_table(tally: Tally) -> pd.DataFrame:
    """Long table of where heads look: ``stack, kind, layer, head, head_id, offset, mass,
    argmax_share`` for every relative offset seen (``offset`` is an int; pooled far offsets
    are left out)."""
    frame = tally.to_frame()
    frame = frame[frame["statistic"].str.match(r"^(offset|argmax)@[+-]\d+$")]
    if frame.empty:
        return pd.DataFrame(columns=[*INDEX, "offset", "mass", "argmax_share"])
    parts = frame["statistic"].str.split("@", expand=True)
    what = parts[0].map({"offset": "mass", "argmax": "argmax_share"})
    frame = frame.assign(what=what, offset=parts[1].astype(int))
    long = frame.pivot_table(index=[*INDEX, "offset"], columns="what", values="value",
                             sort=False).reset_index()
    long.columns.name = None
    return long.sort_values([*INDEX[:4], "offset"]).reset_index(drop=True)
