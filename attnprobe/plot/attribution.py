"""Attention against gradient attributions as figures: agreement by layer, one line per view
(:func:`agreement_by_layer`), and the scores on the text, one row of token cells per method
or view (:func:`token_heat`, as inseq shows them)."""

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
    known_subset,
    new_figure,
    seaborn,
    set_token_ticks,
)
from attnprobe.plot.figure import figure
from attnprobe.types import TokenAttribution

RANK = 50  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["METRIC_LABELS", "agreement_by_layer", "agreement_summary", "token_heat",
           "token_scores"]

METRIC_LABELS = {
    "kendall_tau": "Kendall τ",
    "spearman": "Spearman ρ",
    "topk_overlap": "top-k overlap (fraction of k)",
    "jsd": "Jensen–Shannon divergence (nats)",
}
SUMMARY_KEYS = ["source_kind", "view", "layer", "source", "method", "metric"]


def agreement_summary(comparison: Any) -> pd.DataFrame:
    """Mean, std and n per (view, layer, method, metric) from a ``Comparison``, its
    ``summary()`` (as it is) or its ``table`` (per-example ``value`` s, averaged here)."""
    if not isinstance(comparison, pd.DataFrame):
        if not hasattr(comparison, "summary"):
            raise InputError("expected a Comparison, its summary() or its table; got "
                             f"{type(comparison).__name__}")
        comparison = comparison.summary()
    if "mean" in comparison.columns:
        return check_table(comparison, ("view", "layer", "method", "metric", "mean"),
                           "agreement summary")
    table = check_table(comparison, ("view", "layer", "method", "metric", "value"),
                        "agreement table")
    keys = [k for k in SUMMARY_KEYS if k in table.columns]
    frame = table.assign(layer=table["layer"].astype("Int64"))
    grouped = frame.groupby(keys, dropna=False, sort=False)["value"]
    return grouped.agg(["mean", "std", "count"]).rename(columns={"count": "n"}).reset_index()


