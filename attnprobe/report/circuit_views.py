"""Views of the weight- and logit-based head results: direct logit attribution, QK/OV
circuits and composition scores. The notebook views are registered in
:data:`attnprobe.core.html_view.RENDERERS` (like :mod:`attnprobe.report.notebook`); the
bodies (:func:`logit_attribution_body`, :func:`composition_body`) are also the report's
sections of the same names (:mod:`attnprobe.report.contents`); their figures are the SVG twins
of :func:`attnprobe.plot.logit_attribution` and :func:`attnprobe.plot.composition`
(:mod:`attnprobe.report.svg_figures`).

==========================  ==================================================================
kind                        view
==========================  ==================================================================
``logit_attribution``       each head's mean part of the metric (layer × head), the top heads,
                            the components and (notebook) the table, collapsed
``circuits``                copying score per head (layer × head), the table (collapsed)
``composition``             writer heads × reader heads per kind over the random baseline, the
                            strongest pairs, the pair table (collapsed)
==========================  ==================================================================
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.report import sections
from attnprobe.report.charts import number
from attnprobe.report.figure_svg import svg_figures
from attnprobe.report.notebook import fragment
from attnprobe.report.result_figures import head_heatmap
from attnprobe.report.templating import render

__all__ = ["TOP", "circuits_html", "composition_body", "composition_html",
           "logit_attribution_body", "logit_attribution_html", "strongest_pairs", "top_heads"]

TOP = 10  # rows of the top-heads and strongest-pairs tables


def collapsed(summary: str, frame: pd.DataFrame) -> Any:
    """``frame`` as a table folded under ``summary``."""
    return render("collapsed.html.j2", summary=summary, table=sections.table(frame))


# ----------------------------------------------------------------------------- DLA
def top_heads(result: Any, k: int = TOP) -> pd.DataFrame:
    """The ``k`` heads with the largest mean direct part ``|value|`` of a LogitAttribution:
    ``head_id, layer, head, value`` (the mean over examples of each head's part)."""
    means = result.by_component()
    heads = means[means["kind"] == "head"].astype({"layer": int, "head": int})
    order = heads["value"].abs().sort_values(ascending=False, kind="stable").index
    top = heads.loc[order[:k], ["layer", "head", "value"]].reset_index(drop=True)
    top.insert(0, "head_id", [f"L{la}H{h}" for la, h in zip(top["layer"], top["head"],
                                                              strict=True)])
    return top


def logit_attribution_body(result: Any, of: int | None = None) -> Any:
    """A LogitAttribution: its heads as a layer × head heatmap, the :func:`top_heads`, every
    component's mean (collapsed). ``of``: the corpus the examples were taken from (said)."""
    components = result.by_component()
    heads = components[components["kind"] == "head"]
    metric = ", ".join(dict.fromkeys(result.totals["metric"].astype(str)))
    figures = svg_figures("logit_attribution", result)
    n = len(result.totals)
    corpus = f" (the first {n} of {of})" if of is not None and of > n else ""
    note = " ".join([f"{n} example(s){corpus}; the components of each sum to the model's "
                     f"{metric} (largest gap {number(result.totals['gap'].abs().max())}).",
                     *result.totals.attrs.get("notes", [])])  # e.g. texts left out
    body = sections.result(note, figures, None)
    if len(heads):
        top = top_heads(result)
        body += sections.result(f"The {len(top)} heads with the largest |mean direct part|:",
                                [], top)
    return body + collapsed(f"mean per component ({len(components)} rows)", components)


@RENDERERS.register("logit_attribution")
def logit_attribution_html(result: Any) -> str:
    """A LogitAttribution: :func:`logit_attribution_body`, then its table (collapsed)."""
    return fragment(logit_attribution_body(result)
                    + collapsed(f"table ({len(result.table)} rows)", result.table))


# ----------------------------------------------------------------------------- circuits
@RENDERERS.register("circuits")
def circuits_html(result: Any) -> str:
    """A Circuits: the OV copying score per head, the per-head table."""
    table = result.table
    figures = []
    if "copying_score" in table.columns:
        def tip(row: pd.Series) -> str:
            return (f"L{int(row['layer'])}H{int(row['head'])}: copying score "
                    f"{number(row['copying_score'])}, |W_OV| {number(row['ov_norm'])}, "
                    f"|W_QK| {number(row['qk_norm'])}")
        figures.append(head_heatmap(table, "copying_score", tip,
                                    caption="OV copying score (Σλ / Σ|λ|)"))
    note = " ".join(["Weight-based circuits (norms folded).", *result.notes])
    return fragment(sections.result(note, figures, table, "per-head table"))


# ----------------------------------------------------------------------------- composition
def strongest_pairs(result: Any, k: int = TOP) -> pd.DataFrame:
    """The ``k`` (kind, writer, reader) pairs of a Composition that stand highest over their
    random baseline: ``kind, writer, reader, score, baseline, ratio`` (score / baseline)."""
    table = result.table
    frame = pd.DataFrame({
        "kind": table["kind"],
        "writer": "L" + table["writer_layer"].astype(str) + "H" + table["writer_head"].astype(str),
        "reader": "L" + table["reader_layer"].astype(str) + "H" + table["reader_head"].astype(str),
        "score": table["score"], "baseline": table["baseline"],
        "ratio": table["score"] / table["baseline"]})
    return frame.sort_values("ratio", ascending=False, kind="stable").head(k).reset_index(
        drop=True)


def composition_body(result: Any) -> Any:
    """A Composition: writer × reader over the random baseline per kind, the
    :func:`strongest_pairs`, the pair table (collapsed)."""
    figures = svg_figures("composition", result)
    bases = ", ".join(f"{kind} {number(result.baseline(kind))}" for kind in result.kinds)
    notes = [n if n.endswith(".") else n + "." for n in result.notes]
    note = " ".join([f"From the weights: each writer head (earlier layer) × reader head "
                     f"(later layer), its score over the mean score of random matrices of the "
                     f"same shapes ({result.n_draws}² pairs; baselines {bases}); log2 of the "
                     "ratio: 0 = as random, 1 = twice.", *notes])
    pairs = strongest_pairs(result)
    return (sections.result(note, figures, None)
            + sections.result(f"The {len(pairs)} strongest pairs (ratio = score / baseline):",
                              [], pairs)
            + collapsed(f"pair table ({len(result.table)} rows)", result.table))


@RENDERERS.register("composition")
def composition_html(result: Any) -> str:
    """A Composition: :func:`composition_body`."""
    return fragment(composition_body(result))
