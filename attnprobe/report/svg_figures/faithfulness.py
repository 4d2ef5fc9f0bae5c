"""Which explanation is faithful, as SVG (the twin of :func:`attnprobe.plot.faithfulness`):
the mean deletion curves with their bootstrap bands, and the ranking as dots with CI
whiskers and the random baseline as a dashed reference line."""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.plot.erasure import METRIC_LABELS, curve_style, source_colours
from attnprobe.report.charts import number
from attnprobe.report.figure_svg import svg_renderer
from attnprobe.report.templating import environment

RANK = 55
DASHES = {"-": "", "--": "6 4", ":": "2 3"}  # matplotlib line style -> SVG dash array
LEFT, TOP, WIDTH, HEIGHT = 52, 22, 360, 170  # px: the plot area of the curves
ROW = 22  # px per source in the ranking
PAD = 0.04  # share of a value range left free at each end


def _macro(name: str) -> Any:
    return getattr(environment().get_template("faithfulness.svg.j2").module, name)


def _scale(low: float, high: float, start: float, length: float, flip: bool = False
           ) -> Callable[[float], float]:
    """``value -> px`` over ``[low, high]`` (widened when empty), upwards with ``flip``."""
    if not high - low > 1e-12:
        low, high = low - 0.5, high + 0.5
    pad = PAD * (high - low)  # a whisker or band at the extreme stays inside the frame
    low, high = low - pad, high + pad

    def at(value: float) -> float:
        share = (value - low) / (high - low)
        return start + (1 - share if flip else share) * length

    return at


def _finite(values: Any) -> list[float]:
    return [float(v) for v in values if math.isfinite(float(v))]


@svg_renderer("faithfulness")
def render(rows: pd.DataFrame) -> list[Any]:
    """The curves panel (when the table has curves) and the ranking panel (when it has a
    ranking), as ``ap.plot.faithfulness`` draws them."""
    colours = source_colours(rows)
    panel = rows["panel"].astype(str)
    out = []
    if (panel == "curves").any():
        out.append(curves_svg(rows[panel == "curves"], colours))
    if (panel == "ranking").any():
        out.append(ranking_svg(rows[panel == "ranking"], colours))
    return out


def curves_svg(rows: pd.DataFrame, colours: dict[str, str]) -> Any:
    """A line per (source, curve) over the share of tokens removed: the mean drop with its
    band; each point's tooltip says the mean, interval and examples."""
    ys = _finite([*rows["low"], *rows["high"], *rows["value"], 0.0])
    x_at = _scale(0.0, max(_finite(rows["fraction"]) or [1.0]), LEFT, WIDTH)
    y_at = _scale(min(ys), max(ys), TOP, HEIGHT, flip=True)
    series = []
    for (source, curve), part in rows.groupby(["source", "curve"], sort=False):
        part = part[np.isfinite(part["value"].astype(float))].sort_values("fraction")
        low = part["low"].astype(float).fillna(part["value"].astype(float))
        high = part["high"].astype(float).fillna(part["value"].astype(float))
        xs = [x_at(float(f)) for f in part["fraction"]]
        band = [*zip(xs, map(y_at, high), strict=True),
                *reversed(list(zip(xs, map(y_at, low), strict=True)))]
        points = [{"x": x, "y": y_at(float(r.value)), "tip": (
            f"{source} {curve}: {number(r.fraction)} of the tokens, mean drop "
            f"{number(r.value)} [{number(r.low)}, {number(r.high)}] over {int(r.n)} "
            f"example(s)")} for x, r in zip(xs, part.itertuples(), strict=True)]
        series.append({"name": f"{source} {curve}", "source": str(source), "curve": str(curve),
                       "colour": colours[str(source)],
                       "dash": DASHES[curve_style(str(curve))],
                       "path": " ".join(f"{p['x']:.1f},{p['y']:.1f}" for p in points),
                       "band": " ".join(f"{x:.1f},{y:.1f}" for x, y in band),
                       "points": points})
    sources = list(dict.fromkeys(rows["source"].astype(str)))
    legend = [{"x": LEFT + WIDTH + 16, "y": TOP + i * 16, "fill": colours[s], "label": s}
              for i, s in enumerate(sources)]
    kinds = list(dict.fromkeys(rows["curve"].astype(str)))
    styles = [{"x": LEFT + WIDTH + 16, "y": TOP + (len(sources) + i) * 16 + 14,
               "dash": DASHES[curve_style(c)], "label": c} for i, c in enumerate(kinds)]
    top_y = max(ys)
    return _macro("curves")({
        "left": LEFT, "top": TOP, "plot_w": WIDTH, "plot_h": HEIGHT, "series": series,
        "zero": y_at(0.0), "legend": legend, "styles": styles,
        "x_ticks": [{"x": x_at(v), "body": f"{v:g}"} for v in np.linspace(0, 1, 5)],
        "y_ticks": [{"y": y_at(v), "body": f"{v:.3g}"}
                    for v in np.linspace(min(ys), top_y, 5)],
        "x_label": "share of real tokens removed",
        "y_label": "output drop f(x) − f(x′), mean over examples",
        "width": LEFT + WIDTH + 60 + 7 * max(len(e["label"]) for e in [*legend, *styles]),
        "height": max(TOP + HEIGHT + 40, TOP + 16 * (len(legend) + len(styles)) + 24)})


def ranking_svg(rows: pd.DataFrame, colours: dict[str, str]) -> Any:
    """One row per source, best at the top: the mean of the metric as a dot, its confidence
    interval as a whisker; the random baseline a dashed vertical line with its band."""
    metric = str(rows["metric"].iloc[0])
    random = rows["source_kind"].astype(str) == "random"
    dots, baselines = rows[~random], rows[random]
    xs = _finite([*rows["low"], *rows["high"], *rows["value"]]) or [0.0]
    left = 16 + 7 * max((len(str(s)) for s in dots["source"]), default=4)
    x_at = _scale(min(xs), max(xs), left, WIDTH)
    height = ROW * max(len(dots), 1)

    def tip(r: Any) -> str:
        return (f"{r.source}: {metric} {number(r.value)} [{number(r.low)}, "
                f"{number(r.high)}] over {int(r.n)} example(s)")

    drawn = [{"source": str(r.source), "colour": colours[str(r.source)], "y": TOP + ROW * (i + 0.5),
              "x": x_at(float(r.value)) if math.isfinite(float(r.value)) else left,
              "x_low": x_at(float(r.low)) if math.isfinite(float(r.low)) else left,
              "x_high": x_at(float(r.high)) if math.isfinite(float(r.high)) else left,
              "tip": tip(r)} for i, r in enumerate(dots.itertuples())]
    lines = [{"source": str(r.source), "x": x_at(float(r.value)),
              "x_low": x_at(float(r.low)), "x_high": x_at(float(r.high)),
              "tip": f"baseline {tip(r)}"}
             for r in baselines.itertuples() if math.isfinite(float(r.value))]
    return _macro("dots")({
        "left": left, "top": TOP, "plot_w": WIDTH, "plot_h": height, "dots": drawn,
        "baselines": lines,
        "x_ticks": [{"x": x_at(v), "body": f"{v:.3g}"} for v in np.linspace(min(xs), max(xs), 5)],
        "x_label": "mean over examples, CI whiskers"
                   + ("; dashed: random baseline" if lines else ""),
        "y_label": METRIC_LABELS.get(metric, metric), "width": left + WIDTH + 20,
        "height": TOP + height + 40})
