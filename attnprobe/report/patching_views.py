"""The notebook view of a patching table (``ap.patch.heads`` / ``path`` / ``attribution``),
registered as ``patching`` in :data:`attnprobe.core.html_view.RENDERERS` (imported by
:mod:`attnprobe.report.views`), and the report's patching section.

The view: the mean normalised effect per patch (layer × head, or heads × position for
``positions="each"``) with a tooltip per cell, the notes (examples whose clean and corrupted
metric are equal), the per-patch summary collapsed (:func:`patching_body`: the report's
section), and the whole table.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.patch.table import summary
from attnprobe.report import sections
from attnprobe.report.charts import heatmap, number
from attnprobe.report.notebook import fragment
from attnprobe.report.result_figures import head_heatmap

__all__ = ["patching_body", "patching_html"]

MEANING = {"denoising": "share of the clean−corrupt difference the patch restores",
           "noising": "share of the clean−corrupt difference the patch destroys"}


def _name(row: pd.Series) -> str:
    if pd.isna(row["layer"]):
        return "all"
    return f"L{int(row['layer'])}" if pd.isna(row["head"]) else \
        f"L{int(row['layer'])}H{int(row['head'])}"


def _tip(row: pd.Series) -> str:
    where = "" if pd.isna(row["position"]) else f" at position {int(row['position'])}"
    return (f"{_name(row)}{where}: effect {number(row['effect'])} (patched "
            f"{number(row['patched'])}; clean {number(row['clean'])}, corrupt "
            f"{number(row['corrupt'])}), mean of {int(row['n_examples'])} example(s)")


def _figure(means: pd.DataFrame, caption: str) -> Any:
    """Layer × head (one row per head) or patches × positions."""
    if means["position"].isna().all() and means["head"].notna().all() \
            and means["layer"].notna().all() and not means[["layer", "head"]].duplicated().any():
        return head_heatmap(means.astype({"layer": int, "head": int}), "effect", _tip,
                            caption=caption)
    rows = list(dict.fromkeys(_name(r) for _, r in means.iterrows()))
    cols = sorted({int(p) for p in means["position"].dropna()}) or [None]
    values = np.full((len(rows), len(cols)), np.nan)
    tips = [["" for _ in cols] for _ in rows]
    for _, row in means.iterrows():
        r = rows.index(_name(row))
        c = 0 if pd.isna(row["position"]) else cols.index(int(row["position"]))
        values[r, c] = float(row["effect"])
        tips[r][c] = _tip(row)
    names = ["all" if c is None else str(c) for c in cols]
    return heatmap(values, rows, names, tips, caption=caption, rotate_columns=len(cols) > 12)


def patching_body(table: pd.DataFrame, of: int | None = None) -> Any:
    """A patching table: the mean effect per patch (a figure per experiment, site,
    direction and metric), the notes, the per-patch summary (collapsed). ``of``: the corpus
    the pairs were taken from (said)."""
    frame = pd.DataFrame(table)
    means = summary(frame)
    figures, notes = [], list(table.attrs.get("notes", []))
    groups = ["experiment", "site", "direction", "metric"] + \
        [c for c in ("receivers", "into") if c in means.columns]
    for key, part in means.groupby(groups, sort=False, dropna=False):
        name, site, direction, metric = key[:4]
        where = f"{site} → {key[5]}" if len(key) > 5 else site
        if part["effect"].notna().any():
            figures.append(_figure(part, f"{name} {where} ({direction}), {metric}: "
                                         f"{MEANING.get(direction, 'effect')}"))
    n = frame["example_id"].nunique()
    corpus = f" (the first {n} of {of} texts, each with its corrupted input)" \
        if of is not None and of > n else ""
    note = (f"{n} example pair(s){corpus}; effect = "
            "(patched − corrupt)/(clean − corrupt) when denoising, "
            "(clean − patched)/(clean − corrupt) when noising.")
    if notes:
        note += " " + " ".join(notes)
    return sections.result(note, figures, means, "mean per patch")


@RENDERERS.register("patching")
def patching_html(table: pd.DataFrame) -> str:
    """A patching table: :func:`patching_body`, then the table itself."""
    return fragment(patching_body(table) + sections.table(pd.DataFrame(table), max_rows=200))
