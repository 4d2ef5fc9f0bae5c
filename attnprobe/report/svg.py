"""Inline SVG figures (no matplotlib): head grid, layer profile, head MDS scatter.

This module computes the geometry; ``templates/figures.svg.j2`` writes the SVG, escaping
every text and tooltip. A label's colour and family come from its rule in
:data:`attnprobe.heads.labels.RULES`, so a newly registered label is drawn in its own colour
(or in :data:`UNKNOWN_COLOUR` when its rule has none) and listed under its family without
touching this module. Legends list labels grouped by family (families in the order of their
first label in the precedence); the head grid's legend gives the number of heads of each
family and label.
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from typing import Any

import pandas as pd

from attnprobe.heads import labels as label_rules
from attnprobe.report.templating import environment

UNKNOWN_COLOUR = "#dddddd"
# Colours of clusters when the heads have no labels (Tableau 10, colour-blind friendly first).
CLUSTER_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
                   "#ff9da7", "#9c755f", "#bab0ac")
# Scores shown in a head's tooltip when present.
KEY_SCORES = ("entropy_norm", "max_weight", "prev", "self", "next", "first", "special",
              "sink", "prev_nosink", "self_nosink", "next_nosink", "entropy_norm_nosink",
              "distance", "pos_score", "syntax_accuracy", "rep_induction")
LEFT = 90  # room for the row names left of the grid and bars


def colour(label: object) -> str:
    """The colour of ``label``: its rule's colour, else :data:`UNKNOWN_COLOUR`."""
    return label_rules.RULES.colour(str(label)) or UNKNOWN_COLOUR


def palette() -> dict[str, str]:
    """Every label (precedence order) with the colour it is drawn in."""
    return {label: colour(label) for label in label_rules.RULES.precedence()}


def _macro(name: str) -> Any:
    return getattr(environment().get_template("figures.svg.j2").module, name)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3g}"
    return str(value)


def head_tooltip(row: pd.Series) -> str:
    """Plain-text tooltip of one classified head (escaped by the template)."""
    family = row.get("family")
    lines = [f"{row.get('head_id', '')}: {row.get('label', '')}"
             + (f" ({family})" if isinstance(family, str) and family else "")]
    if isinstance(row.get("evidence"), str) and row["evidence"]:
        lines.append(row["evidence"])
    if isinstance(row.get("also"), str) and row["also"]:
        lines.append(f"also: {row['also']}")
    scores = [f"{k}={_fmt(row[k])}" for k in KEY_SCORES
              if k in row.index and not pd.isna(row[k])]
    if scores:
        lines.append(", ".join(scores))
    return "\n".join(lines)


def _in_order(present: Iterable[object]) -> list[str]:
    """The labels in ``present`` grouped by family (:func:`families`); labels no rule knows
    come last."""
    present = {str(label) for label in present}
    rules = label_rules.RULES
    order = [lab for family in rules.families() for lab in rules.labels_of(family)]
    return [lab for lab in order if lab in present] + sorted(present - set(order))


def families(labels: Iterable[object]) -> list[tuple[str, list[str]]]:
    """``[(family, [label, ...]), ...]`` of the labels present, families in the registry's
    order (:meth:`~attnprobe.heads.label_rules.RuleRegistry.families`), labels in precedence
    order; labels no rule knows form a last group named ``"other"``."""
    present = _in_order(labels)
    groups: dict[str, list[str]] = {}
    for label in present:
        groups.setdefault(label_rules.RULES.family(label) or "other", []).append(label)
    return list(groups.items())


def _legend(names: list[str], x: float, y: float) -> list[dict[str, Any]]:
    return [{"x": x, "y": y + i * 16, "fill": colour(name), "label": name}
            for i, name in enumerate(names)]


def _family_legend(labels: pd.Series, x: float, y: float) -> list[dict[str, Any]]:
    """Legend of the head grid: each family with its number of heads (a heading without a
    swatch), then its labels with theirs."""
    counts = labels.astype(str).value_counts()
    entries: list[dict[str, Any]] = []
    for family, members in families(counts.index):
        total = int(sum(counts[label] for label in members))
        entries.append({"x": x, "y": y + len(entries) * 16, "fill": None,
                        "label": f"{family} ({total})"})
        entries += [{"x": x + 8, "y": y + (len(entries) + i) * 16, "fill": colour(label),
                     "label": f"{label} ({int(counts[label])})"}
                    for i, label in enumerate(members)]
    return entries


def _row_name(stack: object, kind: object, layer: object, several: bool) -> str:
    return f"{stack} {kind} L{layer}" if several else f"L{layer}"


