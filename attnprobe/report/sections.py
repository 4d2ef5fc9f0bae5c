"""The sections of a report: what each one shows, rendered from its template.

A :class:`Section` is an id (always a :func:`~attnprobe.report.text.slug`), a heading (plain
text, escaped by the page template) and a body (markup rendered by a template, never put
together from strings here).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.heads import labels as label_rules
from attnprobe.report import svg
from attnprobe.report.templating import render
from attnprobe.report.text import slug
from attnprobe.types import AttentionMap, ModelInfo

MAX_ROWS = 500  # rows shown of a table; the page says how many there were


@dataclass(frozen=True)
class Section:
    """One ``<section id="sec-<id>">`` of the page."""

    id: str
    heading: str
    body: Any  # markup from a template

    def __post_init__(self) -> None:
        if slug(self.id) != self.id:
            raise InputError(f"section id {self.id!r} is not a slug; pass it through slug()")


def _cell(value: object) -> str:
    """A table cell as text: floats to 4 significant digits, missing values empty."""
    if value is None or (not isinstance(value, str) and pd.api.types.is_scalar(value)
                         and pd.isna(value)):
        return ""
    if isinstance(value, float | np.floating):
        return f"{float(value):.4g}"
    return str(value)


def table(frame: pd.DataFrame, max_rows: int = MAX_ROWS) -> Any:
    """``frame`` as an HTML table (its first ``max_rows`` rows, and a note when cut)."""
    shown = frame.head(max_rows)
    rows = [[_cell(v) for v in values] for values in shown.itertuples(index=False, name=None)]
    return render("table.html.j2", columns=[str(c) for c in frame.columns], rows=rows,
                  total=len(frame))


def model_card(info: ModelInfo | None, maps: Sequence[AttentionMap]) -> Any:
    """The model's identity and the input sentences, one isolated element per token."""
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
    inputs = [(m.example_id or "", list(m.query_tokens)) for m in maps]
    return render("model_card.html.j2", items=[(k, str(v)) for k, v in items], inputs=inputs)


def attention_view() -> Any:
    """The frame that the attention view's script fills in."""
    return render("attention_view.html.j2")


def figure(svg_markup: Any) -> Any:
    return render("figure.html.j2", svg=svg_markup)


def census_tables(census: Any) -> tuple[pd.DataFrame, pd.DataFrame, pd.DataFrame | None]:
    """(classified, layer profile, clusters or None) from a Census or a classified frame."""
    if isinstance(census, pd.DataFrame):
        classified = census if "label" in census.columns else \
            label_rules.classify_scores(census)
        return classified, label_rules.layer_profile(classified), None
    classified = census.classify()
    clusters = None
    if getattr(census.part, "distances", None) is not None:
        clusters = census.clusters()
    return classified, label_rules.layer_profile(classified), clusters


def census_sections(census: Any) -> list[Section]:
    """Head grid with the label counts by family, layer profile and (when the census has
    distances) the head clusters."""
    classified, profile, clusters = census_tables(census)
    counts = table(label_rules.label_counts(classified))  # both bodies are escaped markup
    out = [Section("heads", "Head grid", figure(svg.head_grid(classified)) + counts),
           Section("profile", "Layer profile", figure(svg.layer_profile_chart(profile)))]
    if clusters is not None:
        out.append(Section("clusters", "Head clustering",
                           figure(svg.mds_scatter(clusters, classified))))
    return out
