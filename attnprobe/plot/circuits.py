"""Direct logit attribution and composition scores as figures.

- :func:`logit_attribution`: each head's mean direct part of the metric as a layer × head
  heatmap, next to a bar per component group (embeddings, each layer's heads and MLP,
  biases), from :func:`attnprobe.heads.logit_attribution` (or its ``.table``);
- :func:`composition`: the writer heads × reader heads matrix of each composition kind, from
  :func:`attnprobe.heads.composition` (or its ``.table``), with the random baseline in the
  title.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.heads.direct_logits import COLUMNS as DLA_COLUMNS
from attnprobe.heads.direct_logits import component_means, head_means
from attnprobe.heads.head_composition import COLUMNS as COMPOSITION_COLUMNS
from attnprobe.heads.head_composition import composition_matrix
from attnprobe.plot.common import check_table, known_subset, new_figure, seaborn
from attnprobe.plot.figure import figure

RANK = 90  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["composition", "composition_table", "logit_attribution", "logit_table"]

GROUP_COLOURS = {"embed": "#7f7f7f", "head": "#d62728", "rest": "#ff9896", "mlp": "#1f77b4",
                 "bias": "#bcbd22"}


def _table(result: Any, columns: Sequence[str], what: str) -> pd.DataFrame:
    table = getattr(result, "table", result)
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"expected {what} or its .table (a DataFrame); got "
                         f"{type(result).__name__}")
    return check_table(table, columns, f"{what} table")


def logit_table(result: Any) -> pd.DataFrame:
    """The tidy table the logit-attribution figure draws: a ``LogitAttribution``'s
    ``.table`` (one row per example and component), or that table as it is.

    Example:
        >>> found = ap.heads.logit_attribution(lm, lm_tok, [prompt], "logit:t05")
        >>> logit_table(found) is found.table
        True
    """
    return _table(result, DLA_COLUMNS, "a LogitAttribution")


def composition_table(result: Any) -> pd.DataFrame:
    """The tidy table the composition figure draws: a ``Composition``'s ``.table`` (one row
    per writer, reader and kind), or that table as it is.

    Example:
        >>> found = ap.heads.composition(lm)
        >>> composition_table(found) is found.table
        True
    """
    return _table(result, COMPOSITION_COLUMNS, "a Composition")


def _groups(means: pd.DataFrame) -> pd.DataFrame:
    """Components summed into bar groups: ``embed``, then per layer ``L<i> heads`` (with the
    heads outside a scope) and ``L<i> mlp``, then every bias as ``biases``."""
    rows = []
    for _, row in means.iterrows():
        kind, layer = str(row["kind"]), row["layer"]
        if kind in ("head", "rest"):
            rows.append((f"L{layer} heads", "head", (int(layer), 0), row["value"]))
        elif kind == "mlp":
            rows.append((f"L{layer} mlp", "mlp", (int(layer), 1), row["value"]))
        elif kind == "bias":
            rows.append(("biases", "bias", (np.inf, 0), row["value"]))
        else:
            rows.append((str(row["component"]), kind, (-1, 0), row["value"]))
    frame = pd.DataFrame(rows, columns=["group", "kind", "order", "value"])
    frame = frame.groupby(["group", "kind", "order"], sort=False, as_index=False)["value"].sum()
    return frame.sort_values("order", kind="stable").reset_index(drop=True)


@figure(data=logit_table, rank=90,
        shows="each head's direct part of a metric (layer × head) and the component groups as bars",
        source="LogitAttribution / its table")
def logit_attribution(result: Any, *, annotate: bool | None = None, cmap: str = "RdBu_r"
                      ) -> Any:
    """Where a metric comes from: each head's mean direct part (layer × head heatmap, 0 in
    white) and every group of components as a bar (the bars sum to the mean metric).

    Args:
        result: a :class:`~attnprobe.heads.LogitAttribution` or its ``.table``.
        annotate: write each head's value in its cell (default: grids up to 12 × 16).
        cmap: the diverging colour map of the heatmap.

    Returns:
        A matplotlib ``Figure`` with two Axes: the heatmap (one ``QuadMesh`` of layers ×
        heads) and the horizontal bars (one per group, in model order).

    Example:
        >>> dla = ap.heads.logit_attribution(lm, lm_tok, [prompt], "logit:next",
        ...                                  metric_positions="all")
        >>> fig = ap.plot.logit_attribution(dla)
        >>> heat = fig.axes[0]                          # layer × head
        >>> heat.get_title(), len(heat.get_yticklabels()), len(heat.get_xticklabels())
        ('logit:next per head, 1 example(s)', 2, 4)
    """
    table = logit_table(result)
    n_layers = getattr(result, "n_layers", None)
    n_heads = getattr(result, "n_heads", None)
    heads = head_means(table, n_layers, n_heads)
    groups = _groups(component_means(table))
    values = heads.to_numpy(dtype=float)
    finite = values[np.isfinite(values)]
    limit = float(np.abs(finite).max()) if finite.size else 1.0
    if annotate is None:
        annotate = values.shape[0] <= 12 and values.shape[1] <= 16
    fig = new_figure(4.0 + 0.5 * values.shape[1], 1.8 + 0.4 * max(values.shape[0],
                                                                   len(groups) * 0.6))
    left, right = fig.subplots(1, 2, width_ratios=[max(values.shape[1], 3), 4])
    seaborn().heatmap(values, ax=left, cmap=cmap, vmin=-limit or -1, vmax=limit or 1,
                      mask=~np.isfinite(values), annot=annotate, fmt=".2g",
                      annot_kws={"fontsize": 6}, linewidths=0.5, linecolor="white",
                      cbar_kws={"label": "mean direct part"})
    left.set_xticks(np.arange(values.shape[1]) + 0.5, labels=[str(h) for h in heads.columns])
    left.set_yticks(np.arange(values.shape[0]) + 0.5, labels=[str(v) for v in heads.index])
    left.tick_params(axis="y", labelrotation=0)
    left.set_xlabel("head")
    left.set_ylabel("layer")
    specs = list(dict.fromkeys(table["metric"].astype(str)))
    metric = specs[0] if len(specs) == 1 else f"{len(specs)} metrics"
    left.set_title(f"{metric} per head, {table['example_id'].nunique()} example(s)",
                   fontsize=9)
    order = np.arange(len(groups))[::-1]  # the first group on top
    right.barh(order, groups["value"], color=[GROUP_COLOURS.get(k, "#999999")
                                              for k in groups["kind"]])
    right.set_yticks(order, labels=list(groups["group"]))
    right.axvline(0, color="black", linewidth=0.6)
    right.set_xlabel("mean direct part")
    right.set_title(f"sum {groups['value'].sum():.3g}", fontsize=9)
    return fig


@figure(data=composition_table, rank=91,
        shows="Q/K/V-composition, writer heads × reader heads per kind",
        source="Composition / its table")
def composition(result: Any, *, kinds: Sequence[str] | None = None, value: str = "score",
                annotate: bool | None = None, cmap: str = "viridis") -> Any:
    """Composition between heads: writer heads (rows) × reader heads (columns) per kind.

    Args:
        result: a :class:`~attnprobe.heads.Composition` or its ``.table``.
        kinds: which kinds (default: every kind the table has), one panel each.
        value: ``score``, ``ratio`` (score / random baseline) or ``baseline``.
        annotate: write each value in its cell (default: up to 16 × 16 cells).
        cmap: the colour map.

    Returns:
        A matplotlib ``Figure`` with one Axes per kind, each one ``QuadMesh`` (NaN where the
        reader is not in a later layer); the titles give the baseline.

    Example:
        >>> comp = ap.heads.composition(lm)             # pre-norm: 2 layers × 4 heads
        >>> fig = ap.plot.composition(comp, kinds=["k", "v"], value="ratio")
        >>> [a.get_title().split(" (")[0] for a in fig.axes[:2]]    # then one colour bar
        ['k-composition', 'v-composition']
    """
    table = composition_table(result)
    present = list(dict.fromkeys(table["kind"].astype(str)))
    chosen = known_subset(present, kinds, "composition kind", "in the table")
    matrices = [composition_matrix(table, kind, value) for kind in chosen]
    rows, cols = matrices[0].shape
    if annotate is None:
        annotate = rows <= 16 and cols <= 16
    fig = new_figure(1.0 + len(chosen) * (2.0 + 0.42 * cols), 1.8 + 0.32 * rows)
    axes = np.atleast_1d(fig.subplots(1, len(chosen), squeeze=False)[0])
    finite = np.concatenate([m.to_numpy(float).ravel() for m in matrices])
    finite = finite[np.isfinite(finite)]
    high = float(finite.max()) if finite.size else 1.0
    for ax, kind, matrix in zip(axes, chosen, matrices, strict=True):
        values = matrix.to_numpy(dtype=float)
        seaborn().heatmap(values, ax=ax, cmap=cmap, vmin=0, vmax=high or 1,
                          mask=~np.isfinite(values), annot=annotate, fmt=".2g",
                          annot_kws={"fontsize": 5}, cbar=ax is axes[-1],
                          cbar_kws={"label": value})
        ax.set_xticks(np.arange(values.shape[1]) + 0.5, labels=list(matrix.columns),
                      rotation=90)
        ax.set_yticks(np.arange(values.shape[0]) + 0.5, labels=list(matrix.index), rotation=0)
        ax.set_xlabel("reader head")
        ax.set_ylabel("writer head" if ax is axes[0] else "")
        base = float(table.loc[table["kind"] == kind, "baseline"].mean())
        ax.set_title(f"{kind}-composition (baseline {base:.3f})", fontsize=9)
    return fig
