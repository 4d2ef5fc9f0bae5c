"""Views of the weight- and logit-based head results: direct logit attribution, QK/OV
circuits and composition scores. The notebook views are registered in
:data:`attnprobe.core.html_view.RENDERERS` (like :mod:`attnprobe.report.notebook`); the
bodies (:func:`logit_attribution_body`, :func:`composition_body`) are also the report's
sections of the same names (:mod:`attnprobe.report.contents`).

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

import numpy as np
import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.report import sections
from attnprobe.report.charts import heatmap, number
from attnprobe.report.notebook import fragment
from attnprobe.report.result_figures import head_heatmap
from attnprobe.report.templating import render

__all__ = ["MATRIX_HEADS", "TOP", "circuits_html", "composition_body", "composition_html",
           "logit_attribution_body", "logit_attribution_html", "strongest_pairs", "top_heads"]

TOP = 10  # rows of the top-heads and strongest-pairs tables
MATRIX_HEADS = 48  # writers (and readers) drawn per composition matrix; the strongest kept


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

    def tip(row: pd.Series) -> str:
        return (f"L{int(row['layer'])}H{int(row['head'])}: {number(row['value'])} of {metric} "
                "(mean per example)")
    figures = [head_heatmap(heads.astype({"layer": int, "head": int}), "value", tip,
                            caption=f"direct part of {metric}")] if len(heads) else []
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


def _strongest(matrix: pd.DataFrame, limit: int) -> pd.DataFrame:
    """``matrix`` cut to the ``limit`` rows and columns with the largest values (model order
    kept), when it is larger."""
    if matrix.shape[0] > limit:
        keep = set(matrix.max(axis=1).sort_values(ascending=False).index[:limit])
        matrix = matrix.loc[[w for w in matrix.index if w in keep]]
    if matrix.shape[1] > limit:
        keep = set(matrix.max(axis=0).sort_values(ascending=False).index[:limit])
        matrix = matrix[[r for r in matrix.columns if r in keep]]
    return matrix


def _matrix_figure(result: Any, kind: str) -> Any:
    """Writer × reader ``log2(score / baseline)`` of one kind (0: as random matrices)."""
    whole = result.matrix(kind, "ratio")
    matrix = _strongest(whole, MATRIX_HEADS)
    ratio = matrix.to_numpy(dtype=float)
    score = result.matrix(kind).loc[matrix.index, matrix.columns].to_numpy(dtype=float)
    base = result.baseline(kind)
    with np.errstate(divide="ignore", invalid="ignore"):
        values = np.log2(ratio)
    tips = [[f"{w} → {r}: {kind}-composition {number(score[i, j])} "
             f"({number(ratio[i, j])} × baseline {number(base)})"
             for j, r in enumerate(matrix.columns)] for i, w in enumerate(matrix.index)]
    cut = "" if matrix.shape == whole.shape else \
        f"; the {matrix.shape[0]} writers × {matrix.shape[1]} readers of the strongest pairs"
    return heatmap(values, list(matrix.index), list(matrix.columns), tips,
                   caption=f"{kind}-composition: log2(score / baseline {number(base)}){cut}",
                   rotate_columns=True)


def composition_body(result: Any) -> Any:
    """A Composition: writer × reader over the random baseline per kind, the
    :func:`strongest_pairs`, the pair table (collapsed)."""
    figures = [_matrix_figure(result, kind) for kind in result.kinds]
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
