"""What every figure of :mod:`attnprobe.plot` shares: figures made without pyplot (no global
state, nothing left open), input checks with one-line errors, the label colours from
:data:`attnprobe.heads.label_rules.RULES`, and head grids (layer × head) built from tables.

matplotlib and seaborn are imported on first use through :func:`attnprobe.core.optional.require`
(a missing one is a :class:`~attnprobe.errors.MissingExtraError` naming ``attnprobe[report]``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from types import ModuleType
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.core.optional import require
from attnprobe.core.scope import Scope
from attnprobe.errors import InputError
from attnprobe.heads.label_rules import RULES

__all__ = ["HEAD_KEYS", "SPARE_PALETTE", "axes_for", "check_table", "done", "head_matrix",
           "known_subset", "label_colours", "label_order", "legend_marker", "legend_patch",
           "new_figure", "one_stack", "seaborn", "set_token_ticks", "single_head", "table_from"]

HEAD_KEYS = ("stack", "kind", "layer", "head")
# colours for labels whose rule has none, and for values that are not labels (``family``)
SPARE_PALETTE = ("#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2",
                 "#7f7f7f", "#bcbd22", "#17becf")


# ----------------------------------------------------------------------------- figures
def new_figure(width: float, height: float, *, layout: str | None = "constrained") -> Any:
    """A matplotlib ``Figure`` that pyplot does not know about (never shown, never left open,
    garbage-collected like any object; notebooks display it when it is returned)."""
    figure = require("matplotlib.figure")
    return figure.Figure(figsize=(max(width, 1.0), max(height, 1.0)), layout=layout)


def axes_for(ax: Any, width: float, height: float) -> tuple[Any, Any]:
    """``(figure, axes)``: the given ``ax`` and its figure, or a new figure with one axes."""
    if ax is not None:
        if not hasattr(ax, "get_figure") or not hasattr(ax, "plot"):
            raise InputError(f"ax must be a matplotlib Axes; got {type(ax).__name__}")
        return ax.get_figure(), ax
    fig = new_figure(width, height)
    return fig, fig.subplots()


def done(fig: Any, ax: Any, given: Any) -> Any:
    """What a single-axes plot returns: the ``Axes`` when the caller gave one, else the figure."""
    return ax if given is not None else fig


def legend_patch(colour: str, label: str) -> Any:
    """A filled square for a legend entry (a colour without a drawn artist behind it)."""
    return require("matplotlib.patches").Patch(facecolor=colour, edgecolor="none", label=label)


def legend_marker(marker: str, label: str) -> Any:
    """A grey marker for a legend entry (a marker shape without a drawn artist behind it)."""
    return require("matplotlib.lines").Line2D([], [], marker=marker, linestyle="",
                                              markerfacecolor="#cccccc",
                                              markeredgecolor="black", label=label)


def seaborn() -> ModuleType:
    """seaborn, imported on first use."""
    return require("seaborn")


def set_token_ticks(ax: Any, axis: str, tokens: Sequence[str], *, rotate: bool = False,
                    offset: float = 0.0) -> None:
    """Every token as a tick label, drawn as plain text (``$`` never starts mathtext)."""
    positions = np.arange(len(tokens)) + offset
    setter = ax.set_xticks if axis == "x" else ax.set_yticks
    extra = {"rotation": 90} if rotate else {}
    setter(positions, labels=[str(t) for t in tokens], parse_math=False, **extra)


# ----------------------------------------------------------------------------- inputs
def table_from(obj: Any, method: str, what: str, *, call: Callable[[Any], pd.DataFrame] | None
               = None) -> pd.DataFrame:
    """A DataFrame as it is, or the table a result object gives (``obj.<method>()``, or
    ``call(obj)``); anything else is a one-line error naming both forms."""
    if isinstance(obj, pd.DataFrame):
        return obj
    if hasattr(obj, method) and callable(getattr(obj, method)):
        return call(obj) if call is not None else getattr(obj, method)()
    raise InputError(f"expected {what} or its {method}() table (a DataFrame); "
                     f"got {type(obj).__name__}")


def known_subset(present: Sequence[str], wanted: Sequence[str] | None, what: str,
                 where: str) -> list[str]:
    """``wanted`` (in its order) when every item is ``present``, or all of ``present`` when
    ``wanted`` is None; an unknown item is a one-line error naming what there is."""
    if wanted is None:
        return list(present)
    unknown = [w for w in wanted if w not in present]
    if unknown:
        raise InputError(f"no {what} {unknown} {where}; it has {list(present)}")
    return list(wanted)


def check_table(table: pd.DataFrame, columns: Iterable[str], what: str) -> pd.DataFrame:
    """``table`` when it is a non-empty DataFrame holding ``columns``; else a one-line error."""
    if not isinstance(table, pd.DataFrame):
        raise InputError(f"{what} must be a DataFrame; got {type(table).__name__}")
    if table.empty:
        raise InputError(f"{what} is empty: nothing to plot")
    missing = [c for c in columns if c not in table.columns]
    if missing:
        raise InputError(f"{what} lacks column(s) {', '.join(missing)}; it has "
                         f"{', '.join(map(str, table.columns))}")
    return table


def one_value(table: pd.DataFrame, column: str, wanted: Any, what: str) -> pd.DataFrame:
    """The rows with ``column == wanted`` (compared as text); without ``wanted``, the table,
    whose ``column`` must then hold one value. A table without ``column`` is itself one
    value, but cannot be filtered: both errors are one line naming ``what``."""
    if column not in table.columns:
        if wanted is not None:
            raise InputError(f"{what} has no {column!r} column; leave {column}=None")
        return table
    values = list(dict.fromkeys(table[column].astype(str)))
    if wanted is None:
        if len(values) > 1:
            raise InputError(f"{what} holds several {column}s {values}; pass {column}=")
        return table
    if str(wanted) not in values:
        raise InputError(f"{what} has no {column} {wanted!r}; it has {values}")
    return table[table[column].astype(str) == str(wanted)]


def one_stack(table: pd.DataFrame, stack: str | None, kind: str | None,
              what: str) -> pd.DataFrame:
    """The rows of one attention stack (``stack``/``kind`` columns, when the table has them):
    the one there is, or the one asked for; several without a choice is an error."""
    for column, wanted in (("stack", stack), ("kind", kind)):
        table = one_value(table, column, wanted, what)
    return table


def single_head(scope: object) -> tuple[int, int] | None:
    """``(layer, head)`` when ``scope`` names exactly one head (``head:3.5``), else None."""
    try:
        parsed = Scope.parse(str(scope))
    except InputError:
        return None
    if len(parsed.terms) != 1:
        return None
    layer, head = next(iter(parsed.terms))
    return None if layer is None or head is None else (int(layer), int(head))


# ----------------------------------------------------------------------------- labels
def label_order(values: Iterable[str]) -> list[str]:
    """The distinct ``values`` in precedence order (labels first, by rank; others by name)."""
    precedence = RULES.precedence()
    distinct = set(map(str, values))
    known = [label for label in precedence if label in distinct]
    return known + sorted(distinct - set(known))


def label_colours(values: Iterable[str]) -> dict[str, str]:
    """``{value: '#rrggbb'}``: a label's colour from its rule; values without one (a rule
    without a colour, a ``family`` name) get distinct spare colours in order."""
    colours: dict[str, str] = {}
    spare = iter(SPARE_PALETTE)
    used: set[str] = set()
    order = label_order(values)
    for value in order:
        colour = RULES.colour(value)
        if colour is not None:
            colours[value] = colour
            used.add(colour.lower())
    for value in order:
        if value not in colours:
            colour = next((c for c in spare if c.lower() not in used), "#999999")
            colours[value] = colour
            used.add(colour.lower())
    return colours


# ----------------------------------------------------------------------------- head grids
def head_matrix(table: pd.DataFrame, value: str, *, what: str) -> pd.DataFrame:
    """``layer × head`` DataFrame of ``value`` (index: the layers present, columns: the heads
    present, NaN where a head is missing); one row per head is required."""
    check_table(table, ("layer", "head", value), what)
    keys = table[["layer", "head"]]
    if keys.isna().any().any():
        raise InputError(f"{what}: layer/head must not be missing")
    layers = pd.to_numeric(keys["layer"], errors="coerce")
    heads = pd.to_numeric(keys["head"], errors="coerce")
    if layers.isna().any() or heads.isna().any():
        raise InputError(f"{what}: layer and head must be integers")
    frame = pd.DataFrame({"layer": layers.astype(int).to_numpy(),
                          "head": heads.astype(int).to_numpy(),
                          "value": table[value].to_numpy()})
    repeated = frame.duplicated(["layer", "head"])
    if repeated.any():
        row = frame[repeated].iloc[0]
        raise InputError(f"{what}: head L{row['layer']}H{row['head']} appears more than once")
    return frame.pivot(index="layer", columns="head", values="value").sort_index(
        axis=0).sort_index(axis=1)
