"""Build one self-contained HTML report: all CSS/JS inlined, no URL to any other host.

Sections appear only when their data is given: model card (from ``maps[0].info`` or ``info``),
head grid / layer profile / head clusters (``census``), interactive attention view (``maps``),
syntax table, attribution comparison and perturbation results. Every token and table cell is
HTML-escaped; the maps are embedded as escaped JSON (see :mod:`attnprobe.report.data`).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from html import escape
from pathlib import Path
from typing import Any

import pandas as pd

from attnprobe.errors import InputError
from attnprobe.report import assets, data, svg
from attnprobe.types import AttentionMap, ModelInfo

MAPS_ID = "ap-maps"


@dataclass(frozen=True)
class Report:
    """A rendered report."""

    html: str
    title: str = "attnprobe report"

    @property
    def size_bytes(self) -> int:
        return len(self.html.encode("utf-8"))

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.html, encoding="utf-8")
        return path


def table_html(frame: pd.DataFrame, max_rows: int = 500) -> str:
    """An escaped HTML table (floats to 4 significant digits)."""
    shown = frame.head(max_rows)
    out = shown.to_html(index=False, escape=True, border=0, classes="ap-table",
                        float_format=lambda v: f"{v:.4g}", na_rep="")
    if len(frame) > max_rows:
        out += f"<p>first {max_rows} of {len(frame)} rows</p>"
    return out


def _section(key: str, heading: str, body: str) -> str:
    return f'<section id="sec-{key}"><h2>{escape(heading)}</h2>{body}</section>'


def _model_card(info: ModelInfo | None, maps: Sequence[AttentionMap]) -> str:
    items: list[tuple[str, str]] = []
    if info is not None:
        causal = {True: "causal", False: "bidirectional", None: "unknown"}[info.causal]
        items += [("name", info.name), ("architecture", info.arch),
                  ("layers × heads", f"{info.n_layers} × {info.n_heads}"),
                  ("attention", causal), ("attention implementation", info.attn_implementation),
                  ("dtype", info.dtype),
                  ("versions", ", ".join(f"{k} {v}" for k, v in sorted(info.versions.items())))]
    if maps:
        items.append(("inputs", f"{len(maps)} sentence(s)"))
    body = "<dl class=\"card\">" + "".join(
        f"<dt>{escape(k)}</dt><dd>{escape(str(v))}</dd>" for k, v in items) + "</dl>"
    if maps:
        body += "<ol class=\"inputs\">" + "".join(
            f"<li>{escape(m.example_id + ': ' if m.example_id else '')}"
            f"{escape(' '.join(m.query_tokens))} <small>({len(m.query_tokens)} tokens)</small>"
            "</li>" for m in maps) + "</ol>"
    return body


def _attention_view() -> str:
    return ('<div id="ap-view"><div class="controls">'
            '<label>sentence <select class="sel-sentence"></select></label>'
            '<label>layer <select class="sel-layer"></select></label>'
            '<label>head <select class="sel-head"></select></label></div>'
            '<p><small>Hover a token on the left to see where it attends (its row), on the '
            'right to see what attends to it (its column).</small></p>'
            '<div class="cols"><div class="left"></div><svg class="lines" width="220" '
            'height="0"></svg><div class="right"></div></div></div>')


def _census_tables(census: Any) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(classified, layer profile, clusters or None) from a Census or a classified frame."""
    from attnprobe.heads import labels

    if isinstance(census, pd.DataFrame):
        classified = census if "label" in census.columns else labels.classify_scores(census)
        return classified, labels.layer_profile(classified), None
    classified = census.classify()
    clusters = None
    if getattr(census.part, "distances", None) is not None:
        clusters = census.clusters()
    return classified, labels.layer_profile(classified), clusters


def _frame(value: Any, what: str) -> pd.DataFrame:
    if isinstance(value, pd.DataFrame):
        return value
    if hasattr(value, "summary"):
        return value.summary()
    raise InputError(f"{what} must be a DataFrame; got {type(value).__name__}")


def build(*, maps: Sequence[AttentionMap] | AttentionMap | None = None, census: Any = None,
          syntax: pd.DataFrame | None = None, comparison: Any = None,
          perturbation: pd.DataFrame | None = None, title: str = "attnprobe report",
          info: ModelInfo | None = None,
          tables: Sequence[tuple[str, str, pd.DataFrame]] = ()) -> Report:
    """Render the report.

    Args:
        maps: attention maps for the interactive view (one per sentence).
        census: a ``Census`` (classify / layer profile / clusters when distances exist) or a
            classified (or score) DataFrame.
        syntax: ``Census.syntax()``-shaped table.
        comparison: an attribution ``Comparison`` or its summary DataFrame.
        perturbation: a perturbation ``run()`` DataFrame.
        info: model info for the card when there are no maps (else ``maps[0].info``).
        tables: more sections, ``(key, heading, table)`` each (id ``sec-<key>``); empty or
            missing tables are left out.

    Returns:
        :class:`Report` with the HTML text.
    """
    if isinstance(maps, AttentionMap):
        maps = [maps]
    maps = list(maps or [])
    if not all(isinstance(m, AttentionMap) for m in maps):
        raise InputError("maps must be AttentionMap objects")
    if info is None and maps:
        info = maps[0].info
    if info is None and not maps and census is None and syntax is None and comparison is None \
            and perturbation is None and not tables:
        raise InputError("nothing to report: pass maps, census, syntax, comparison or "
                         "perturbation")
    sections = [_section("model", "Model", _model_card(info, maps))]
    if census is not None:
        classified, profile, clusters = _census_tables(census)
        sections.append(_section("heads", "Head grid", '<div class="figure">'
                                 + svg.head_grid(classified) + "</div>"))
        sections.append(_section("profile", "Layer profile", '<div class="figure">'
                                 + svg.layer_profile_chart(profile) + "</div>"))
        if clusters is not None:
            sections.append(_section("clusters", "Head clustering", '<div class="figure">'
                                     + svg.mds_scatter(clusters, classified) + "</div>"))
    if maps:
        sections.append(_section("attention", "Attention view", _attention_view()))
    if syntax is not None:
        sections.append(_section("syntax", "Syntax", table_html(_frame(syntax, "syntax"))))
    if comparison is not None:
        sections.append(_section("comparison", "Attribution comparison",
                                 table_html(_frame(comparison, "comparison"))))
    if perturbation is not None:
        sections.append(_section("perturbation", "Perturbation",
                                 table_html(_frame(perturbation, "perturbation"))))
    for key, heading, frame in tables:
        if frame is not None and not frame.empty:
            sections.append(_section(key, heading, table_html(frame)))
    scripts = ""
    if maps:
        scripts = data.script_json(data.pack_maps(maps), MAPS_ID) + f"<script>{assets.JS}</script>"
    html = ("<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\">"
            f"<title>{escape(title)}</title><style>{assets.CSS}</style></head><body>"
            f"<h1>{escape(title)}</h1>" + "".join(sections) + scripts + "</body></html>")
    return Report(html=html, title=title)
