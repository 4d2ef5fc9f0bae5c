"""Scores on the tokens, a row per method or attention view, as SVG heatmaps (the twin of
:func:`attnprobe.plot.token_heat`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.report.charts import heatmap, number
from attnprobe.report.figure_svg import svg_renderer

RANK = 51
MAX_EXAMPLES = 3  # token heat figures drawn (the first examples)


@svg_renderer("token_heat")
def render(table: pd.DataFrame, max_examples: int = MAX_EXAMPLES) -> list[Any]:
    """The first ``max_examples`` examples of the per-token table: a row per method or
    view, each row divided by its largest ``|score|`` (as ``plot.token_heat``)."""
    out = []
    for example in list(dict.fromkeys(table["example_id"].astype(str)))[:max_examples]:
        part = table[table["example_id"].astype(str) == example]
        if "target" in part.columns:
            targets = [t for t in dict.fromkeys(part["target"].fillna("").astype(str)) if t]
            if targets:
                cells = part["target"].fillna("").astype(str)
                part = part[(cells == targets[0]) | (cells == "")]
        methods = list(dict.fromkeys(part["method"].astype(str)))
        first = part[part["method"].astype(str) == methods[0]].sort_values("position")
        tokens = list(first["token"].astype(str))
        values = np.full((len(methods), len(tokens)), np.nan)
        raw = np.full_like(values, np.nan)
        for r, method in enumerate(methods):
            rows = part[part["method"].astype(str) == method].drop_duplicates("position")
            for _, item in rows.iterrows():
                if 0 <= int(item["position"]) < len(tokens):
                    raw[r, int(item["position"])] = float(item["score"])
            peak = np.nanmax(np.abs(raw[r])) if np.isfinite(raw[r]).any() else 0.0
            values[r] = raw[r] / peak if peak > 0 else 0.0 * raw[r]
        tips = [[f"{tokens[c]} (position {c}), {methods[r]}: score {number(raw[r, c])}"
                 for c in range(len(tokens))] for r in range(len(methods))]
        out.append(heatmap(values, methods, tokens, tips, rotate_columns=True, cell=18,
                           caption=f"example {example}: score / row max |score|"))
    return out
