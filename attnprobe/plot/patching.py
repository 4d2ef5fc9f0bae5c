"""Patching results as a figure: the mean normalised effect of each patch
(:func:`patching_effect`), from the tidy table of :func:`attnprobe.patch.heads`,
:func:`~attnprobe.patch.path` or :func:`~attnprobe.patch.attribution`.

Patches of every position at once give a **layer × head** heatmap; with ``positions="each"``
the rows are the heads (``L1H2``) and the columns the positions (**layer × position** at head
resolution). Patches over several heads (``per="layer"`` / ``"scope"``) get one column
(``all``) or one row (``L1``, ``all``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.patch.table import summary
from attnprobe.plot.common import axes_for, check_table, done, one_value, seaborn
from attnprobe.plot.figure import figure

RANK = 70  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["patch_means", "patching_effect"]

WHAT = "patching table"


def _name(layer: Any, head: Any) -> str:
    if pd.isna(layer):
        return "all"
    return f"L{int(layer)}" if pd.isna(head) else f"L{int(layer)}H{int(head)}"


def _grid(means: pd.DataFrame, value: str) -> tuple[np.ndarray, list[str], list[str], str,
                                                     str]:
    """``(values [rows, cols], row names, column names, x label, y label)``."""
    if means["position"].notna().any():
        rows = list(dict.fromkeys(_name(la, h) for la, h in zip(means["layer"], means["head"],
                                                                strict=True)))
        cols = sorted({int(p) for p in means["position"].dropna()})
        grid = np.full((len(rows), len(cols)), np.nan)
        for _, item in means.iterrows():
            if pd.isna(item["position"]):
                continue
            grid[rows.index(_name(item["layer"], item["head"])),
                 cols.index(int(item["position"]))] = item[value]
        return grid, rows, [str(c) for c in cols], "position", "head"
    layers = sorted({int(v) for v in means["layer"].dropna()}) or [None]
    heads = sorted({int(v) for v in means["head"].dropna()})
    several = means["head"].isna().any()
    cols = [str(h) for h in heads] + (["all"] if several else [])
    grid = np.full((len(layers), len(cols)), np.nan)
    for _, item in means.iterrows():
        r = 0 if pd.isna(item["layer"]) else layers.index(int(item["layer"]))
        c = cols.index("all" if pd.isna(item["head"]) else str(int(item["head"])))
        grid[r, c] = item[value]
    return grid, ["all" if la is None else str(la) for la in layers], cols, "head", "layer"


def patch_means(table: pd.DataFrame) -> pd.DataFrame:
    """The tidy table the patching figure draws: the mean of each patch over the examples
    (:func:`attnprobe.patch.summary`), or such a summary as it is.

    Example:
        >>> rows = pd.DataFrame({"experiment": "heads", "example_id": ["a", "b"],
        ...     "layer": 0, "head": 1, "position": None, "site": "output",
        ...     "direction": "denoising", "metric": "loss", "clean": 1.0, "corrupt": 0.0,
        ...     "patched": [0.2, 0.4], "effect": [0.2, 0.4]})
        >>> round(float(patch_means(rows)["effect"].iloc[0]), 6)
        0.3
    """
    return table if "n_examples" in table.columns else summary(table)


@figure(data=patch_means, rank=70,
        shows="mean normalised effect per patch, layer × head (heads × position for "
              "``positions=\"each\"``)",
        source="``patch.heads`` / ``path`` / ``attribution`` table")
def patching_effect(table: pd.DataFrame, *, value: str = "effect",
                    experiment: str | None = None, site: str | None = None,
                    direction: str | None = None, metric: str | None = None,
                    annotate: bool | None = None, cmap: str = "RdBu_r", ax: Any = None) -> Any:
    """The mean ``value`` (default the normalised ``effect``) of each patch over the examples:
    a layer × head heatmap, or heads × positions for ``positions="each"`` tables (module
    docstring). Colours are centred on 0 (an effect may be negative); ``annotate`` (default:
    grids up to 12 × 12) writes each mean in its cell.

    Args:
        table: a patching table (:mod:`attnprobe.patch.table`) or its
            :func:`attnprobe.patch.summary`.
        experiment / site / direction / metric: which rows, when the table holds several.
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); the heatmap is one ``QuadMesh``.

    Example:
        >>> model, tok = ap.load_model("ref:induction")
        >>> clean = ["t05 t11 t40 t03 t17 t42 t08 t55 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> corrupt = ["t60 t61 t62 t63 t01 t02 t04 t06 t05 t11 t40 t03 t17 t42 t08 t55"]
        >>> copies = list(range(9, 16))  # second-copy positions ([BOS] is position 0)
        >>> table = ap.patch.heads(model, tok, clean, corrupt, "logit:next",
        ...                        metric_positions=copies)
        >>> fig = ap.plot.patching_effect(table)
        >>> each = ap.patch.heads(model, tok, clean, corrupt, "logit:next", scope="layer:1",
        ...                       positions="each", metric_positions=copies)
        >>> fig = ap.plot.patching_effect(each)
    """
    check_table(table, ("layer", "head", "position", value), WHAT)
    for column, wanted in (("experiment", experiment), ("site", site),
                           ("direction", direction), ("metric", metric)):
        table = one_value(table, column, wanted, WHAT)
    means = patch_means(table)
    if "receivers" in means.columns and means["receivers"].nunique() > 1:
        raise InputError(f"{WHAT} holds several receiver sets; plot one at a time")
    grid, rows, cols, x_label, y_label = _grid(means, value)
    if not np.isfinite(grid).any():
        raise InputError(f"{WHAT}: every mean {value} is NaN (clean and corrupt equal?)")
    limit = float(np.nanmax(np.abs(grid))) or 1.0
    if annotate is None:
        annotate = grid.shape[0] <= 12 and grid.shape[1] <= 12
    fig, axes = axes_for(ax, 3.6 + 0.5 * len(cols), 1.6 + 0.4 * len(rows))
    seaborn().heatmap(grid, ax=axes, cmap=cmap, mask=~np.isfinite(grid), vmin=-limit,
                      vmax=limit, annot=annotate, fmt=".2g", annot_kws={"fontsize": 6},
                      linewidths=0.5, linecolor="white", cbar_kws={"label": f"mean {value}"})
    axes.set_xticks(np.arange(len(cols)) + 0.5, labels=cols)
    axes.set_yticks(np.arange(len(rows)) + 0.5, labels=rows)
    axes.tick_params(axis="y", labelrotation=0)
    axes.set_xlabel(x_label)
    axes.set_ylabel(y_label)
    first = means.iloc[0]
    name = str(first.get("experiment", "patching"))
    n = int(means["n_examples"].max()) if "n_examples" in means.columns else len(table)
    where = f"{first['site']} → {first['into']}" if "into" in means.columns else first["site"]
    axes.set_title(f"{name} ({first['direction']}): {where}, {first['metric']}, "
                   f"{n} example(s)", fontsize=9)
    return done(fig, axes, ax)
