"""Notebook views of the weight- and logit-based head results: direct logit attribution,
QK/OV circuits and composition scores (registered in
:data:`attnprobe.core.html_view.RENDERERS`, like :mod:`attnprobe.report.notebook`).

==========================  ==================================================================
kind                        view
==========================  ==================================================================
``logit_attribution``       each head's mean part of the metric (layer × head), the components,
                            the table (collapsed)
``circuits``                copying score per head (layer × head), the table (collapsed)
``composition``             writer heads × reader heads per kind, the table (collapsed)
==========================  ==================================================================
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.report import sections
from attnprobe.report.charts import heatmap, number
from attnprobe.report.notebook import fragment
from attnprobe.report.result_figures import head_heatmap

__all__ = ["circuits_html", "composition_html", "logit_attribution_html"]


@RENDERERS.register("logit_attribution")
def logit_attribution_html(result: Any) -> str:
    """A LogitAttribution: heads as a layer × head heatmap, then every component's mean."""
    components = result.by_component()
    heads = components[components["kind"] == "head"]
    metric = ", ".join(dict.fromkeys(result.totals["metric"].astype(str)))

    def tip(row: pd.Series) -> str:
        return (f"L{int(row['layer'])}H{int(row['head'])}: {number(row['value'])} of {metric} "
                "(mean per example)")
    figures = [head_heatmap(heads.astype({"layer": int, "head": int}), "value", tip,
                            caption=f"direct part of {metric}")] if len(heads) else []
    note = (f"{len(result.totals)} example(s); the components of each sum to the model's "
            f"{metric} (largest gap {number(result.totals['gap'].abs().max())}).")
    body = sections.result(note, figures, components, "mean per component")
    return fragment(body + sections.table(result.table, max_rows=200))


@RENDERERS.register("circuits")
def circuits_html(result: Any) -> str:
    """A Circuits: the OV copying score per head, the per-head table."""
    table = result.table
    figures = []
    if "copying_score" in table.columns:
        def tip(row: pd.Series) -> str:
            return (f"L{int(row['layer'])}H{int(row['head'])}: copying score "
                    f"{number(row['copying_score'])}, |W_OV| {number(row['ov_norm'])}, "
                    f"|W_QK| {number(row['qk_norm'])}")
        figures.append(head_heatmap(table, "copying_score", tip,
                                    caption="OV copying score (Σλ / Σ|λ|)"))
    note = " ".join(["Weight-based circuits (norms folded).", *result.notes])
    return fragment(sections.result(note, figures, table, "per-head table"))


def _matrix_figure(result: Any, kind: str) -> Any:
    matrix = result.matrix(kind)
    values = matrix.to_numpy(dtype=float)
    base = result.baseline(kind)
    tips = [[f"{w} → {r}: {kind}-composition {number(values[i, j])} "
             f"({number(values[i, j] / base)} × baseline {number(base)})"
             for j, r in enumerate(matrix.columns)] for i, w in enumerate(matrix.index)]
    return heatmap(np.asarray(values), list(matrix.index), list(matrix.columns), tips,
                   caption=f"{kind}-composition (baseline {number(base)})",
                   rotate_columns=True)


@RENDERERS.register("composition")
def composition_html(result: Any) -> str:
    """A Composition: writer heads × reader heads per kind, the table collapsed."""
    figures = [_matrix_figure(result, kind) for kind in result.kinds]
    note = " ".join([f"Baseline: random matrices of the same shapes ({result.n_draws}² "
                     "pairs).", *result.notes])
    return fragment(sections.result(note, figures, result.table, "pair table"))
