"""Inline SVG figures (no matplotlib): head grid, layer profile, head MDS scatter.

The SVG is inline HTML5, so it needs (and has) no xmlns URL.

Every piece of text is XML-escaped; the figures carry no external references.
"""

from __future__ import annotations

import math
from html import escape

import pandas as pd

from attnprobe.heads.labels import PRECEDENCE

# One fixed colour per label, in PRECEDENCE order (colour-blind friendly first).
_COLOURS = ("#4e79a7", "#f28e2b", "#e15759", "#76b7b2", "#59a14f", "#edc948", "#b07aa1",
            "#ff9da7", "#9c755f", "#bab0ac", "#86bcb6", "#d37295", "#555555")
PALETTE: dict[str, str] = dict(zip(PRECEDENCE, _COLOURS, strict=True))
UNKNOWN_COLOUR = "#dddddd"
# Scores shown in a head's tooltip when present.
KEY_SCORES = ("entropy_norm", "max_weight", "prev", "self", "next", "first", "special",
              "distance", "pos_score", "syntax_accuracy", "rep_induction")


def colour(label: str) -> str:
    return PALETTE.get(str(label), UNKNOWN_COLOUR)


def _fmt(value: object) -> str:
    if isinstance(value, float):
        return "nan" if math.isnan(value) else f"{value:.3g}"
    return str(value)


def _text(x: float, y: float, body: str, extra: str = "") -> str:
    return f'<text x="{x:.1f}" y="{y:.1f}"{extra}>{escape(body)}</text>'


def head_tooltip(row: pd.Series) -> str:
    """Plain-text tooltip of one classified head (escaped by the caller)."""
    lines = [f"{row.get('head_id', '')}: {row.get('label', '')}"]
    if isinstance(row.get("evidence"), str) and row["evidence"]:
        lines.append(row["evidence"])
    if isinstance(row.get("also"), str) and row["also"]:
        lines.append(f"also: {row['also']}")
    scores = [f"{k}={_fmt(row[k])}" for k in KEY_SCORES
              if k in row.index and not pd.isna(row[k])]
    if scores:
        lines.append(", ".join(scores))
    return "\n".join(lines)


def legend(labels: list[str], x: float, y: float) -> str:
    parts = []
    for i, label in enumerate(labels):
        yy = y + i * 16
        parts.append(f'<rect x="{x:.1f}" y="{yy:.1f}" width="12" height="12" '
                     f'fill="{colour(label)}"/>')
        parts.append(_text(x + 16, yy + 10, label, ' font-size="11"'))
    return "".join(parts)


def head_grid(classified: pd.DataFrame, cell: int = 22) -> str:
    """Layer × head grid, each cell coloured by label with a ``<title>`` tooltip.

    One grid row per (stack, kind, layer); ``classified`` is ``Census.classify()`` output.
    """
    frame = classified.sort_values(["stack", "kind", "layer", "head"])
    rows = list(dict.fromkeys(zip(frame["stack"], frame["kind"], frame["layer"], strict=True)))
    heads = sorted(set(int(h) for h in frame["head"]))
    col = {h: i for i, h in enumerate(heads)}
    row_of = {r: i for i, r in enumerate(rows)}
    left, top = 90, 20
    labels = [lab for lab in PRECEDENCE if lab in set(frame["label"])]
    width = left + cell * len(heads) + 150
    height = max(top + cell * len(rows) + 10, top + 16 * len(labels) + 10)
    out = [f'<svg class="head-grid" width="{width}" '
           f'height="{height}" role="img" aria-label="head grid">']
    for h in heads:
        out.append(_text(left + col[h] * cell + cell / 2, top - 6, f"H{h}",
                         ' font-size="10" text-anchor="middle"'))
    for r, (stack, kind, layer) in enumerate(rows):
        name = f"L{layer}" if len(set((s, k) for s, k, _ in rows)) == 1 else \
            f"{stack} {kind} L{layer}"
        out.append(_text(left - 6, top + r * cell + cell * 0.7, name,
                         ' font-size="10" text-anchor="end"'))
    for _, row in frame.iterrows():
        r = row_of[(row["stack"], row["kind"], row["layer"])]
        x, y = left + col[int(row["head"])] * cell, top + r * cell
        out.append(f'<g class="head-cell" data-head="{escape(str(row.get("head_id", "")))}">'
                   f'<rect x="{x}" y="{y}" width="{cell - 2}" height="{cell - 2}" '
                   f'fill="{colour(row["label"])}"><title>{escape(head_tooltip(row))}</title>'
                   f"</rect></g>")
    out.append(legend(labels, left + cell * len(heads) + 16, top))
    out.append("</svg>")
    return "".join(out)


