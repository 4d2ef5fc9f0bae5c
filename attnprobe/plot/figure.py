"""The registry of figures: each is one data function (the tidy table it draws) with its
renderers beside it.

A :class:`Figure` is registered by decorating its matplotlib renderer (the public
``ap.plot.<name>``) with :func:`figure`, naming its ``data`` function: ``data(result,
**options) -> DataFrame``, the tidy table the figure shows, computed once. The report draws
the same table as inline SVG with the renderer registered for that name in
:data:`attnprobe.report.figure_svg.SVG_RENDERERS` (the report floor; plot never imports it),
so both pictures come from one computation.

The modules of :mod:`attnprobe.plot` are discovered (:func:`registered_figures`, ordered by
each module's ``RANK``): a new figure is one module there (plus one SVG renderer module in
``report/svg_figures/`` when the report shows it); ``ap.plot.<name>``, the ``ap.plot``
docstring table and the README's figure table (``make readme``) follow.

Example:
    >>> kinds = registered_figures()
    >>> "attention_head" in [k.name for k in kinds]
    True
    >>> FIGURES.get("head_effects").data.__name__      # the tidy table it draws
    'head_rows'
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar

import pandas as pd

from attnprobe.core.plugins import discover
from attnprobe.core.registry import Registry

__all__ = ["FIGURES", "NOT_FIGURES", "PACKAGE", "Figure", "figure", "figure_table",
           "registered_figures"]

PACKAGE = "attnprobe.plot"
NOT_FIGURES = ("common", "figure")  # helper modules of the package, not figures

Draw = TypeVar("Draw", bound=Callable[..., Any])


@dataclass(frozen=True)
class Figure:
    """One figure.

    Attributes:
        name: ``ap.plot.<name>`` (the renderer's function name).
        draw: the matplotlib renderer, ``draw(result, **options) -> Figure | Axes``.
        data: ``data(result, **options) -> DataFrame``: the tidy table the figure shows.
        shows: what it draws, one line.
        source: what it draws from (result objects and tables).
        rank: its place in tables (increasing).
    """

    name: str
    draw: Callable[..., Any] = field(repr=False)
    data: Callable[..., pd.DataFrame] = field(repr=False)
    shows: str
    source: str
    rank: int


FIGURES: Registry[Figure] = Registry("figure")


def figure(*, data: Callable[..., pd.DataFrame], shows: str, source: str, rank: int
           ) -> Callable[[Draw], Draw]:
    """Register the decorated matplotlib renderer as figure ``<its name>`` (returned as it
    is, so it stays a plain function)."""

    def add(draw: Draw) -> Draw:
        name = draw.__name__
        FIGURES.register(name)(Figure(name, draw, data, shows, source, rank))
        return draw

    return add


def registered_figures() -> list[Figure]:
    """Every figure in rank order, the modules of :mod:`attnprobe.plot` imported first (each
    registers its figures on import; Python imports a module once)."""
    discover(PACKAGE, skip=NOT_FIGURES)
    return sorted(FIGURES.values(), key=lambda f: (f.rank, f.name))


def figure_table() -> str:
    """The figures as a reStructuredText table (the ``ap.plot`` docstring's)."""
    rows = [(f":func:`{f.name}`", f"{f.shows} ({f.source})") for f in registered_figures()]
    wide = max(len(name) for name, _ in rows) + 2
    rule = f"{'=' * wide}  {'=' * 60}"
    lines = [rule, f"{'function':<{wide}}  draws (from)", rule]
    lines += [f"{name:<{wide}}  {what}" for name, what in rows]
    return "\n".join([*lines, rule])
