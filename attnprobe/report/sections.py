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
from attnprobe.report import result_figures, svg
from attnprobe.report.figure_svg import svg_of
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
    inputs = [(m.example_id or "", list(m.readable_tokens())) for m in maps]
    return render("model_card.html.j2", items=[(k, str(v)) for k, v in items], inputs=inputs)


def head_details(classified: pd.DataFrame | None) -> list[dict[str, Any]]:
    """One panel per classified head: ``stack, kind, layer, head, head_id, label, family,
    evidence, also`` and ``scores`` (the :data:`~attnprobe.report.svg.KEY_SCORES` it has,
    as ``(name, text)``)."""
    if classified is None or "label" not in classified.columns:
        return []
    out = []
    for _, row in classified.iterrows():
        text = {k: row.get(k) for k in ("family", "evidence", "also")}
        out.append({
            "stack": str(row.get("stack", "")), "kind": str(row.get("kind", "self")),
            "layer": int(row["layer"]), "head": int(row["head"]),
            "head_id": str(row.get("head_id", f"L{int(row['layer'])}H{int(row['head'])}")),
            "label": str(row["label"]),
            **{k: v if isinstance(v, str) else "" for k, v in text.items()},
            "scores": [(k, _cell(float(row[k]))) for k in svg.KEY_SCORES
                       if k in row.index and pd.notna(row[k])]})
    return out


def attention_view(details: Sequence[dict[str, Any]] = (), *, root_id: str = "ap-view",
                   maps_id: str = "ap-maps") -> Any:
    """The frame the attention views' script fills in: head view, model view and the
    ``details`` head panels (:func:`head_details`); ``root_id`` / ``maps_id`` are the ids of
    the frame and of the maps' JSON element (unique per page)."""
    return render("attention_view.html.j2", details=list(details), root_id=root_id,
                  maps_id=maps_id)


def result(note: str, figures: Sequence[Any], frame: pd.DataFrame | None,
           summary: str = "table") -> Any:
    """A result section: ``note`` (the corpus behind it), ``figures`` and ``frame``, which
    is collapsed under the figures when there are any."""
    shown = table(frame) if frame is not None and not frame.empty else None
    return render("result.html.j2", note=note, figures=list(figures), table=shown,
                  summary=f"{summary} ({len(frame)} rows)" if frame is not None else summary)


def syntax_rows(frame: pd.DataFrame, min_count: int) -> tuple[pd.DataFrame, int]:
    """The syntax rows with ``count >= min_count`` (``all`` always kept), and how many
    relations were left out."""
    if "count" not in frame.columns:
        return frame, 0
    count = pd.to_numeric(frame["count"], errors="coerce").fillna(0)
    keep = (count >= min_count)
    if "relation" in frame.columns:
        keep |= frame["relation"].astype(str) == "all"
    return frame[keep].reset_index(drop=True), int((~keep).sum())


def n_examples(frame: pd.DataFrame) -> int | None:
    """How many distinct examples a tidy result table covers (``example_id``; the pooled
    ``all`` rows of corpus-level experiments are not an example), else None."""
    if "example_id" not in frame.columns:
        return None
    ids = frame["example_id"].dropna().astype(str)
    ids = ids[ids != "all"].str.replace(r":step\d+$", "", regex=True)
    return int(ids.nunique()) or None


def comparison_section(comparison: Any, frame: pd.DataFrame, n_census: int | None) -> Any:
    """Attention vs attributions: agreement by layer and the token heat, over the sentences
    it was computed on (said, against the census' count when there is one)."""
    table_frame = getattr(comparison, "table", frame)
    n = n_examples(table_frame) if isinstance(table_frame, pd.DataFrame) else None
    if n is None and "n" in frame.columns and frame["n"].notna().any():
        n = int(frame["n"].max())
    note = f"Computed on {n} sentence(s)" if n else "Computed on the given sentences"
    if n and n_census and n_census != n:
        note += f" (the attention view's), of the {n_census} the labels come from"
    figures = [*(result_figures.agreement_figures(comparison) or []),
               *result_figures.token_heat_figures(comparison)]
    return result(note + ".", figures, frame, "agreement table")


def perturbation_section(frame: pd.DataFrame) -> Any:
    """The effect per head (or per scope) of a perturbation run, over its examples."""
    n = n_examples(frame)
    note = f"Computed on {n} sentence(s)." if n else "Computed on the whole corpus."
    return result(note, result_figures.effect_figures(frame) or [], frame, "run table")


def diff_section(diff: Any) -> Any:
    """A checkpoint diff: per-head figures, the layer summary and the head table collapsed."""
    layers = diff.layers()
    note = (f"Both models on the same {diff.n_sentences} sentence(s); "
            f"{int(layers['label_changed'].sum()) if 'label_changed' in layers else 0} "
            f"of {int(layers['n_heads'].sum())} head labels changed.")
    return result(note, result_figures.diff_figures(diff), diff.heads(), "per-head table") \
        + table(layers)


def figure(svg_markup: Any) -> Any:
    return render("figure.html.j2", svg=svg_markup)


def census_tables(census: Any, classified: pd.DataFrame | None = None
                  ) -> tuple[pd.DataFrame, pd.DataFrame | None]:
    """(classified, clusters or None) from a Census or a classified frame."""
    if isinstance(census, pd.DataFrame):
        classified = census if "label" in census.columns else \
            label_rules.classify_scores(census)
        return classified, None
    if classified is None:
        classified = census.classify()
    clusters = None
    if getattr(census.sums, "distances", None) is not None:
        try:
            clusters = census.clusters()
        except InputError:  # fewer heads than the default number of clusters
            clusters = census.clusters(len(classified))
    return classified, clusters


def census_sections(census: Any, classified: pd.DataFrame | None = None) -> list[Section]:
    """Head grid with the label counts by family (and the number of sentences behind the
    labels when ``census`` is a Census), layer profile and (when the census has distances)
    the head clusters. ``classified``: ``census.classify()`` when already computed."""
    classified, clusters = census_tables(census, classified)
    counts = table(label_rules.label_counts(classified))  # both bodies are escaped markup
    n = getattr(census, "n_sentences", None)
    note = result(f"Labels from {n} sentence(s).", [], None) if n is not None else None
    grid = figure(*svg_of("head_grid")(classified)) + counts
    out = [Section("heads", "Head grid", note + grid if note is not None else grid),
           Section("profile", "Layer profile", figure(*svg_of("layer_profile")(classified)))]
    if clusters is not None:
        out.append(Section("clusters", "Head clustering",
                           figure(svg.mds_scatter(clusters, classified))))
    return out
