"""The report's renderers of the figures of :mod:`attnprobe.plot`: inline SVG drawn from the
same tidy table as the matplotlib figure.

A figure is one :class:`~attnprobe.plot.figure.Figure`: its data function gives the table,
``ap.plot.<name>`` draws it with matplotlib, and the SVG renderer registered here under the
same name (``renderer(table) -> [svg, ...]``) draws it for the page. The renderers are
modules of :mod:`attnprobe.report.svg_figures`, discovered (ordered by ``RANK``): the SVG
twin of a figure is one module there. :func:`svg_figures` computes the table once with the
figure's own data function and hands it to the renderer.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import pandas as pd

from attnprobe.core.plugins import discover
from attnprobe.core.registry import Registry
from attnprobe.plot.figure import FIGURES, registered_figures

__all__ = ["PACKAGE", "SVG_RENDERERS", "SvgRenderer", "registered_svg", "svg_figures",
           "svg_of", "svg_renderer"]

PACKAGE = "attnprobe.report.svg_figures"

SvgRenderer = Callable[[pd.DataFrame], list[Any]]
SVG_RENDERERS: Registry[SvgRenderer] = Registry("SVG figure")


def svg_renderer(name: str) -> Callable[[SvgRenderer], SvgRenderer]:
    """Register the decorated ``renderer(table) -> [svg markup, ...]`` as the report's
    drawing of figure ``name`` (the :data:`~attnprobe.plot.figure.FIGURES` entry whose data
    function gives ``table``)."""
    return SVG_RENDERERS.register(name)


def registered_svg() -> list[str]:
    """The figures the report draws as SVG, the modules of :data:`PACKAGE` imported first.

    Example:
        >>> "head_effects" in registered_svg()
        True
    """
    discover(PACKAGE)
    return SVG_RENDERERS.names()


def svg_of(name: str) -> SvgRenderer:
    """The SVG renderer of figure ``name``.

    Raises:
        KeyError: a name without one (the registered names listed).
    """
    registered_svg()
    return SVG_RENDERERS.get(name)


def svg_figures(name: str, result: Any, **options: Any) -> list[Any]:
    """Figure ``name`` of ``result`` as SVG: its data function's table (computed once),
    drawn by its SVG renderer.

    Raises:
        InputError: what the figure's data function raises for a result it cannot read.

    Example:
        >>> table = pd.DataFrame({"experiment": "ablate", "scope": ["head:0.1", "head:1.0"],
        ...                       "example_id": "0", "metric": "tvd", "baseline": 0.0,
        ...                       "perturbed": [0.2, 0.4], "change": [0.2, 0.4]})
        >>> len(svg_figures("head_effects", table))     # one layer × head heatmap
        1
    """
    renderer = svg_of(name)
    registered_figures()
    return renderer(FIGURES.get(name).data(result, **options))
