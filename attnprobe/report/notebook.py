"""Notebook views: the HTML that ``_repr_html_`` of attnprobe's results returns.

Each renderer here is registered in :data:`attnprobe.core.html_view.RENDERERS` (the seam that
lets classes on lower floors delegate to this module without importing it). Every fragment:

- is self-contained: its CSS (``static/views.css``, scoped to our classes), data and script
  inline, no URL to anything;
- is rendered by the report's templates, so every token, label and cell is escaped and has
  its bidirectional controls shown, exactly as in a report page;
- works next to other fragments on one page: its ids carry a random ``uid``, and the script
  defines the views once per page (``window.attnprobeViews``) and mounts each view once.

==================  ======================================================================
kind                view
==================  ======================================================================
``attention_map``   head view (head selector, hover) and model view (all layers × heads as
                    thumbnails; a click opens one)
``census``          head grid coloured by label, label counts, the label table (collapsed)
``comparison``      agreement by layer, token heat, the summary table (collapsed)
``perturbation``    effect per head heatmap, the run table (collapsed)
``diff``            change per head, the layer summary, the head table (collapsed)
``report``          the whole page in a sandboxed ``<iframe srcdoc>``
==================  ======================================================================
"""

from __future__ import annotations

import uuid
from typing import Any

import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.heads import labels as label_rules
from attnprobe.report import data, sections, svg
from attnprobe.report.templating import asset, markup, render

__all__ = ["attention_map_html", "census_html", "comparison_html", "diff_html",
           "fragment", "perturbation_html", "report_html"]

LABEL_COLUMNS = ("head_id", "label", "family", "evidence", "also")
REPORT_HEIGHT = 640  # px of the report's frame in a notebook


def new_uid() -> str:
    """A fresh id prefix: unique among the outputs of one page."""
    return "ap" + uuid.uuid4().hex[:12]


def fragment(body: Any, *, heading: str = "", uid: str | None = None,
             maps: list[Any] | None = None) -> str:
    """``body`` (markup) as a self-contained output; with ``maps`` (packed AttentionMaps)
    also their JSON (``id="<uid>-maps"``) and the views' script."""
    uid = uid or new_uid()
    return str(render("fragment.html.j2", uid=uid, css=asset("views.css"), heading=heading,
                      body=body, js=asset("attention_view.js") if maps else "",
                      maps_json=markup(data.escape_json(maps)) if maps else ""))


@RENDERERS.register("attention_map")
def attention_map_html(amap: Any) -> str:
    """One AttentionMap: head view and model view (``[layer, head, query, key]`` weights
    travel as uint8, within 1/510)."""
    uid = new_uid()
    n_layers, n_heads, n_query, n_key = amap.shape
    heading = (f"{amap.example_id or 'attention map'}: {n_query} × {n_key} tokens, "
               f"{n_layers} layer(s) × {n_heads} head(s), {amap.info.name}")
    view = sections.attention_view(root_id=f"{uid}-view", maps_id=f"{uid}-maps")
    return fragment(view, heading=heading, uid=uid, maps=[data.pack_map(amap)])


@RENDERERS.register("census")
def census_html(census: Any) -> str:
    """A Census: head grid coloured by label with the label counts, and the label of every
    head (collapsed), over ``n_sentences``."""
    classified = census.classify()
    labels = classified[[c for c in LABEL_COLUMNS if c in classified.columns]]
    body = sections.result(f"Labels from {census.n_sentences} sentence(s).",
                           [svg.head_grid(classified)], labels, "label of every head")
    return fragment(body + sections.table(label_rules.label_counts(classified)))


@RENDERERS.register("comparison")
def comparison_html(comparison: Any) -> str:
    """A Comparison: agreement by layer and token heat, the summary table collapsed."""
    return fragment(sections.comparison_section(comparison, comparison.summary(), None))


@RENDERERS.register("perturbation")
def perturbation_html(table: pd.DataFrame) -> str:
    """A ``perturb.run`` table: the effect per head (or scope), the table collapsed."""
    return fragment(sections.perturbation_section(pd.DataFrame(table)))


@RENDERERS.register("diff")
def diff_html(diff: Any) -> str:
    """A checkpoint Diff: change per head, the layer summary, the head table collapsed."""
    return fragment(sections.diff_section(diff))


@RENDERERS.register("report")
def report_html(report: Any) -> str:
    """A whole Report inside a sandboxed frame (its own styles and script stay inside)."""
    return str(render("iframe.html.j2", title=report.title, page=report.html,
                      height=REPORT_HEIGHT))