def layer_profile_chart(profile: pd.DataFrame, bar: int = 18, width: int = 360) -> str:
    """Horizontal stacked bars: share of each label per layer (``layer_profile()`` output)."""
    shares = [lab for lab in PRECEDENCE if f"share_{lab}" in profile.columns
              and float(profile[f"share_{lab}"].sum()) > 0]
    left, top = 90, 10
    height = max(top + bar * len(profile) + 10, top + 16 * len(shares) + 10)
    out = [f'<svg class="layer-profile" '
           f'width="{left + width + 160}" height="{height}" role="img" '
           f'aria-label="layer profile">']
    for i, (_, row) in enumerate(profile.iterrows()):
        y = top + i * bar
        name = f"L{row['layer']}"
        if profile[["stack", "kind"]].drop_duplicates().shape[0] > 1:
            name = f"{row['stack']} {row['kind']} L{row['layer']}"
        out.append(_text(left - 6, y + bar * 0.7, name, ' font-size="10" text-anchor="end"'))
        x = float(left)
        for lab in shares:
            share = float(row[f"share_{lab}"])
            if share <= 0:
                continue
            w = share * width
            tip = f"{name} {lab}: {share:.0%} of {int(row.get('n_heads', 0))} heads"
            out.append(f'<rect x="{x:.1f}" y="{y}" width="{w:.1f}" height="{bar - 3}" '
                       f'fill="{colour(lab)}"><title>{escape(tip)}</title></rect>')
            x += w
    out.append(legend(shares, left + width + 16, top))
    out.append("</svg>")
    return "".join(out)


def mds_scatter(clusters: pd.DataFrame, classified: pd.DataFrame | None = None,
                size: int = 360) -> str:
    """Heads at their MDS coordinates (``Census.clusters()``), coloured by label when known,
    else by cluster."""
    frame = clusters.copy()
    labels: dict[str, str] = {}
    if classified is not None and "label" in classified.columns:
        labels = dict(zip(classified["head_id"].astype(str), classified["label"].astype(str),
                          strict=True))
    xs, ys = frame["x"].astype(float), frame["y"].astype(float)
    span = max(float(xs.max() - xs.min()), float(ys.max() - ys.min()), 1e-12)
    pad = 14

    def sx(v: float) -> float:
        return pad + (v - float(xs.min())) / span * (size - 2 * pad)

    def sy(v: float) -> float:
        return size - pad - (v - float(ys.min())) / span * (size - 2 * pad)

    used = [lab for lab in PRECEDENCE if lab in set(labels.values())]
    out = [f'<svg class="mds" width="{size + 160}" '
           f'height="{max(size, 16 * len(used) + 20)}" role="img" aria-label="head clusters">',
           f'<rect x="0" y="0" width="{size}" height="{size}" fill="none" stroke="#ccc"/>']
    cluster_colours = _COLOURS
    for _, row in frame.iterrows():
        hid = str(row["head_id"])
        label = labels.get(hid)
        fill = colour(label) if label else cluster_colours[int(row["cluster"]) % len(_COLOURS)]
        tip = f"{hid} cluster {row['cluster']}" + (f": {label}" if label else "")
        out.append(f'<circle cx="{sx(float(row["x"])):.1f}" cy="{sy(float(row["y"])):.1f}" '
                   f'r="5" fill="{fill}" fill-opacity="0.8"><title>{escape(tip)}</title>'
                   f"</circle>")
    out.append(legend(used, size + 16, 10))
    out.append("</svg>")
    return "".join(out)
