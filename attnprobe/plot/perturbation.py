"""Perturbation results as figures: the effect of perturbing each head alone, as a layer ×
head heatmap (:func:`head_effects`), and the pruning curve (:func:`pruning_curve`, Michel et
al. 2019).

Both read the tidy table of :func:`attnprobe.perturb.run` (``RUN_COLUMNS``). A row covers one
head when its integer ``layer`` and ``head`` columns are both set, or (tables without those
columns) when its ``scope`` names one head (``head:3.5``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.plot.common import (
    SPARE_PALETTE,
    axes_for,
    check_table,
    done,
    head_matrix,
    one_value,
    seaborn,
    single_head,
)
from attnprobe.plot.figure import figure

RANK = 60  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["PREFERRED_METRICS", "head_effects", "head_rows", "one_head_rows", "pruning_curve",
           "pruning_rows"]

# the metric head_effects draws when none is named: the first one the table has
PREFERRED_METRICS = ("tvd", "cosine_distance", "jsd", "flip", "importance")


def head_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The tidy table the effect-per-head figures draw: every row of a ``perturb.run``
    table, with ``layer`` and ``head`` (``Int64``) set on the rows that cover exactly one
    head (from those columns when the table has them, else parsed from ``scope``) and
    missing on the others.

    Example:
        >>> rows = head_rows(pd.DataFrame({"scope": ["head:1.2", "layer:0"], "change": [1, 2]}))
        >>> rows["head"].tolist()
        [2, <NA>]
    """
    layer = pd.Series(pd.NA, index=table.index, dtype="Int64")
    head = pd.Series(pd.NA, index=table.index, dtype="Int64")
    if "layer" in table.columns and "head" in table.columns:
        both = table["layer"].notna() & table["head"].notna()
        layer[both] = pd.to_numeric(table.loc[both, "layer"]).astype("Int64")
        head[both] = pd.to_numeric(table.loc[both, "head"]).astype("Int64")
    elif "scope" in table.columns:
        parsed = {s: single_head(s) for s in table["scope"].astype(str).unique()}
        pairs = table["scope"].astype(str).map(parsed)
        found = pairs.notna()
        layer[found] = [p[0] for p in pairs[found]]
        head[found] = [p[1] for p in pairs[found]]
    else:
        raise InputError("perturbation table needs layer/head columns or a scope column")
    return table.assign(layer=layer, head=head)