def head_grid(classified: pd.DataFrame, cell: int = 22) -> Any:
    """Layer × head grid, each cell coloured by label with a ``<title>`` tooltip.

    One grid row per (stack, kind, layer); ``classified`` is ``Census.classify()`` output.
    """
    frame = classified.sort_values(["stack", "kind", "layer", "head"])
    rows = list(dict.fromkeys(zip(frame["stack"], frame["kind"], frame["layer"], strict=True)))
    heads = sorted(set(int(h) for h in frame["head"]))
    col = {h: i for i, h in enumerate(heads)}
    row_of = {r: i for i, r in enumerate(rows)}
    several = len({(s, k) for s, k, _ in rows}) > 1
    top = 20
    legend = _family_legend(frame["label"], LEFT + cell * len(heads) + 16, top)
    texts = [{"x": LEFT + col[h] * cell + cell / 2, "y": top - 6, "body": f"H{h}",
              "anchor": "middle"} for h in heads]
    texts += [{"x": LEFT - 6, "y": top + r * cell + cell * 0.7, "anchor": "end",
               "body": _row_name(*row, several)} for r, row in enumerate(rows)]
    cells = [{"x": LEFT + col[int(row["head"])] * cell,
              "y": top + row_of[(row["stack"], row["kind"], row["layer"])] * cell,
              "head_id": str(row.get("head_id", "")), "fill": colour(row["label"]),
              "tip": head_tooltip(row)} for _, row in frame.iterrows()]
    return _macro("head_grid")({
        "width": LEFT + cell * len(heads) + 200, "size": cell - 2, "texts": texts,
        "height": max(top + cell * len(rows) + 10, top + 16 * len(legend) + 10),
        "cells": cells, "legend": legend})


def layer_profile_chart(profile: pd.DataFrame, bar: int = 18, width: int = 360) -> Any:
    """Horizontal stacked bars: share of each label per layer (``layer_profile()`` output)."""
    shares = [lab for lab in _in_order(c[len("share_"):] for c in profile.columns
                                       if c.startswith("share_"))
              if float(profile[f"share_{lab}"].sum()) > 0]
    top = 10
    several = profile[["stack", "kind"]].drop_duplicates().shape[0] > 1
    texts, bars = [], []
    for i, (_, row) in enumerate(profile.iterrows()):
        y = top + i * bar
        name = _row_name(row["stack"], row["kind"], row["layer"], several)
        texts.append({"x": LEFT - 6, "y": y + bar * 0.7, "body": name, "anchor": "end"})
        x = float(LEFT)
        for lab in shares:
            share = float(row[f"share_{lab}"])
            if share <= 0:
                continue
            tip = f"{name} {lab}: {share:.0%} of {int(row.get('n_heads', 0))} heads"
            bars.append({"x": x, "y": y, "width": share * width, "fill": colour(lab),
                         "tip": tip})
            x += share * width
    return _macro("layer_profile")({
        "width": LEFT + width + 160, "bar": bar - 3, "texts": texts, "bars": bars,
        "height": max(top + bar * len(profile) + 10, top + 16 * len(shares) + 10),
        "legend": _legend(shares, LEFT + width + 16, top)})


def mds_scatter(clusters: pd.DataFrame, classified: pd.DataFrame | None = None,
                size: int = 360) -> Any:
    """Heads at their MDS coordinates (``Census.clusters()``), coloured by label when known,
    else by cluster."""
    labels: dict[str, str] = {}
    if classified is not None and "label" in classified.columns:
        labels = dict(zip(classified["head_id"].astype(str), classified["label"].astype(str),
                          strict=True))
    xs, ys = clusters["x"].astype(float), clusters["y"].astype(float)
    low_x, low_y = float(xs.min()), float(ys.min())
    span = max(float(xs.max()) - low_x, float(ys.max()) - low_y, 1e-12)
    pad = 14
    scale = (size - 2 * pad) / span
    points = []
    for _, row in clusters.iterrows():
        hid = str(row["head_id"])
        label = labels.get(hid)
        fill = colour(label) if label else \
            CLUSTER_COLOURS[int(row["cluster"]) % len(CLUSTER_COLOURS)]
        points.append({"x": pad + (float(row["x"]) - low_x) * scale,
                       "y": size - pad - (float(row["y"]) - low_y) * scale, "fill": fill,
                       "tip": f"{hid} cluster {row['cluster']}" + (f": {label}" if label else "")})
    used = _in_order(labels.values())
    return _macro("mds")({"width": size + 160, "height": max(size, 16 * len(used) + 20),
                          "size": size, "points": points, "legend": _legend(used, size + 16, 10)})
