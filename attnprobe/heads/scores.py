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
sink               mass on the head's sink keys: the first token, the start tokens (BOS/CLS)
                   and its column sinks — keys taking > 0.3 of the mass in most rows that see
                   them, e.g. ``[SEP]`` or ``.`` (see :mod:`attnprobe.heads.sinks`)
sink_rate          share of rows whose sink keys take > 0.3 of the mass (Gu et al.'s ε)
column_sink        mass on column sinks that are neither the first nor a start token
*_nosink           the same score judged on the mass left after the sink keys, renormalised
                   per row and averaged with each row weighted by that mass (``1 - sink``
                   of the row): ``prev_nosink``, ``self_nosink``, ``next_nosink``,
                   ``max_weight_nosink``, ``chance_weight_nosink`` (1 / keys that are no
                   sink), ``entropy_norm_nosink`` (over ln of those keys),
                   ``pos_score_nosink`` and ``pos_offset_nosink`` (argmax among them).
                   NaN for a head with no mass left. The label rules read these.
block              share of content attention kept in the query's own segment (pairs only)
duplicate ...      token-match scores on the corpus: ``duplicate``, ``induction`` (earlier
                   keys) and ``duplicate_ahead``, ``induction_ahead`` (later keys), over rows
                   where the pattern exists
*_rows             how many query rows each of those four is a mean over (rows that hold an
                   earlier / later copy of their token): ``duplicate_rows``,
                   ``induction_rows``, ``duplicate_ahead_rows``, ``induction_ahead_rows``;
                   the copying labels trust the corpus scores only over enough rows
rep_*              the same on repeated random tokens inside the tokenizer's own template,
                   ``[CLS] x x [SEP]``, ``<s> x x`` ... (``rep_prev``, ``rep_duplicate``,
                   ``rep_induction``, ``rep_duplicate_ahead``, ``rep_induction_ahead``;
                   :mod:`attnprobe.heads.probe`)
syntax_*           best dependency relation of the head (see ``attnprobe.heads.dependencies``)
=================  ==========================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
import torch

from attnprobe.core.reducers import Reducer, Tally
from attnprobe.core.tokens import token_classes
from attnprobe.heads.census_stats import CensusStats
from attnprobe.heads.sinks import NAMED_OFFSETS

INDEX = ["stack", "kind", "layer", "head", "head_id"]
SINK_COLUMNS = ("sink", "sink_rate", "column_sink")
NOSINK_COLUMNS = ("prev", "self", "next", "max_weight", "chance_weight", "entropy_norm")
COPY_COLUMNS = ("duplicate", "induction", "duplicate_ahead", "induction_ahead")  # with _rows
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
    found = _argmax_shares(wide, "argmax")
    if found is not None:
        out["pos_score"], out["pos_offset"] = found[0].to_numpy(), found[1].to_numpy()
    take("first")
    for column in ("cls", "sep", "bos", "eos", "special", "punct"):
        if column in wide:
            take(column)
    if "sink" in wide:
        _sink_free(out, wide)
    for column in ("block", *COPY_COLUMNS, "rep_prev",
                   "rep_duplicate", "rep_induction", "rep_duplicate_ahead",
                   "rep_induction_ahead"):
        if column in wide:
            take(column)
    copies = [c for c in COPY_COLUMNS if c in wide]
    if copies:  # a head with no such row has no entry: 0 rows
        rows = frame[frame["statistic"].isin(copies)].pivot_table(
            index=INDEX, columns="statistic", values="count", sort=False)
        rows = rows.reindex(pd.MultiIndex.from_frame(out[INDEX])).fillna(0.0)
        for column in copies:
            out[f"{column}_rows"] = rows[column].to_numpy().astype(int) if column in rows else 0
    if extra is not None and not extra.empty:
        keys = ["stack", "kind", "layer", "head"]
        out = out.merge(extra.drop(columns=["head_id"], errors="ignore"), on=keys, how="left")
    return out


def _argmax_shares(wide: pd.DataFrame, prefix: str) -> tuple[pd.Series, pd.Series] | None:
    """(share at the most common argmax offset, that offset) from ``<prefix>@<offset>``
    columns, or None without such columns."""
    columns = [c for c in wide.columns if c.startswith(prefix + "@") and c != prefix + "@far"]
    if not columns:
        return None
    shares = wide[columns].fillna(0.0)
    return shares.max(axis=1), shares.idxmax(axis=1).map(lambda c: int(c.split("@")[1]))


def _sink_free(out: pd.DataFrame, wide: pd.DataFrame) -> None:
    """The sink columns and the ``*_nosink`` scores (module docstring) into ``out``."""
    for column in SINK_COLUMNS:
        out[column] = wide[column].to_numpy()
    for column in NOSINK_COLUMNS:
        name = f"{column}_nosink"
        out[name] = wide[name].to_numpy() if name in wide else float("nan")
    rest = wide["rest"].to_numpy() if "rest" in wide else None
    found = _argmax_shares(wide, "argmax_nosink")
    if found is None or rest is None:
        out["pos_score_nosink"] = out["pos_offset_nosink"] = float("nan")
        return
    top, offset = found
    has_rest = rest > 0
    # argmax_nosink@d and rest are both means over every row: their ratio is Σ r·1[d] / Σ r
    out["pos_score_nosink"] = np.divide(top.to_numpy(), rest, out=np.full(len(rest), np.nan),
                                        where=has_rest)
    offsets = offset.to_numpy()
    out["pos_offset_nosink"] = offsets if has_rest.all() else \
        np.where(has_rest, offsets.astype(float), np.nan)


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