def _layer_rows(summary: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """``(attention views with a layer, sources without one)``."""
    has_layer = summary["layer"].notna()
    if "source_kind" in summary.columns:
        has_layer &= summary["source_kind"].astype(str) == "attention"
    return summary[has_layer], summary[~has_layer]


@figure(data=agreement_summary, rank=50,
        shows="attention vs attribution per layer, a line per view",
        source="Comparison / ``summary()`` / ``table``")
def agreement_by_layer(comparison: Any, *, metric: str = "kendall_tau",
                       method: str | None = None, views: Sequence[str] | None = None,
                       ax: Any = None) -> Any:
    """Agreement of attention with an attribution method, per layer: one line per attention
    view (mean over examples, the band ± one standard deviation).

    Sources without a layer (another attribution method compared with the same one) are
    dashed horizontal lines, for reference. Rank metrics get a line at 0 (no agreement).
    Several methods give one panel each (pass ``method=`` to draw one into ``ax``).

    Args:
        comparison: a ``Comparison`` (from :func:`attnprobe.attribution.compare`), its
            ``summary()`` or its ``table``.
        metric: ``kendall_tau`` (default), ``spearman``, ``topk_overlap``, ``jsd`` ...
        method: the attribution method compared with (default: every one, a panel each).
        views: only these attention views (default: every one, in table order).
        ax: draw into this matplotlib Axes (and return it); needs a single method.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); per panel, one ``Line2D`` per view whose points
        are ``(layer, mean)``.

    Example:
        >>> c = ap.attribution.compare(lm, lm_tok, [prompt], "next-token",
        ...                            methods=["saliency"], views=["raw", "rollout"])
        >>> fig = ap.plot.agreement_by_layer(c, metric="spearman")
        >>> panel = fig.axes[0]
        >>> panel.get_title(), [line.get_xdata().tolist() for line in panel.lines[:2]]
        ('attention vs saliency', [[0, 1], [0, 1]])
    """
    summary = agreement_summary(comparison)
    metrics = list(dict.fromkeys(summary["metric"].astype(str)))
    if metric not in metrics:
        raise InputError(f"no metric {metric!r} in the comparison; it has {metrics}")
    summary = summary[summary["metric"] == metric]
    layered, flat = _layer_rows(summary)
    if layered.empty:
        raise InputError("the comparison has no attention view with a layer")
    methods = list(dict.fromkeys(layered["method"].astype(str)))
    if method is not None:
        if method not in methods:
            raise InputError(f"no method {method!r} in the comparison; it has {methods}")
        methods = [method]
    chosen = known_subset(list(dict.fromkeys(layered["view"].astype(str))), views, "view",
                          "in the comparison")
    if ax is not None and len(methods) > 1:
        raise InputError(f"several methods {methods}; pass method= to draw into one ax")
    if ax is None:
        fig = new_figure(1.2 + 4.2 * len(methods), 3.6)
        panels = list(fig.subplots(1, len(methods), sharey=True, squeeze=False)[0])
    else:
        fig, panel = axes_for(ax, 0, 0)
        panels = [panel]
    colours = dict(zip(chosen, SPARE_PALETTE * 4, strict=False))
    for axes, name in zip(panels, methods, strict=True):
        rows = layered[layered["method"].astype(str) == name]
        for view in chosen:
            line = rows[rows["view"].astype(str) == view].sort_values("layer")
            if line.empty:
                continue
            if line["layer"].duplicated().any():
                raise InputError(f"view {view} has several rows per layer for {name}; "
                                 "filter the summary to one source per layer")
            x = line["layer"].astype(int).to_numpy()
            y = line["mean"].astype(float).to_numpy()
            spread = line["std"].astype(float).fillna(0.0).to_numpy() \
                if "std" in line.columns else np.zeros(len(y))
            axes.plot(x, y, marker="o", color=colours[view], label=view)
            axes.fill_between(x, y - spread, y + spread, color=colours[view], alpha=0.15,
                              linewidth=0)
        others = flat[flat["method"].astype(str) == name]
        for i, item in enumerate(others.itertuples()):
            source = getattr(item, "source", None) or item.view
            axes.axhline(float(item.mean), linestyle="--", linewidth=1,
                         color=SPARE_PALETTE[(len(chosen) + i) % len(SPARE_PALETTE)],
                         label=f"{source} (attribution)")
        if metric in ("kendall_tau", "spearman"):
            axes.axhline(0.0, color="black", linewidth=0.5)
        axes.set_title(f"attention vs {name}", fontsize=9)
        axes.set_xlabel("layer")
        axes.xaxis.get_major_locator().set_params(integer=True)
        axes.legend(fontsize=7, frameon=False)
    panels[0].set_ylabel(f"{METRIC_LABELS.get(metric, metric)}, mean ± std over examples")
    return done(fig, panels[0], ax)


def token_scores(attributions: Any) -> pd.DataFrame:
    """The tidy per-token table (``ATTRIBUTION_COLUMNS``) of a ``Comparison`` (its
    ``attributions``), one or several :class:`TokenAttribution` s, or such a table."""
    if isinstance(attributions, pd.DataFrame):
        return check_table(attributions, ("example_id", "method", "position", "token",
                                          "score"), "attribution table")
    if isinstance(attributions, TokenAttribution):
        attributions = [attributions]
    elif hasattr(attributions, "attributions") and not isinstance(attributions, (list, tuple)):
        attributions = attributions.attributions
    if not isinstance(attributions, (list, tuple)) or not all(
            isinstance(a, TokenAttribution) for a in attributions):
        raise InputError("expected a Comparison, TokenAttribution(s) or their to_frame() "
                         f"table; got {type(attributions).__name__}")
    if not attributions:
        raise InputError("no attributions to plot")
    return pd.concat([a.to_frame() for a in attributions], ignore_index=True)


def _pick(table: pd.DataFrame, column: str, wanted: str | None) -> pd.DataFrame:
    """Rows of one ``column`` value (the one there is, or ``wanted``). An empty value (the
    target of an attention view, which explains none) goes with every value."""
    if column not in table.columns:
        return table
    cells = table[column].fillna("").astype(str)
    values = [v for v in dict.fromkeys(cells) if v]
    if wanted is None:
        if len(values) > 1:
            raise InputError(f"the attributions cover {len(values)} values of {column} "
                             f"({values[:5]}); pass {column}=")
        return table
    if str(wanted) not in values:
        raise InputError(f"no {column} {wanted!r} in the attributions; they have {values[:8]}")
    return table[(cells == str(wanted)) | (cells == "")]


@figure(data=token_scores, rank=51,
        shows="scores on the tokens, a row per method or view",
        source="Comparison / TokenAttributions / their table")
def token_heat(attributions: Any, *, example_id: str | None = None, target: str | None = None,
               methods: Sequence[str] | None = None, normalise: bool = True,
               annotate: bool = False, cmap: str = "RdBu_r", ax: Any = None) -> Any:
    """Scores on the text: the tokens of one example as a row of cells, one row per method
    or attention view, coloured by the score (red positive, blue negative, white 0).

    With ``normalise`` each row is divided by its largest ``|score|``, so rows of different
    scales (gradients, attention weights) compare on ``[-1, 1]``; ``annotate`` writes the
    values in the cells. The x tick labels are the tokens, the y tick labels the methods.

    Args:
        attributions: a ``Comparison`` (its ``attributions``), a :class:`TokenAttribution`,
            a list of them, or their ``to_frame()`` table.
        example_id: which example (required when there are several).
        target: which target (required when one example has several).
        methods: the rows, in this order (default: every method in order of appearance).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); the heatmap is one ``QuadMesh`` of methods ×
        tokens.

    Example:
        >>> ids = lm_tok([prompt], return_tensors="pt")
        >>> found = ap.attribution.attribute_inputs(lm, lm_tok, [ids], "next-token",
        ...                                         ["saliency", "leave_one_out"])
        >>> fig = ap.plot.token_heat(found)             # a row per method, a cell per token
        >>> heat = fig.axes[0]
        >>> len(heat.get_yticklabels()), len(heat.get_xticklabels())   # 2 methods, 17 tokens
        (2, 17)
    """
    table = _pick(_pick(token_scores(attributions), "example_id", example_id), "target", target)
    present = known_subset(list(dict.fromkeys(table["method"].astype(str))), methods,
                           "method", "for this example")
    rows: list[np.ndarray] = []
    tokens: tuple[str, ...] | None = None
    for name in present:
        part = table[table["method"].astype(str) == name].sort_values("position")
        if part["position"].duplicated().any():
            raise InputError(f"method {name} has several scores per position; pick one target")
        these = tuple(part["token"].astype(str))
        if tokens is not None and these != tokens:
            raise InputError(f"method {name} scores other tokens than {present[0]}")
        tokens = these
        rows.append(part["score"].astype(float).to_numpy())
    if tokens is None:
        raise InputError("methods is empty: nothing to plot")
    matrix = np.vstack(rows)
    if normalise:
        peak = np.abs(matrix).max(axis=1, keepdims=True)
        matrix = np.divide(matrix, peak, out=np.zeros_like(matrix), where=peak > 0)
    limit = 1.0 if normalise else float(np.abs(matrix).max()) or 1.0
    fig, axes = axes_for(ax, 2.2 + 0.55 * len(tokens), 1.0 + 0.42 * len(present))
    seaborn().heatmap(matrix, ax=axes, cmap=cmap, vmin=-limit, vmax=limit,
                      annot=annotate, fmt=".2f", annot_kws={"fontsize": 6},
                      linewidths=0.5, linecolor="white",
                      cbar_kws={"label": "score / max |score| of the row" if normalise
                                else "score"})
    set_token_ticks(axes, "x", tokens, rotate=sum(map(len, tokens)) > 60, offset=0.5)
    set_token_ticks(axes, "y", present, offset=0.5)
    axes.tick_params(axis="y", labelrotation=0)
    axes.set_xlabel("token")
    example = table["example_id"].astype(str).iloc[0]
    axes.set_title(f"example {example}" if example else "token scores", fontsize=9)
    return done(fig, axes, ax)
