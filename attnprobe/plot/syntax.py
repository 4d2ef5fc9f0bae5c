"""Syntax alignment as a figure: the best head's accuracy per dependency relation next to the
best fixed-offset baseline (:func:`syntax_accuracy`, Clark et al. 2019, Table 1)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.heads.dependencies import MIN_COUNT
from attnprobe.plot.common import axes_for, check_table, done, label_colours, table_from
from attnprobe.plot.figure import figure

RANK = 40  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["BASELINE_COLOUR", "syntax_accuracy", "syntax_table"]

BASELINE_COLOUR = "#b0b0b0"


def _offset_text(offset: object) -> str:
    try:
        value = int(offset)  # type: ignore[call-overload]
    except (TypeError, ValueError):
        return ""
    return f"{value:+d}" if value else "0"


def syntax_table(census: Any, min_count: int = MIN_COUNT) -> pd.DataFrame:
    """The tidy table the syntax figure draws: ``census.syntax(min_count)`` (one row per
    relation: ``relation, count, accuracy, baseline`` ...), or such a table as it is.

    Example:
        >>> syntax_table(pd.DataFrame({"relation": ["det"]}))["relation"].tolist()
        ['det']
    """
    return table_from(census, "syntax", "a Census with syntax",
                      call=lambda c: c.syntax(min_count))


@figure(data=syntax_table, rank=40,
        shows="best head vs best fixed offset per relation",
        source="Census / ``syntax()``")
def syntax_accuracy(census: Any, *, min_count: int = MIN_COUNT, relations: list[str] | None = None,
                    ax: Any = None) -> Any:
    """Per dependency relation, two bars: the accuracy of the best head (coloured as the
    ``syntactic`` label, named ``L{layer}H{head}`` above it) and the accuracy of the best fixed
    offset (grey, the offset above it). A head that beats its baseline by a wide margin
    tracks the relation rather than a position.

    Args:
        census: a :class:`~attnprobe.heads.Census` with syntax, or its ``syntax()`` table
            (``relation``, ``count``, ``accuracy``, ``baseline``; ``head_id``,
            ``baseline_offset`` and ``direction`` are shown when present).
        min_count: relations seen fewer times are left out (default ``MIN_COUNT`` = 20, as
            the census and the labels use).
        relations: plot only these relations, in this order (default: the table's order).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``): two ``BarContainer`` s, ``head`` then
        ``baseline``, one bar per relation; x tick labels ``relation`` and ``n=count``.

    Example:
        >>> table = ap.heads.syntax(maps, trees, min_count=1)   # or a Census with syntax
        >>> fig = ap.plot.syntax_accuracy(table, min_count=4, relations=["det", "all"])
        >>> head, baseline = fig.axes[0].containers
        >>> [round(float(b.get_height()), 6) for b in baseline]   # det: always the next word
        [1.0, 0.5]
    """
    if isinstance(min_count, bool) or not isinstance(min_count, int) or min_count < 1:
        raise InputError(f"min_count must be an integer >= 1; got {min_count!r}")
    table = syntax_table(census, min_count)
    check_table(table, ("relation", "count", "accuracy", "baseline"), "syntax table")
    table = table[table["count"] >= min_count]
    if relations is not None:
        missing = [r for r in relations if r not in set(table["relation"])]
        if missing:
            raise InputError(f"syntax table has no relation {missing} with at least "
                             f"{min_count} arcs")
        table = pd.concat([table[table["relation"] == r] for r in relations])
    if table.empty:
        raise InputError(f"no relation has at least {min_count} arcs; lower min_count")
    repeated = table["relation"].duplicated(keep=False)
    names = [f"{r} {d}" if rep and "direction" in table.columns else str(r)
             for r, rep, d in zip(table["relation"], repeated,
                                  table.get("direction", table["relation"]), strict=True)]
    x = np.arange(len(table))
    fig, axes = axes_for(ax, 2.0 + 0.8 * len(table), 3.8)
    head_colour = label_colours(["syntactic"])["syntactic"]
    heads = axes.bar(x - 0.2, table["accuracy"].astype(float), width=0.4, color=head_colour,
                     label="best head")
    base = axes.bar(x + 0.2, table["baseline"].astype(float), width=0.4,
                    color=BASELINE_COLOUR, label="best fixed offset")
    if "head_id" in table.columns:
        axes.bar_label(heads, labels=table["head_id"].astype(str).tolist(), fontsize=6,
                       padding=1)
    if "baseline_offset" in table.columns:
        axes.bar_label(base, labels=[_offset_text(o) for o in table["baseline_offset"]],
                       fontsize=6, padding=1)
    axes.set_xticks(x, labels=[f"{name}\nn={int(n)}" for name, n in
                               zip(names, table["count"], strict=True)], parse_math=False)
    axes.tick_params(axis="x", labelsize=7)
    axes.set_ylim(0, 1.1)
    axes.set_ylabel("accuracy (fraction of words)")
    axes.set_xlabel("dependency relation (arcs)")
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
    return done(fig, axes, ax)
