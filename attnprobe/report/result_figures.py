"""The report's figures of attribution, perturbation and checkpoint-diff results (inline SVG).

The figures :mod:`attnprobe.plot` also draws (agreement by layer, token heat, effect per
head) come from the figure's own data function and its SVG renderer
(:func:`~attnprobe.report.figure_svg.svg_figures`); the diff figures and the layer × head
heatmap helper are the report's own. Vector SVG with a tooltip per cell and point, built by
:mod:`attnprobe.report.charts`. A result a figure cannot read gives no figure (the page then
shows the table instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.report.charts import heatmap, number
from attnprobe.report.figure_svg import svg_figures

__all__ = ["agreement_figures", "diff_figures", "effect_figures", "head_heatmap",
           "token_heat_figures"]


def head_heatmap(table: pd.DataFrame, value: str, tip: Callable[[pd.Series], str], *,
                 caption: str) -> Any:
    """Layer × head heatmap of ``table[value]`` (one row per head; ``stack``/``kind``
    columns, when present, give a grid row per (stack, kind, layer)). Cells are keyed
    ``L<layer>H<head>`` and titled ``tip(row)``.

    Shapes: ``table`` has one row per head; the figure is ``[rows, heads]``.
    """
    frame = table.copy()
    for column in ("stack", "kind"):
        if column not in frame.columns:
            frame[column] = ""
    frame = frame.sort_values(["stack", "kind", "layer", "head"], kind="stable")
    rows = list(dict.fromkeys(zip(frame["stack"].astype(str), frame["kind"].astype(str),
                                  frame["layer"].astype(int), strict=True)))
    heads = sorted({int(h) for h in frame["head"]})
    several = len({(s, k) for s, k, _ in rows}) > 1
    values = np.full((len(rows), len(heads)), np.nan)
    tips = [["" for _ in heads] for _ in rows]
    keys = [["" for _ in heads] for _ in rows]
    row_of, col_of = {r: i for i, r in enumerate(rows)}, {h: i for i, h in enumerate(heads)}
    for _, item in frame.iterrows():
        r = row_of[(str(item["stack"]), str(item["kind"]), int(item["layer"]))]
        c = col_of[int(item["head"])]
        values[r, c] = float(item[value])
        tips[r][c] = tip(item)
        keys[r][c] = f"L{int(item['layer'])}H{int(item['head'])}"
    names = [f"{s} {k} L{la}" if several else f"L{la}" for s, k, la in rows]
    return heatmap(values, names, [f"H{h}" for h in heads], tips, caption=caption, keys=keys)


# ------------------------------------------------------------------- figures of ap.plot
def effect_figures(table: pd.DataFrame) -> list[Any]:
    """Effect per head of a ``perturb.run`` table (:mod:`~attnprobe.report.svg_figures.
    head_effects`); none for a table it cannot read."""
    try:
        return svg_figures("head_effects", table)
    except InputError:
        return []


def agreement_figures(comparison: Any) -> list[Any]:
    """Agreement of each attention view with each attribution method by layer
    (:mod:`~attnprobe.report.svg_figures.agreement_by_layer`); none for a comparison
    without one."""
    try:
        return svg_figures("agreement_by_layer", comparison)
    except InputError:
        return []


def token_heat_figures(comparison: Any) -> list[Any]:
    """Scores on the tokens of the first examples
    (:mod:`~attnprobe.report.svg_figures.token_heat`); none for a comparison without
    per-token scores."""
    try:
        return svg_figures("token_heat", comparison)
    except InputError:
        return []


# ------------------------------------------------------------------------------ diff
def diff_figures(diff: Any) -> list[Any]:
    """Per head, how a checkpoint diff changed it: the attention change (mean JS per query
    row) when the diff measured it, and whether the label changed."""
    heads = diff.heads()

    def tip(row: pd.Series) -> str:
        text = f"{row['head_id']}: {row.get('label_a', '')} → {row.get('label_b', '')}"
        if "js" in row and pd.notna(row["js"]):
            text += f"; JS {number(row['js'])} nats, cosine {number(row.get('cosine'))}"
        return text
    out = []
    if "js" in heads.columns and heads["js"].notna().any():
        out.append(head_heatmap(heads, "js", tip,
                                caption="attention change: mean JS per row (nats)"))
    if "label_changed" in heads.columns:
        out.append(head_heatmap(heads.assign(changed=heads["label_changed"].astype(float)),
                                "changed", tip, caption="label changed (1) or kept (0)"))
    return out
