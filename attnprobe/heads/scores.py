"""The census reducers and the wide per-head score table built from their tally.

Score columns (one row per head; means over every real query row unless noted):

=================  ==========================================================================
column             meaning
=================  ==========================================================================
entropy            row entropy, nats
entropy_norm       row entropy / ln(keys the row may attend to); 1.0 = uniform
chance_weight      mean 1 / (keys the row may attend to): the max weight of a uniform row
max_weight         largest weight of the row (Voita's confidence)
prev, self, next   mass on the key at offset -1, 0, +1 (Clark)
offset-k/offset+k  mass at offset ±k for 2 <= k <= ``window``
distance           mean attention distance Σ_j a_ij |i - j| in tokens (Vig & Belinkov)
pos_score          share of rows whose argmax is at the most common offset (Voita)
pos_offset         that offset
first              mass on the first real token (attention sink, Xiao et al.; Gu et al.'s α_1)
cls, sep, bos, eos mass on that special token (those the tokenizer has)
special            mass on all special tokens
punct              mass on punctuation tokens
block              share of content attention kept in the query's own segment (pairs only)
duplicate ...      token-match scores on the corpus: ``duplicate``, ``induction`` (earlier
                   keys) and ``duplicate_ahead``, ``induction_ahead`` (later keys), over rows
                   where the pattern exists
rep_*              the same on repeated random tokens (``rep_prev``, ``rep_duplicate``,
                   ``rep_induction``, ``rep_duplicate_ahead``, ``rep_induction_ahead``)
syntax_*           best dependency relation of the head (see ``attnprobe.heads.dependencies``)
=================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import torch

from attnprobe.core.reducers import Reducer, Tally
from attnprobe.core.tokens import token_classes
from attnprobe.heads.census_stats import CensusStats

INDEX = ["stack", "kind", "layer", "head", "head_id"]
NAMED_OFFSETS = {-1: "prev", 0: "self", 1: "next"}


def census_reducers(tokenizer: Any = None, *, max_offset: int | None = None,
                    classes: dict[str, torch.Tensor] | None = None) -> list[Reducer]:
    """The census statistics as one streaming reducer. Token-class, token-match and segment
    statistics need a tokenizer (for its special and punctuation ids), or its ``classes``
    (:func:`~attnprobe.core.tokens.token_classes`)."""
    if classes is None:
        classes = token_classes(tokenizer) if tokenizer is not None else {}
    return [CensusStats(classes=classes, max_offset=max_offset)]


def _offset_column(offset: int) -> str:
    return NAMED_OFFSETS.get(offset, f"offset{offset:+d}")


def wide_scores(tally: Tally, *, window: int = 3, extra: pd.DataFrame | None = None
                ) -> pd.DataFrame:
    """One row per head with the census columns (module docstring) from a tally.

    ``extra``: more per-head columns (e.g. syntax) merged on ``stack, kind, layer, head``.
    """
    frame = tally.to_frame()
    if frame.empty:
        return pd.DataFrame(columns=INDEX)
    wide = frame.pivot_table(index=INDEX, columns="statistic", values="value", sort=False)
    wide.columns.name = None
    out = wide.reset_index()[INDEX].copy()

    def take(column: str, source: str | None = None) -> None:
        source = source or column
        out[column] = wide[source].to_numpy() if source in wide else float("nan")

    for column in ("entropy", "entropy_norm", "chance_weight", "max_weight"):
        take(column)
    for offset in range(-window, window + 1):
        take(_offset_column(offset), f"offset@{offset:+d}")
    take("distance")
    argmax = [c for c in wide.columns if c.startswith("argmax@") and c != "argmax@far"]
    if argmax:
        shares = wide[argmax].fillna(0.0)
        out["pos_score"] = shares.max(axis=1).to_numpy()
        out["pos_offset"] = [int(c.split("@")[1]) for c in shares.idxmax(axis=1)]
    take("first")
    for column in ("cls", "sep", "bos", "eos", "special", "punct", "block", "duplicate",
                   "induction", "duplicate_ahead", "induction_ahead", "rep_prev",
                   "rep_duplicate", "rep_induction", "rep_duplicate_ahead",
                   "rep_induction_ahead"):
        if column in wide:
            take(column)
    if extra is not None and not extra.empty:
        keys = ["stack", "kind", "layer", "head"]
        out = out.merge(extra.drop(columns=["head_id"], errors="ignore"), on=keys, how="left")
    return out


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
