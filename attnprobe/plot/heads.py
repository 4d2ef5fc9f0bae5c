"""The head census as figures: what every head was labelled (:func:`head_grid`), how the labels
spread over the layers (:func:`layer_profile`) and which heads behave alike
(:func:`head_clusters`).

Each takes a :class:`~attnprobe.heads.Census` or the table it gives (``classify()``,
``layer_profile()``, ``clusters()``). Labels are coloured with their rule's colour
(``RULES.colour(label)``) and listed in precedence order (``RULES.precedence()``); any other
categorical column (e.g. a ``family`` column) can be plotted with ``by=``.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.plot.common import (
    HEAD_KEYS,
    axes_for,
    check_table,
    done,
    head_matrix,
    label_colours,
    label_order,
    legend_marker,
    legend_patch,
    one_stack,
    table_from,
)
from attnprobe.plot.figure import figure

RANK = 20  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["classified_heads", "clusters_table", "head_clusters", "head_grid",
           "layer_profile", "short_label"]

MARKERS = ("o", "s", "^", "D", "v", "P", "X", "*", "h", "<", ">", "p")
EMPTY = (1.0, 1.0, 1.0, 0.0)  # a head without a row: transparent


def short_label(label: str) -> str:
    """A cell-sized form of a label: ``previous`` -> ``prev``, ``vertical+diagonal`` -> ``v+d``."""
    if "+" in label:
        return "+".join(part[:1] for part in label.split("+"))
    return label if len(label) <= 5 else label[:4]


def _rgb(colour: str) -> tuple[float, float, float]:
    colour = colour.lstrip("#")
    return tuple(int(colour[i:i + 2], 16) / 255 for i in (0, 2, 4))  # type: ignore[return-value]


def classified_heads(census: Any) -> pd.DataFrame:
    """The tidy table the head grid and the layer profile draw: ``census.classify()`` (one
    row per head: ``layer, head, label`` and the scores), or such a table as it is.

    Example:
        >>> list(classified_heads(lm_census)[["layer", "head"]].iloc[0])
        [0, 0]
    """
    return table_from(census, "classify", "a Census")


def clusters_table(census: Any, n_clusters: int = 6) -> pd.DataFrame:
    """The tidy table the cluster scatter draws: ``census.clusters(n_clusters)`` (one row
    per head: ``x, y, layer, head, cluster``), or such a table as it is.

    Example:
        >>> len(clusters_table(lm_census, n_clusters=2))    # one row per head
        8
    """
    return table_from(census, "clusters", "a Census", call=lambda c: c.clusters(n_clusters))


def _classified(census: Any, by: str, stack: str | None, kind: str | None) -> pd.DataFrame:
    table = classified_heads(census)
    check_table(table, ("layer", "head", by), "classified table")
    return one_stack(table, stack, kind, "classified table")


@figure(data=classified_heads, rank=20,
        shows="layer × head cells coloured by label",
        source="Census / ``classify()``")
def head_grid(census: Any, *, by: str = "label", stack: str | None = None,
              kind: str | None = None, annotate: bool | None = None, ax: Any = None) -> Any:
    """Every head as one cell of a layer × head grid, coloured by its label.

    Rows are layers (the first on top), columns heads, both by model index; a head the table
    does not cover stays blank. The legend lists the labels present in precedence order, with
    their rule's colour; ``annotate`` writes a short form of the label in each cell (default:
    grids up to 24 layers × 16 heads).

    Args:
        census: a :class:`~attnprobe.heads.Census` or its ``classify()`` table (one row per
            head: ``layer``, ``head`` and the ``by`` column).
        by: the column that colours the cells: ``label`` (default), or any categorical column
            such as ``family`` (values that are not labels get spare colours).
        stack, kind: which attention stack, when the table has several.
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); the grid is one ``AxesImage`` of RGBA cells.

    Example:
        >>> fig = ap.plot.head_grid(lm_census)          # or lm_census.classify()
        >>> grid = fig.axes[0]
        >>> grid.get_title(), grid.images[0].get_array().shape     # layer × head × RGBA
        ('8 heads by label', (2, 4, 4))
    """
    table = _classified(census, by, stack, kind)
    matrix = head_matrix(table.assign(**{by: table[by].astype(str)}), by, what="classified table")
    values = [v for v in matrix.to_numpy().ravel() if isinstance(v, str)]
    colours = label_colours(values)
    rgba = np.array([[(*_rgb(colours[v]), 1.0) if isinstance(v, str) else EMPTY for v in row]
                     for row in matrix.to_numpy()])
    n_layers, n_heads = matrix.shape
    fig, axes = axes_for(ax, 2.8 + 0.55 * n_heads, 1.0 + 0.45 * n_layers)
    axes.imshow(rgba, aspect="auto", interpolation="nearest")
    axes.set_xticks(range(n_heads), labels=[str(h) for h in matrix.columns])
    axes.set_yticks(range(n_layers), labels=[str(layer) for layer in matrix.index])
    axes.set_xlabel("head")
    axes.set_ylabel("layer")
    if annotate is None:
        annotate = n_layers <= 24 and n_heads <= 16
    if annotate:
        for (r, c), value in np.ndenumerate(matrix.to_numpy()):
            if isinstance(value, str):
                light = sum(_rgb(colours[value])) / 3 > 0.55
                axes.text(c, r, short_label(value), ha="center", va="center", fontsize=6,
                          color="black" if light else "white", parse_math=False)
    handles = [legend_patch(colours[v], v) for v in label_order(values)]
    axes.legend(handles=handles, title=by, loc="upper left", bbox_to_anchor=(1.01, 1.0),
                fontsize=7, title_fontsize=8, frameon=False)
    axes.set_title(f"{len(values)} heads by {by}")
    return done(fig, axes, ax)


def _shares(census: Any, by: str, stack: str | None, kind: str | None) -> pd.DataFrame:
    """Share of each value of ``by`` per layer: a ``layer × value`` frame (rows sum to 1)."""
    if isinstance(census, pd.DataFrame) and by not in census.columns and any(
            str(c).startswith("share_") for c in census.columns):
        if by != "label":
            raise InputError(f"a layer profile table holds label shares only; by={by!r} "
                             "needs the classify() table")
        profile = one_stack(check_table(census, ("layer",), "layer profile"), stack, kind,
                            "layer profile")
        if profile["layer"].duplicated().any():
            raise InputError("layer profile has several rows per layer")
        shares = profile.set_index("layer")[[c for c in profile.columns
                                             if str(c).startswith("share_")]]
        shares.columns = [str(c)[len("share_"):] for c in shares.columns]
        return shares.astype(float).sort_index()
    table = _classified(census, by, stack, kind)
    counts = pd.crosstab(table["layer"].astype(int), table[by].astype(str))
    return counts.div(counts.sum(axis=1), axis=0).sort_index()


@figure(data=classified_heads, rank=21,
        shows="label shares per layer, stacked bars",
        source="Census / ``classify()`` / ``layer_profile()``")
def layer_profile(census: Any, *, by: str = "label", stack: str | None = None,
                  kind: str | None = None, ax: Any = None) -> Any:
    """Share of each label per layer as stacked bars (one bar per layer, summing to 1).

    Reading left to right shows where each kind of head lives (e.g. positional heads early,
    broad heads late). Segments are stacked and listed in precedence order with the label
    colours; labels with no head anywhere are left out.

    Args:
        census: a :class:`~attnprobe.heads.Census`, its ``classify()`` table (shares are
            counted per layer) or its ``layer_profile()`` table (``share_<label>`` columns).
        by: ``label`` (default) or another categorical column of the classify() table.
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); one ``BarContainer`` per label, in legend order.

    Example:
        >>> fig = ap.plot.layer_profile(lm_census)
        >>> bars = fig.axes[0].containers               # one stack segment per label
        >>> len(bars) == lm_census.classify()["label"].nunique()
        True
        >>> [round(float(sum(b[i].get_height() for b in bars)), 6) for i in range(2)]
        [1.0, 1.0]
    """
    shares = _shares(census, by, stack, kind)
    present = [v for v in label_order(shares.columns) if (shares[v] > 0).any()]
    if not present:
        raise InputError("layer profile: every share is zero")
    colours = label_colours(present)
    layers = shares.index.to_numpy()
    fig, axes = axes_for(ax, 3.6 + 0.45 * len(layers), 3.4)
    bottom = np.zeros(len(layers))
    for value in present:
        height = shares[value].fillna(0.0).to_numpy()
        axes.bar(layers, height, bottom=bottom, width=0.8, color=colours[value], label=value)
        bottom += height
    axes.set_xticks(layers, labels=[str(v) for v in layers])
    axes.set_xlabel("layer")
    axes.set_ylabel("share of the layer's heads")
    axes.set_ylim(0, 1.0)
    axes.legend(title=by, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                title_fontsize=8, frameon=False)
    return done(fig, axes, ax)


def _clustered(census: Any, n_clusters: int, labels: Any, by: str, stack: str | None,
               kind: str | None) -> pd.DataFrame:
    table = clusters_table(census, n_clusters)
    check_table(table, ("x", "y", "layer", "head"), "clusters table")
    if by not in table.columns:
        source = labels if labels is not None else (
            census if not isinstance(census, pd.DataFrame) else None)
        if source is not None:
            named = table_from(source, "classify", "a Census")
            keys = [k for k in HEAD_KEYS if k in table.columns and k in named.columns]
            check_table(named, (*keys, by), "labels table")
            table = table.merge(named[[*keys, by]].drop_duplicates(keys), on=keys, how="left")
    return one_stack(table, stack, kind, "clusters table")


@figure(data=clusters_table, rank=45,
        shows="heads at their MDS coordinates, coloured by label",
        source="Census / ``clusters()``")
def head_clusters(census: Any, *, n_clusters: int = 6, labels: Any = None, by: str = "label",
                  stack: str | None = None, kind: str | None = None, annotate: bool = True,
                  ax: Any = None) -> Any:
    """Heads placed by their 2-D MDS coordinates (Jensen–Shannon distances between their
    attention), coloured by label, with one marker shape per cluster.

    Heads close together attend alike. Points are coloured by ``by`` (the label colours,
    legend in precedence order; by cluster when no label is known) and, with ``annotate``,
    named ``L{layer}H{head}``.

    Args:
        census: a :class:`~attnprobe.heads.Census` (its ``clusters(n_clusters)`` and labels),
            or a ``clusters()`` table (``x``, ``y``, ``layer``, ``head``, ``cluster``) with a
            ``by`` column or ``labels=`` (a Census or ``classify()`` table to take it from).
        n_clusters: how many clusters the census forms (a Census only).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax``); one ``PathCollection`` per cluster whose face
        colours are the heads' label colours.

    Example:
        >>> fig = ap.plot.head_clusters(lm_census, n_clusters=3)
        >>> points = fig.axes[0].collections            # one marker set per cluster
        >>> len(points) == lm_census.clusters(3)["cluster"].nunique()
        True
        >>> sum(len(p.get_offsets()) for p in points)   # every head once
        8
    """
    table = _clustered(census, n_clusters, labels, by, stack, kind)
    clusters = table["cluster"] if "cluster" in table.columns else pd.Series(1, table.index)
    colour_by = by if by in table.columns and table[by].notna().all() else None
    if colour_by is None:
        colours = label_colours(f"cluster {c}" for c in clusters)
        keys = [f"cluster {c}" for c in clusters]
    else:
        keys = table[by].astype(str).tolist()
        colours = label_colours(keys)
    fig, axes = axes_for(ax, 6.2, 4.8)
    points = table.assign(_key=keys, _cluster=clusters.to_numpy())
    handles = [legend_patch(colours[v], v) for v in label_order(keys)]
    for i, (cluster, group) in enumerate(points.groupby("_cluster", sort=True)):
        marker = MARKERS[i % len(MARKERS)]
        axes.scatter(group["x"], group["y"], s=42, marker=marker,
                     c=[colours[k] for k in group["_key"]], edgecolors="black",
                     linewidths=0.4, label=f"cluster {cluster}", zorder=2)
        if colour_by is not None:
            handles.append(legend_marker(marker, f"cluster {cluster}"))
    if annotate:
        for row in points.itertuples():
            axes.annotate(f"L{int(row.layer)}H{int(row.head)}", (row.x, row.y), fontsize=6,
                          xytext=(3, 3), textcoords="offset points")
    axes.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7,
                frameon=False)
    axes.set_aspect("equal", adjustable="datalim")
    axes.set_xlabel("MDS 1 (Jensen–Shannon distance)")
    axes.set_ylabel("MDS 2 (Jensen–Shannon distance)")
    return done(fig, axes, ax)
