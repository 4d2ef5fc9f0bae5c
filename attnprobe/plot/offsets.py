"""Where heads look by relative position: the offset profile (:func:`offset_profile`), a
heatmap with one row per head and one column per offset ``key − query``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.core.scope import Scope, ScopeLike, head_id
from attnprobe.errors import InputError
from attnprobe.plot.common import axes_for, check_table, done, one_stack, seaborn, table_from
from attnprobe.plot.figure import figure

RANK = 30  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["offset_profile", "offsets_table"]

VALUE_LABELS = {"mass": "mean weight at the offset",
                "argmax_share": "share of rows with their argmax there"}


def offsets_table(census: Any) -> pd.DataFrame:
    """The tidy table the offset profile draws: ``census.offsets()`` (one row per head and
    relative offset), or such a table as it is.

    Example:
        >>> {"layer", "head", "offset", "mass"} <= set(offsets_table(lm_census).columns)
        True
    """
    return table_from(census, "offsets", "a Census")


@figure(data=offsets_table, rank=30,
        shows="attention mass per relative offset, per head",
        source="Census / ``offsets()``")
def offset_profile(census: Any, *, value: str = "mass", scope: ScopeLike = None,
                   window: int | None = 8, stack: str | None = None, kind: str | None = None,
                   cmap: str = "viridis", ax: Any = None) -> Any:
    """Attention by relative offset, per head: one row per head (``L{layer}H{head}``, in model
    order), one column per offset ``key − query`` (−1 is the previous token, 0 the token
    itself), coloured by ``value``.

    A previous-token head is one bright cell at −1; a broad head a flat row. Offsets seen in
    no sentence are blank.

    Args:
        census: a :class:`~attnprobe.heads.Census` or its ``offsets()`` table (``layer``,
            ``head``, ``offset`` and ``value``).
        value: ``mass`` (mean weight at the offset) or ``argmax_share``.
        scope: which heads (the scope language, e.g. ``"layers:0-1"``).
        window: offsets ``−window..window`` (None: every offset in the table).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); the heatmap is one ``QuadMesh`` of heads × offsets.

    Example:
        >>> fig = ap.plot.offset_profile(lm_census, window=4)   # or lm_census.offsets()
        >>> heat = fig.axes[0]
        >>> len(heat.get_yticklabels())                 # one row per head
        8
        >>> heat.collections[0].get_array().shape       # heads × offsets -4..4
        (8, 9)
    """
    table = offsets_table(census)
    check_table(table, ("layer", "head", "offset", value), "offsets table")
    table = one_stack(table, stack, kind, "offsets table")
    chosen = Scope.parse(scope)
    inside = [chosen.contains(int(layer), int(head))
              for layer, head in zip(table["layer"], table["head"], strict=True)]
    table = table[inside]
    if window is not None:
        if isinstance(window, bool) or not isinstance(window, int) or window < 0:
            raise InputError(f"window must be a non-negative integer or None; got {window!r}")
        table = table[table["offset"].astype(int).abs() <= window]
    if table.empty:
        raise InputError(f"offsets table has no row for scope {chosen} within the window")
    if table.duplicated(["layer", "head", "offset"]).any():
        raise InputError("offsets table has several rows for one head and offset")
    matrix = table.astype({"layer": int, "head": int, "offset": int}).pivot(
        index=["layer", "head"], columns="offset", values=value).sort_index().sort_index(axis=1)
    offsets = matrix.columns.to_numpy()
    n_heads = len(matrix)
    fig, axes = axes_for(ax, 2.4 + 0.34 * len(offsets), 1.2 + 0.22 * n_heads)
    seaborn().heatmap(matrix.to_numpy(dtype=float), ax=axes, cmap=cmap, vmin=0.0,
                      mask=np.isnan(matrix.to_numpy(dtype=float)),
                      cbar_kws={"label": VALUE_LABELS.get(value, value)})
    axes.set_xticks(np.arange(len(offsets)) + 0.5, labels=[f"{o:+d}" if o else "0"
                                                            for o in offsets])
    axes.set_yticks(np.arange(n_heads) + 0.5,
                    labels=[head_id(layer, head) for layer, head in matrix.index])
    axes.tick_params(axis="y", labelrotation=0, labelsize=7)
    axes.tick_params(axis="x", labelrotation=0, labelsize=7)
    axes.set_xlabel("relative offset (key − query, tokens)")
    axes.set_ylabel("head")
    return done(fig, axes, ax)
