"""Attention weights themselves: one head as a query × key heatmap with the tokens on the axes
(:func:`attention_head`), and every head at once as small multiples (:func:`model_view`,
BertViz's model view as a static figure).

Both take an :class:`~attnprobe.types.AttentionMap` or its tidy ``to_frame()`` table (columns
``MAP_COLUMNS``; one example and one attention stack, or pick them with ``example_id=``,
``stack=``, ``kind=``).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.core.scope import Scope, ScopeLike, head_id
from attnprobe.errors import InputError
from attnprobe.plot.common import (
    axes_for,
    check_table,
    done,
    new_figure,
    one_stack,
    seaborn,
    set_token_ticks,
)
from attnprobe.plot.figure import figure
from attnprobe.types import MAP_COLUMNS, AttentionMap

RANK = 10  # discovery order of the plot modules (each figure has its own rank)

__all__ = ["HeadWeights", "attention_head", "attention_table", "head_weights", "model_view"]


@dataclass(frozen=True)
class HeadWeights:
    """Weights of one example as arrays: ``weights[layer, head, query, key]`` (NaN where a
    head was not captured), with the model indices of both axes and the tokens."""

    weights: np.ndarray
    layers: tuple[int, ...]
    heads: tuple[int, ...]
    query_tokens: tuple[str, ...]
    key_tokens: tuple[str, ...]
    example_id: str

    def head(self, layer: int, head: int) -> np.ndarray:
        """``[query, key]`` weights of one head; an unknown head is a one-line error."""
        if layer not in self.layers or head not in self.heads:
            raise InputError(f"no head {head_id(layer, head)} here; layers "
                             f"{list(self.layers)}, heads {list(self.heads)}")
        found = self.weights[self.layers.index(layer), self.heads.index(head)]
        if np.isnan(found).all():
            raise InputError(f"head {head_id(layer, head)} was not captured in this table")
        return found


def head_weights(attention: AttentionMap | pd.DataFrame, *, example_id: str | None = None,
                 stack: str | None = None, kind: str | None = None) -> HeadWeights:
    """The weights of one example from a map or from its ``to_frame()`` table."""
    if isinstance(attention, AttentionMap):
        return HeadWeights(attention.pattern.numpy(), attention.layers, attention.heads,
                           attention.readable_tokens("query"), attention.readable_tokens("key"),
                           attention.example_id)
    if isinstance(attention, (list, tuple)):
        raise InputError(f"pass one AttentionMap (e.g. maps[0]), not a {type(attention).__name__}"
                         f" of {len(attention)}")
    if not isinstance(attention, pd.DataFrame):
        raise InputError("expected an AttentionMap or its to_frame() table; got "
                         f"{type(attention).__name__}")
    table = check_table(attention, MAP_COLUMNS, "attention table")
    table = one_stack(table, stack, kind, "attention table")
    examples = list(dict.fromkeys(table["example_id"].astype(str)))
    if example_id is not None:
        if str(example_id) not in examples:
            raise InputError(f"attention table has no example {example_id!r}; it has {examples}")
        table = table[table["example_id"].astype(str) == str(example_id)]
    elif len(examples) > 1:
        raise InputError(f"attention table holds {len(examples)} examples; pass example_id= "
                         f"(one of {examples[:5]})")
    layers = tuple(sorted(int(v) for v in table["layer"].unique()))
    heads = tuple(sorted(int(v) for v in table["head"].unique()))
    queries = table.drop_duplicates("query_pos").sort_values("query_pos")
    keys = table.drop_duplicates("key_pos").sort_values("key_pos")
    n_q, n_k = int(queries["query_pos"].max()) + 1, int(keys["key_pos"].max()) + 1
    if len(queries) != n_q or len(keys) != n_k:
        raise InputError("attention table misses query or key positions; plot whole maps")
    weights = np.full((len(layers), len(heads), n_q, n_k), np.nan)
    li = table["layer"].map({v: i for i, v in enumerate(layers)}).to_numpy(int)
    hi = table["head"].map({v: i for i, v in enumerate(heads)}).to_numpy(int)
    weights[li, hi, table["query_pos"].to_numpy(int), table["key_pos"].to_numpy(int)] = \
        table["weight"].to_numpy(float)
    return HeadWeights(weights, layers, heads, tuple(queries["query_token"].astype(str)),
                       tuple(keys["key_token"].astype(str)), examples[0] if examples else "")


def attention_table(attention: AttentionMap | pd.DataFrame) -> pd.DataFrame:
    """The tidy table both attention figures draw: an :class:`AttentionMap`'s
    ``to_frame()`` (one row per layer, head, query and key: ``MAP_COLUMNS``), or such a
    table as it is.

    Example:
        >>> attention_table(amap).shape[0] == amap.pattern.numel()
        True
    """
    if isinstance(attention, AttentionMap):
        return attention.to_frame()
    return check_table(attention, MAP_COLUMNS, "attention table")


@figure(data=attention_table, rank=10,
        shows="one head: query × key heatmap with the tokens",
        source="AttentionMap / table")
def attention_head(attention: AttentionMap | pd.DataFrame, layer: int, head: int, *,
                   example_id: str | None = None, stack: str | None = None,
                   kind: str | None = None, vmax: float | None = None, annotate: bool = False,
                   cmap: str = "Blues", ax: Any = None) -> Any:
    """Heatmap of one head: a cell per (query, key) coloured by its attention weight.

    Rows are the query tokens (who attends, top to bottom), columns the key tokens (what is
    attended to); both axes are labelled with every token. The colour bar is the weight
    (0 to ``vmax``, default the head's largest weight); ``annotate=True`` writes each weight
    in its cell.

    Args:
        attention: an :class:`AttentionMap` or its ``to_frame()`` table.
        layer, head: model indices of the head (``L{layer}H{head}``).
        ax: draw into this matplotlib Axes (and return it) instead of a new Figure.

    Returns:
        A matplotlib ``Figure`` (or ``ax`` when one was given).

    Raises:
        InputError: a head that is not in the map, an empty or malformed table.

    Example:
        >>> fig = ap.plot.attention_head(amap, 0, 2)     # amap: [6, 12, 9, 9]
        >>> heat = fig.axes[0]                          # fig.axes[1] is the colour bar
        >>> heat.get_title(), len(heat.get_xticklabels()), len(heat.get_yticklabels())
        ('L0H2 · example 0', 9, 9)
        >>> same = ap.plot.attention_head(amap.to_frame(), 0, 2)   # or from its table
        >>> fig.savefig("L0H2.svg")
    """
    found = head_weights(attention, example_id=example_id, stack=stack, kind=kind)
    weights = found.head(layer, head)
    n_q, n_k = weights.shape
    fig, axes = axes_for(ax, 1.6 + 0.42 * n_k, 1.0 + 0.36 * n_q)
    seaborn().heatmap(weights, ax=axes, cmap=cmap, vmin=0.0, vmax=vmax, square=False,
                      annot=annotate, fmt=".2f", linewidths=0.0,
                      cbar_kws={"label": "attention weight (fraction of the row)"})
    set_token_ticks(axes, "x", found.key_tokens, rotate=True, offset=0.5)
    set_token_ticks(axes, "y", found.query_tokens, offset=0.5)
    axes.tick_params(axis="y", labelrotation=0)
    axes.set_xlabel("key token (attended to)")
    axes.set_ylabel("query token (attending)")
    title = head_id(layer, head)
    axes.set_title(f"{title} · example {found.example_id}" if found.example_id else title)
    return done(fig, axes, ax)


@figure(data=attention_table, rank=11,
        shows="every head as a small heatmap, layers × heads",
        source="AttentionMap / table")
def model_view(attention: AttentionMap | pd.DataFrame, *, scope: ScopeLike = None,
               example_id: str | None = None, stack: str | None = None,
               kind: str | None = None, vmax: float = 1.0, cmap: str = "Blues",
               cell: float = 0.9) -> Any:
    """Every head as a small heatmap: a grid with one row per layer and one column per head.

    Each thumbnail is the head's ``[query, key]`` weights on one colour scale (0 to ``vmax``,
    shared colour bar), so patterns compare at a glance: diagonals (previous / self / next
    token), vertical stripes (sinks on ``[CLS]``/``[SEP]``), uniform grey (broad heads). Rows
    are labelled ``L{layer}``, columns ``H{head}``; heads outside ``scope`` stay empty.

    Args:
        attention: an :class:`AttentionMap` or its ``to_frame()`` table.
        scope: which heads (the scope language: ``"layers:0-2"``, ``"heads:0.2,1.8"`` ...).
        cell: the size of one thumbnail in inches.

    Returns:
        A matplotlib ``Figure`` (one Axes per grid cell, row-major).

    Example:
        >>> fig = ap.plot.model_view(amap, scope="layers:0-1")   # 2 layers × 12 heads
        >>> len(fig.axes)                               # 24 thumbnails and the colour bar
        25
        >>> [a.get_title() for a in fig.axes[:3]]
        ['H0', 'H1', 'H2']
    """
    found = head_weights(attention, example_id=example_id, stack=stack, kind=kind)
    chosen = Scope.parse(scope)
    layers = [layer for layer in found.layers if chosen.wants_layer(layer)]
    heads = [h for h in found.heads if any(chosen.contains(layer, h) for layer in layers)]
    if not layers or not heads:
        raise InputError(f"scope {chosen} selects no head of this map (layers "
                         f"{list(found.layers)}, heads {list(found.heads)})")
    width, height = max(3.2, 1.6 + cell * len(heads)), 0.9 + cell * len(layers)
    fig = new_figure(width, height, layout=None)  # a fixed grid: a solver is slow on 100s of axes
    grid = fig.subplots(len(layers), len(heads), squeeze=False,
                        gridspec_kw={"left": 0.5 / width, "right": 1 - 1.1 / width,
                                     "bottom": 0.15 / height, "top": 1 - 0.6 / height,
                                     "wspace": 0.08, "hspace": 0.08})
    image = None
    for r, layer in enumerate(layers):
        for c, h in enumerate(heads):
            axes = grid[r, c]
            axes.set_xticks([])
            axes.set_yticks([])
            if r == 0:
                axes.set_title(f"H{h}", fontsize=8)
            if c == 0:
                axes.set_ylabel(f"L{layer}", fontsize=8)
            weights = found.weights[found.layers.index(layer), found.heads.index(h)]
            if not chosen.contains(layer, h) or np.isnan(weights).all():
                axes.set_frame_on(False)
                continue
            image = axes.imshow(weights, cmap=cmap, vmin=0.0, vmax=vmax, aspect="auto",
                                interpolation="nearest")
            axes.set_gid(head_id(layer, h))
    if image is not None:
        bar = fig.add_axes((1 - 0.85 / width, 0.15 / height, 0.15 / width,
                            1 - 0.75 / height))
        fig.colorbar(image, cax=bar, label="attention weight")
    what = f"example {found.example_id}: " if found.example_id else ""
    fig.suptitle(f"{what}{len(found.query_tokens)} queries (rows) × {len(found.key_tokens)} "
                 "keys", fontsize=8)
    return fig
