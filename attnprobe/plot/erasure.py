"""Which explanation is faithful, as one figure (:func:`faithfulness`): the mean deletion
curves of every source with their bootstrap bands, and the ranking of the sources on one
summary metric as a dot plot with confidence-interval whiskers, the random-order baseline
drawn as a reference line.

Both panels draw one tidy table (:func:`faithfulness_rows`), built from
:meth:`Faithfulness.curves() <attnprobe.faithfulness.result.Faithfulness.curves>` and
:meth:`Faithfulness.summary() <attnprobe.faithfulness.result.Faithfulness.summary>`; the
report draws the same table as SVG (:mod:`attnprobe.report.svg_figures.faithfulness`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.faithfulness.result import HIGHER_IS_BETTER, RANDOM_SOURCE, SUMMARY_METRICS
from attnprobe.plot.common import SPARE_PALETTE, axes_for, check_table, done, new_figure
from attnprobe.plot.figure import figure

RANK = 55  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["BASELINE_COLOUR", "CURVE_STYLES", "FIGURE_COLUMNS", "METRIC_LABELS", "PANELS",
           "curve_style", "faithfulness", "faithfulness_rows", "source_colours"]

FIGURE_COLUMNS = ("panel", "source", "source_kind", "curve", "fraction", "metric", "value",
                  "low", "high", "n")
PANELS = ("curves", "ranking")
BASELINE_COLOUR = "#7f7f7f"  # the random-order baseline, in both panels
# a curve's line style, by a word in its name: deletion most-relevant-first is the solid
# line of the literature (Samek et al. 2017), least-relevant-first its dashed mirror
CURVE_STYLES = (("insertion_lerf", "-."), ("insertion", ":"), ("lerf", "--"), ("morf", "-"))
METRIC_LABELS = {
    "aopc_comprehensiveness": "AOPC comprehensiveness (higher: more faithful)",
    "aopc_sufficiency": "AOPC sufficiency (lower: more faithful)",
    "abpc": "ABPC, area between LeRF and MoRF (higher: more faithful)",
    "tau_loo": "Kendall τ with leave-one-out (higher: more faithful)",
}


def curve_style(curve: str) -> str:
    """The matplotlib line style of curve ``curve`` (:data:`CURVE_STYLES`; solid otherwise)."""
    name = curve.lower()
    return next((style for word, style in CURVE_STYLES if word in name), "-")


def source_colours(rows: pd.DataFrame) -> dict[str, str]:
    """``{source: '#rrggbb'}`` in order of appearance; the random baseline grey."""
    kinds = dict(zip(rows["source"].astype(str), rows["source_kind"].astype(str),
                     strict=False))
    palette = [c for c in SPARE_PALETTE if c != BASELINE_COLOUR]
    named = [s for s in kinds if kinds[s] != "random"]
    colours = {s: palette[i % len(palette)] for i, s in enumerate(named)}
    return {s: colours.get(s, BASELINE_COLOUR) for s in kinds}


def _is_insertion(curve: str) -> bool:
    return "insertion" in curve.lower()


def faithfulness_rows(result: Any, *, metric: str = "aopc_comprehensiveness",
                      insertion: bool = False, sources: Sequence[str] | None = None,
                      level: float = 0.95, n_boot: int = 1000) -> pd.DataFrame:
    """The table the faithfulness figure draws (``FIGURE_COLUMNS``), one row per point.

    ``panel="curves"``: per source, curve and ``fraction`` of real tokens removed, the mean
    output drop ``value`` with its bootstrap band ``low``/``high`` over ``n`` examples
    (:meth:`~attnprobe.faithfulness.result.Faithfulness.curves`); insertion curves only with
    ``insertion``. ``panel="ranking"``: per source, the mean of ``metric`` with its
    confidence interval (:meth:`~attnprobe.faithfulness.result.Faithfulness.summary`), best
    first (the random baseline included, ``source_kind="random"``).

    Args:
        result: a :class:`~attnprobe.faithfulness.result.Faithfulness`, or this table.
        metric: the ranking's metric, one of ``SUMMARY_METRICS``.
        insertion: also the insertion curves.
        sources: only these sources (the random baseline is always kept).
        level / n_boot: the bootstrap's confidence level and resamples.
    """
    if isinstance(result, pd.DataFrame):
        return check_table(result, FIGURE_COLUMNS, "faithfulness figure table")
    if not (callable(getattr(result, "summary", None)) and callable(getattr(result, "curves",
                                                                            None))):
        raise InputError("expected a Faithfulness (ap.faithfulness.evaluate) or its figure "
                         f"table; got {type(result).__name__}")
    if metric not in SUMMARY_METRICS:
        raise InputError(f"unknown metric {metric!r}; choose one of {', '.join(SUMMARY_METRICS)}")
    summary = result.summary(level=level, n_boot=n_boot)
    curves = result.curves(level=level, n_boot=n_boot)
    present = list(dict.fromkeys(summary["source"].astype(str)))
    if sources is not None:
        unknown = [s for s in sources if s not in present]
        if unknown:
            raise InputError(f"no source {unknown} in the result; it has {present}")
        keep = {*sources, RANDOM_SOURCE}
        summary = summary[summary["source"].astype(str).isin(keep)]
        curves = curves[curves["source"].astype(str).isin(keep)]
    if not insertion:
        curves = curves[~curves["curve"].astype(str).map(_is_insertion)]
    drawn = curves.assign(panel="curves", metric="")
    ranked = summary.sort_values(metric, ascending=not HIGHER_IS_BETTER[metric],
                                 kind="stable", na_position="last")
    ranking = pd.DataFrame({
        "panel": "ranking", "source": ranked["source"], "source_kind": ranked["source_kind"],
        "curve": "", "fraction": np.nan, "metric": metric, "value": ranked[metric],
        "low": ranked[f"{metric}_low"], "high": ranked[f"{metric}_high"], "n": ranked["n"]})
    return pd.concat([drawn[list(FIGURE_COLUMNS)], ranking], ignore_index=True)


def _draw_curves(axes: Any, rows: pd.DataFrame, colours: dict[str, str]) -> None:
    for (source, curve), part in rows.groupby(["source", "curve"], sort=False):
        part = part.sort_values("fraction")
        x = part["fraction"].astype(float).to_numpy()
        colour = colours[str(source)]
        axes.plot(x, part["value"].astype(float).to_numpy(), color=colour,
                  linestyle=curve_style(str(curve)), label=f"{source} {curve}")
        axes.fill_between(x, part["low"].astype(float).to_numpy(),
                          part["high"].astype(float).to_numpy(), color=colour, alpha=0.12,
                          linewidth=0, label=f"_band {source} {curve}")
    axes.axhline(0.0, color="black", linewidth=0.5)
    axes.set_xlabel("share of real tokens removed (inserted)")
    axes.set_ylabel("output drop f(x) − f(x′), mean over examples")
    axes.set_title("deletion curves: MoRF solid, LeRF dashed", fontsize=9)
    axes.legend(fontsize=6, frameon=False)


def _draw_ranking(axes: Any, rows: pd.DataFrame, colours: dict[str, str]) -> None:
    baseline = rows[rows["source_kind"].astype(str) == "random"]
    dots = rows[rows["source_kind"].astype(str) != "random"]
    y = np.arange(len(dots))[::-1]  # the best at the top
    mean = dots["value"].astype(float).to_numpy()
    whiskers = np.vstack([mean - dots["low"].astype(float).to_numpy(),
                          dots["high"].astype(float).to_numpy() - mean])
    axes.errorbar(mean, y, xerr=whiskers, fmt="none", ecolor="#555555", capsize=3,
                  label="_whiskers")
    axes.scatter(mean, y, c=[colours[str(s)] for s in dots["source"]], zorder=3)
    for item in baseline.itertuples():
        axes.axvline(float(item.value), color=BASELINE_COLOUR, linestyle="--", linewidth=1,
                     label=f"{item.source} baseline")
        axes.axvspan(float(item.low), float(item.high), color=BASELINE_COLOUR, alpha=0.12,
                     linewidth=0)
    axes.set_yticks(y, labels=[str(s) for s in dots["source"]], parse_math=False)
    metric = str(rows["metric"].iloc[0])
    axes.set_ylim(-0.8, len(dots) - 0.2)
    axes.set_xlabel("mean over examples, CI whiskers")
    axes.set_title(f"ranking: {METRIC_LABELS.get(metric, metric)}", fontsize=9)
    if not baseline.empty:
        axes.legend(fontsize=7, frameon=False)


@figure(data=faithfulness_rows, rank=55,
        shows="deletion curves per source with bands; the ranking with CIs",
        source="Faithfulness")
def faithfulness(result: Any, *, metric: str = "aopc_comprehensiveness",
                 insertion: bool = False, sources: Sequence[str] | None = None,
                 panel: str | None = None, level: float = 0.95, n_boot: int = 1000,
                 ax: Any = None) -> Any:
    """Which explanation is faithful: (a) the mean deletion curves of every source, the
    output's drop as tokens are removed most-relevant-first (solid) and least-relevant-first
    (dashed; insertion dotted with ``insertion``), with bootstrap bands; (b) the sources
    ranked by ``metric`` as dots with confidence-interval whiskers, the random-order
    baseline a dashed vertical line with its band.

    Args:
        result: a :class:`~attnprobe.faithfulness.result.Faithfulness` or its figure table
            (:func:`faithfulness_rows`).
        metric: the ranking's metric (default ``aopc_comprehensiveness``; also
            ``aopc_sufficiency``, ``abpc``, ``tau_loo``).
        insertion: also draw the insertion curves.
        sources: only these sources (the random baseline is always drawn).
        panel: ``"curves"`` or ``"ranking"`` alone (default: both, side by side).
        level / n_boot: the bootstrap's confidence level and resamples.
        ax: draw one ``panel`` into this matplotlib Axes (and return it).

    Returns:
        A matplotlib ``Figure`` (or ``ax``). The curves panel has one ``Line2D`` per (source,
        curve), labelled ``"<source> <curve>"``, whose points are ``(fraction, mean drop)``;
        the ranking panel one scatter point per source at ``(mean, row)`` with whiskers from
        ``low`` to ``high``.

    Example:
        >>> found = ap.faithfulness.evaluate(model, tok, texts, "similarity:A cat sat.",
        ...                                  methods=["saliency"], views=["raw"],
        ...                                  levels=(0.2, 0.5), curve_steps=4)
        >>> fig = ap.plot.faithfulness(found, metric="abpc")
        >>> [a.get_title() for a in fig.axes]
        ['deletion curves: MoRF solid, LeRF dashed',
         'ranking: ABPC, area between LeRF and MoRF (higher: more faithful)']
    """
    if panel is not None and panel not in PANELS:
        raise InputError(f"unknown panel {panel!r}; choose {' or '.join(PANELS)}")
    if ax is not None and panel is None:
        raise InputError("ax holds one panel; pass panel='curves' or panel='ranking'")
    rows = faithfulness_rows(result, metric=metric, insertion=insertion, sources=sources,
                             level=level, n_boot=n_boot)
    shown = [panel] if panel is not None else list(PANELS)
    colours = source_colours(rows)
    if ax is None:
        fig = new_figure(1.0 + 4.6 * len(shown), 3.8)
        panels = list(fig.subplots(1, len(shown), squeeze=False)[0])
    else:
        fig, single = axes_for(ax, 0, 0)
        panels = [single]
    draw = {"curves": _draw_curves, "ranking": _draw_ranking}
    for axes, name in zip(panels, shown, strict=True):
        part = rows[rows["panel"].astype(str) == name]
        if part.empty:
            raise InputError(f"the result has no {name} to draw")
        draw[name](axes, part, colours)
    return done(fig, panels[0], ax)
