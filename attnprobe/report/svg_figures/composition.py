"""Q/K/V-composition over the random baseline as SVG writer × reader heatmaps (the twin of
:func:`attnprobe.plot.composition`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.heads.head_composition import composition_matrix
from attnprobe.report.charts import heatmap, number
from attnprobe.report.figure_svg import svg_renderer

RANK = 91
MATRIX_HEADS = 48  # writers (and readers) drawn per composition matrix; the strongest kept


def strongest(matrix: pd.DataFrame, limit: int) -> pd.DataFrame:
    """``matrix`` cut to the ``limit`` rows and columns with the largest values (model order
    kept), when it is larger."""
    if matrix.shape[0] > limit:
        keep = set(matrix.max(axis=1).sort_values(ascending=False).index[:limit])
        matrix = matrix.loc[[w for w in matrix.index if w in keep]]
    if matrix.shape[1] > limit:
        keep = set(matrix.max(axis=0).sort_values(ascending=False).index[:limit])
        matrix = matrix[[r for r in matrix.columns if r in keep]]
    return matrix


def _matrix_figure(table: pd.DataFrame, kind: str) -> Any:
    """Writer × reader ``log2(score / baseline)`` of one kind (0: as random matrices)."""
    whole = composition_matrix(table, kind, "ratio")
    matrix = strongest(whole, MATRIX_HEADS)
    ratio = matrix.to_numpy(dtype=float)
    score = composition_matrix(table, kind).loc[matrix.index, matrix.columns].to_numpy(
        dtype=float)
    base = float(table.loc[table["kind"] == kind, "baseline"].mean())
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.log2(ratio)
    tips = [[f"{w} → {r}: {kind}-composition {number(score[i, j])} "
             f"({number(ratio[i, j])} × baseline {number(base)})"
             for j, r in enumerate(matrix.columns)] for i, w in enumerate(matrix.index)]
    cut = "" if matrix.shape == whole.shape else \
        f"; the {matrix.shape[0]} writers × {matrix.shape[1]} readers of the strongest pairs"
    return heatmap(values, list(matrix.index), list(matrix.columns), tips,
                   caption=f"{kind}-composition: log2(score / baseline {number(base)}){cut}",
                   rotate_columns=True)


@svg_renderer("composition")
def render(table: pd.DataFrame) -> list[Any]:
    """A heatmap per kind of a Composition's table, in the table's order."""
    return [_matrix_figure(table, kind) for kind in dict.fromkeys(table["kind"].astype(str))]
