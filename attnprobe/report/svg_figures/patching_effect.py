"""The mean effect of each patch as SVG heatmaps (the twin of
:func:`attnprobe.plot.patching_effect`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.report.charts import heatmap, number
from attnprobe.report.figure_svg import svg_renderer
from attnprobe.report.result_figures import head_heatmap

RANK = 70

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


@svg_renderer("patching_effect")
def render(means: pd.DataFrame) -> list[Any]:
    """A figure per experiment, site, direction and metric of the per-patch means (those
    with an effect)."""
    figures = []
    groups = ["experiment", "site", "direction", "metric"] + \
        [c for c in ("receivers", "into") if c in means.columns]
    for key, part in means.groupby(groups, sort=False, dropna=False):
        name, site, direction, metric = key[:4]
        where = f"{site} → {key[5]}" if len(key) > 5 else site
        if part["effect"].notna().any():
            figures.append(_figure(part, f"{name} {where} ({direction}), {metric}: "
                                         f"{MEANING.get(direction, 'effect')}"))
    return figures