def one_head_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The rows that cover exactly one head, with integer ``layer`` and ``head`` columns
    (:func:`head_rows`)."""
    rows = head_rows(table)
    keep = rows["layer"].notna() & rows["head"].notna()
    return rows[keep].astype({"layer": int, "head": int})


def _steps(table: pd.DataFrame, step: int | None, what: str) -> pd.DataFrame:
    if "step" not in table.columns:
        return table
    if step is not None:
        return table[table["step"] == step]
    plain = table[table["step"].isna()]
    if plain.empty:
        steps = sorted(int(s) for s in table["step"].dropna().unique())
        raise InputError(f"{what}: every row has a step ({steps[:6]}); pass step=")
    return plain


@figure(data=head_rows, rank=60,
        shows="mean change per head of a perturbation, layer × head heatmap",
        source="``perturb.run`` table")
def head_effects(table: pd.DataFrame, *, metric: str | None = None,
                 experiment: str | None = None, value: str = "change", step: int | None = None,
                 annotate: bool | None = None, cmap: str | None = None, ax: Any = None) -> Any:
    """How much perturbing each head alone changes the output: a layer × head heatmap of the
    mean ``value`` (default ``change = perturbed − baseline``) of ``metric`` over the examples.

    Rows are layers (the first on top), columns heads; a head without rows stays blank. The
    colours are sequential when every effect has one sign and centred on 0 otherwise;
    ``annotate`` (default: grids up to 12 × 12) writes each mean in its cell.

    Args:
        table: :func:`attnprobe.perturb.run` output with one head per row (a sweep over heads,
            or runs with ``scope="head:L.H"`` concatenated); other rows are ignored.
        metric: e.g. ``tvd``, ``cosine_distance``, ``importance`` (default: the first of
            ``PREFERRED_METRICS`` in the table, else its first metric).
        experiment: which experiment, when the table has several.
        step: for experiments with steps (rows with no step are used by default).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); the heatmap is one ``QuadMesh`` of layers × heads.

    Example:
        >>> table = ap.perturb.run(lm, lm_tok, [prompt], "ablate", sweep="head",
        ...                        metric="logit:next", positions=list(range(9, 16)))
        >>> fig = ap.plot.head_effects(table)           # each head zeroed alone
        >>> heat = fig.axes[0]
        >>> heat.get_title(), heat.collections[0].get_array().shape   # layer × head
        ('ablate: logit:next per head, 1 example(s)', (2, 4))
    """
    what = "perturbation table"
    check_table(table, ("metric", value), what)
    rows = one_head_rows(one_value(table, "experiment", experiment, what))
    if rows.empty:
        raise InputError(f"{what}: no row covers exactly one head; run each head alone "
                         "(a sweep over heads, or scope='head:L.H')")
    metrics = list(dict.fromkeys(rows["metric"].astype(str)))
    if metric is None:
        metric = next((m for m in PREFERRED_METRICS if m in metrics), metrics[0])
    elif metric not in metrics:
        raise InputError(f"{what}: no per-head metric {metric!r}; it has {metrics}")
    rows = _steps(rows[rows["metric"].astype(str) == metric], step, what)
    if rows.empty:
        raise InputError(f"{what}: no per-head {metric} row at step {step}")
    means = rows.groupby(["layer", "head"], as_index=False)[value].mean()
    matrix = head_matrix(means, value, what=what).astype(float)
    values = matrix.to_numpy()
    low, high = np.nanmin(values), np.nanmax(values)
    if cmap is None:
        cmap = "Reds" if low >= 0 else "Blues_r" if high <= 0 else "RdBu_r"
    limit = max(abs(low), abs(high)) if low < 0 < high else None  # white at 0
    if annotate is None:
        annotate = values.shape[0] <= 12 and values.shape[1] <= 12
    n_layers, n_heads = values.shape
    fig, axes = axes_for(ax, 3.6 + 0.55 * n_heads, 1.6 + 0.45 * n_layers)
    n_examples = rows["example_id"].nunique() if "example_id" in rows.columns else len(rows)
    seaborn().heatmap(values, ax=axes, cmap=cmap, mask=np.isnan(values),
                      vmin=None if limit is None else -limit, vmax=limit,
                      annot=annotate, fmt=".2g", annot_kws={"fontsize": 6},
                      linewidths=0.5, linecolor="white",
                      cbar_kws={"label": f"mean {value} of {metric}"})
    axes.set_xticks(np.arange(n_heads) + 0.5, labels=[str(h) for h in matrix.columns])
    axes.set_yticks(np.arange(n_layers) + 0.5, labels=[str(v) for v in matrix.index])
    axes.tick_params(axis="y", labelrotation=0)
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    name = rows["experiment"].astype(str).iloc[0] if "experiment" in rows.columns else ""
    title = f"{name}: {metric} per head" if name else f"{metric} per head"
    axes.set_title(f"{title}, {n_examples} example(s)", fontsize=9)
    return done(fig, axes, ax)


def pruning_rows(table: pd.DataFrame) -> pd.DataFrame:
    """The tidy table the pruning curve draws: an importance ``perturb.run`` table (rows with
    a ``step``) or a ``pruning_curve()`` table, as it is.

    Example:
        >>> pruning_rows(pd.DataFrame({"n_pruned": [0], "metric": ["tvd"]})).shape
        (1, 2)
    """
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"expected a perturbation table (a DataFrame); got "
                         f"{type(table).__name__}")
    return table


def _curves(table: pd.DataFrame, metric: str | Sequence[str] | None,
            experiment: str | None) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """``{metric: (heads pruned, value)}``, the unpruned point first."""
    if "n_pruned" in table.columns:  # pruning_curve() output: one metric, in column "metric"
        frame = check_table(table, ("n_pruned", "metric"), "pruning curve").sort_values(
            "n_pruned")
        return {"metric": (frame["n_pruned"].to_numpy(int), frame["metric"].to_numpy(float))}
    what = "perturbation table"
    check_table(table, ("step", "metric", "baseline", "perturbed"), what)
    if "experiment" in table.columns:
        table = one_value(table, "experiment", experiment, what)
    rows = table[table["step"].notna()]
    if rows.empty:
        raise InputError(f"{what} has no pruning steps; run the 'importance' experiment")
    present = list(dict.fromkeys(rows["metric"].astype(str)))
    wanted = present if metric is None else [metric] if isinstance(metric, str) \
        else list(metric)
    unknown = [m for m in wanted if m not in present]
    if unknown:
        raise InputError(f"{what}: no pruning metric {unknown}; it has {present}")
    curves = {}
    for name in wanted:
        part = rows[rows["metric"].astype(str) == name]
        points = part.groupby("step")[["perturbed", "baseline"]].mean().sort_index()
        x = points.index.to_numpy(int)
        y = points["perturbed"].to_numpy(float)
        if 0 not in x:  # the unpruned model: the baseline
            x = np.concatenate([[0], x])
            y = np.concatenate([[float(points["baseline"].iloc[0])], y])
        curves[name] = (x, y)
    return curves


@figure(data=pruning_rows, rank=61,
        shows="output metrics vs heads pruned",
        source="``perturb.run`` importance table")
def pruning_curve(table: pd.DataFrame, *, metric: str | Sequence[str] | None = None,
                  experiment: str | None = "importance", ax: Any = None) -> Any:
    """The pruning curve: each metric of the output against the number of heads pruned (least
    important first), starting from the unpruned model at 0.

    Args:
        table: :func:`attnprobe.perturb.run` output of the ``importance`` experiment (rows
            with a ``step``: heads pruned; ``perturbed`` is the metric then, ``baseline``
            the unpruned value), or :func:`attnprobe.perturb.pruning_curve` output
            (``n_pruned``, ``metric``).
        metric: one metric, several, or None for every one in the table (a line each).
        experiment: which experiment's rows (``importance``; None when the table has one).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``): one ``Line2D`` per metric with one point per
        step plus the unpruned point.

    Example:
        >>> def copied(output, inputs):                 # the second copy, predicted
        ...     return (output[0, 8:-1].argmax(-1) == inputs["input_ids"][0, 9:]).float().mean()
        >>> curve = ap.perturb.pruning_curve(lm, lm_tok, [prompt], copied,
        ...                                  [(1, 0), (1, 1), (1, 2), (1, 3)])
        >>> fig = ap.plot.pruning_curve(curve)
        >>> [line.get_xdata().tolist() for line in fig.axes[0].lines]   # heads pruned
        [[0, 1, 2, 3, 4]]
    """
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"expected a perturbation table (DataFrame); got {type(table).__name__}")
    curves = _curves(table, metric, experiment)
    fig, axes = axes_for(ax, 5.4, 3.6)
    for i, (name, (x, y)) in enumerate(curves.items()):
        axes.plot(x, y, marker="o", markersize=3, color=SPARE_PALETTE[i % len(SPARE_PALETTE)],
                  label=name)
    axes.set_xlabel("heads pruned (least important first)")
    axes.set_ylabel("metric value after pruning")
    axes.xaxis.get_major_locator().set_params(integer=True)
    axes.legend(fontsize=7, frameon=False)
    return done(fig, axes, ax)
