"""Generic inline SVG charts (no matplotlib): a heatmap and a line chart with tooltips.

As in :mod:`attnprobe.report.svg`, this module computes the geometry and
``templates/charts.svg.j2`` writes the SVG, escaping every label and tooltip. Every cell and
point carries a ``<title>`` (its exact value), so the figures replace tables without losing
numbers. Coordinates are rounded to one decimal, so a page is byte-for-byte reproducible.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np

from attnprobe.report.templating import environment

__all__ = ["LINE_COLOURS", "fill", "heatmap", "line_chart", "number"]

LINE_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                "#ff9da7", "#9c755f", "#bab0ac")
_RED, _BLUE, _WHITE = (203, 24, 29), (33, 102, 172), (255, 255, 255)


def number(value: object) -> str:
    """A value as tooltips show it: 4 significant digits, ``nan`` for missing."""
    try:
        value = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return str(value)
    return "nan" if math.isnan(value) else f"{value:.4g}"


def _mix(colour: tuple[int, int, int], t: float) -> str:
    t = min(max(t, 0.0), 1.0)
    r, g, b = (round(w + (c - w) * t) for c, w in zip(colour, _WHITE, strict=True))
    return f"#{r:02x}{g:02x}{b:02x}"


def fill(value: float, low: float, high: float) -> str:
    """The colour of ``value``: white to red for a positive range, white to blue for a
    negative one, blue-white-red centred on 0 for a range across 0."""
    if low >= 0:
        return _mix(_RED, value / high if high > 0 else 0.0)
    if high <= 0:
        return _mix(_BLUE, value / low if low < 0 else 0.0)
    limit = max(-low, high)
    return _mix(_RED, value / limit) if value >= 0 else _mix(_BLUE, -value / limit)


def _macro(name: str) -> Any:
    return getattr(environment().get_template("charts.svg.j2").module, name)


def heatmap(values: np.ndarray, row_names: Sequence[str], col_names: Sequence[str],
            tips: Sequence[Sequence[str]], *, caption: str, cell: int = 22,
            rotate_columns: bool = False, css_class: str = "heatmap",
            keys: Sequence[Sequence[str]] | None = None) -> Any:
    """A heatmap of ``values`` ``[rows, cols]`` (NaN cells are left blank).

    Args:
        row_names / col_names: axis labels (plain text, escaped by the template).
        tips: ``[rows][cols]`` tooltip text of each cell.
        caption: the colour scale's meaning, written under the legend.
        rotate_columns: column names written at -60° (long names such as tokens).
        keys: ``[rows][cols]`` value of each cell's ``data-key`` (e.g. ``L3H5``).

    Returns:
        The ``<svg>`` as markup; each cell is ``<g class="ap-cell" data-key=...>`` holding
        a ``<rect>`` with a ``<title>``.
    """
    values = np.asarray(values, dtype=float)
    n_rows, n_cols = values.shape
    finite = values[np.isfinite(values)]
    low = float(finite.min()) if finite.size else 0.0
    high = float(finite.max()) if finite.size else 0.0
    if low < 0 < high:
        low, high = -max(-low, high), max(-low, high)
    left = 8 + 7 * max((len(str(n)) for n in row_names), default=1)
    longest = max((len(str(n)) for n in col_names), default=1)
    top = 10 + (min(longest, 24) * 6 if rotate_columns else 14)
    cells = []
    for r in range(n_rows):
        for c in range(n_cols):
            if not math.isfinite(values[r, c]):
                continue
            cells.append({"x": left + c * cell, "y": top + r * cell,
                          "fill": fill(values[r, c], low, high), "tip": tips[r][c],
                          "key": keys[r][c] if keys is not None else ""})
    texts = [{"x": left + c * cell + cell / 2, "y": top - 5, "body": str(name),
              "anchor": "start" if rotate_columns else "middle", "rotate": rotate_columns}
             for c, name in enumerate(col_names)]
    texts += [{"x": left - 5, "y": top + r * cell + cell * 0.68, "body": str(name),
               "anchor": "end", "rotate": False} for r, name in enumerate(row_names)]
    legend_x = left + n_cols * cell + 16
    steps = [low + (high - low) * i / 4 for i in range(5)]
    legend = [{"x": legend_x, "y": top + i * 14, "fill": fill(v, low, high),
               "label": number(v)} for i, v in enumerate(reversed(steps))]
    return _macro("heatmap")({
        "css": css_class, "size": cell - 2, "cells": cells, "texts": texts, "legend": legend,
        "caption": {"x": legend_x, "y": top + 5 * 14 + 12, "body": caption},
        "width": legend_x + max(90, 7 * len(caption)),
        "height": max(top + n_rows * cell + 10, top + 5 * 14 + 24)})


def line_chart(series: Sequence[dict[str, Any]], *, x_label: str, y_label: str,
               references: Sequence[tuple[str, float]] = (), zero_line: bool = False,
               width: int = 420, height: int = 170) -> Any:
    """Lines over integer x (layers): ``series`` holds ``{"name", "points": [(x, y, tip)]}``.

    ``references`` are dashed horizontal lines ``(name, y)`` (e.g. another attribution
    method); ``zero_line`` draws y = 0. Every point has a ``<title>``.
    """
    xs = [float(p[0]) for s in series for p in s["points"]]
    ys = [float(p[1]) for s in series for p in s["points"] if math.isfinite(float(p[1]))]
    ys += [float(y) for _, y in references if math.isfinite(float(y))]
    if zero_line:
        ys.append(0.0)
    x_low, x_high = (min(xs), max(xs)) if xs else (0.0, 1.0)
    y_low, y_high = (min(ys), max(ys)) if ys else (0.0, 1.0)
    if y_high - y_low < 1e-9:
        y_low, y_high = y_low - 0.5, y_high + 0.5
    if x_high - x_low < 1e-9:
        x_low, x_high = x_low - 0.5, x_high + 0.5
    left, top, plot_w, plot_h = 52, 22, width, height

    def at(x: float, y: float) -> tuple[float, float]:
        return (left + (x - x_low) / (x_high - x_low) * plot_w,
                top + (y_high - y) / (y_high - y_low) * plot_h)

    lines = []
    for i, s in enumerate(series):
        colour = LINE_COLOURS[i % len(LINE_COLOURS)]
        points = [(*at(float(x), float(y)), tip) for x, y, tip in s["points"]
                  if math.isfinite(float(y))]
        lines.append({"colour": colour, "name": s["name"], "points": [
            {"x": x, "y": y, "tip": tip} for x, y, tip in points],
            "path": " ".join(f"{x:.1f},{y:.1f}" for x, y, _ in points)})
    refs = [{"y": at(x_low, float(y))[1], "name": f"{name} {number(y)}",
             "colour": LINE_COLOURS[(len(series) + i) % len(LINE_COLOURS)]}
            for i, (name, y) in enumerate(references) if math.isfinite(float(y))]
    if zero_line:
        refs.append({"y": at(x_low, 0.0)[1], "name": "", "colour": "#000000"})
    x_ticks = [{"x": at(x, y_low)[0], "body": str(int(x))}
               for x in sorted(set(xs)) if float(x).is_integer()]
    y_ticks = [{"y": at(x_low, v)[1], "body": f"{v:.3g}"}
               for v in np.linspace(y_low, y_high, 5)]
    legend = [{"x": left + plot_w + 16, "y": top + i * 16, "fill": line["colour"],
               "label": line["name"]} for i, line in enumerate(lines)]
    legend += [{"x": left + plot_w + 16, "y": top + (len(lines) + i) * 16, "fill": r["colour"],
                "label": r["name"]} for i, r in enumerate(refs) if r["name"]]
    return _macro("lines")({
        "left": left, "top": top, "plot_w": plot_w, "plot_h": plot_h, "lines": lines,
        "refs": refs, "x_ticks": x_ticks, "y_ticks": y_ticks, "legend": legend,
        "x_label": x_label, "y_label": y_label,
        "width": left + plot_w + 36 + 7 * max((len(e["label"]) for e in legend), default=4),
        "height": max(top + plot_h + 40, top + 16 * len(legend) + 10)})
