"""The notebook view of a :class:`~attnprobe.faithfulness.result.Faithfulness`, registered as
``faithfulness`` in :data:`attnprobe.core.html_view.RENDERERS` (imported by
:mod:`attnprobe.report.views`), and the body of the report's faithfulness section.

The view: what was measured (texts, removal, target), the ranked summary with 95 %
confidence intervals, the mean deletion curves with their bands and the ranking as dots
with whiskers (the SVG twin of :func:`attnprobe.plot.faithfulness`), and the per-example
table collapsed.
"""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.core.html_view import RENDERERS
from attnprobe.faithfulness.result import SUMMARY_METRICS
from attnprobe.report import sections
from attnprobe.report.charts import number
from attnprobe.report.figure_svg import svg_figures
from attnprobe.report.notebook import fragment

__all__ = ["faithfulness_body", "faithfulness_html", "ranked_summary"]

FIRST_COLUMNS = ("rank", "source", "source_kind", "n")


def ranked_summary(result: Any) -> pd.DataFrame:
    """``result.summary()`` as the page shows it, ranked by AOPC comprehensiveness (best
    first): rank, source, kind and examples, then per metric one cell ``mean [low, high]``
    (4 significant digits), then the sanity check's columns when it ran."""
    summary = result.summary()
    shown = summary[[c for c in FIRST_COLUMNS if c in summary.columns]].copy()
    for metric in SUMMARY_METRICS:
        shown[f"{metric} (95 % CI)"] = [
            f"{number(m)} [{number(lo)}, {number(hi)}]" for m, lo, hi in zip(
                summary[metric], summary[f"{metric}_low"], summary[f"{metric}_high"],
                strict=True)]
    for column in ("sanity_spearman", "sanity_flag"):
        if column in summary.columns:
            shown[column] = summary[column]
    return shown


def _note(result: Any) -> str:
    table = result.table
    n = table["example_id"].nunique()
    removal = ", ".join(map(str, table["removal"].dropna().unique()))
    targets = ", ".join(map(str, table["target"].dropna().unique())) \
        if "target" in table.columns else ""
    failed = int(table["value"].isna().sum())
    note = (f"{n} text(s), removal {removal}" + (f", target {targets}" if targets else "")
            + "; per source, the mean over examples with its 95 % bootstrap interval, "
              "ranked by AOPC comprehensiveness (higher comprehensiveness, ABPC and τ with "
              "leave-one-out, lower sufficiency: more faithful); random: the random-order "
              "baseline.")
    if failed:
        note += f" {failed} row(s) without a value (their note says why) are left out."
    if getattr(result, "skipped", ()):
        note += f" {len(result.skipped)} text(s) skipped as too long."
    return note


def faithfulness_body(result: Any) -> Any:
    """The note, the ranked summary, the two figures and the per-example rows (collapsed)."""
    figures = svg_figures("faithfulness", result)
    return (sections.result(_note(result), [], ranked_summary(result))
            + sections.result("", figures, result.table, "per-example rows"))


@RENDERERS.register("faithfulness")
def faithfulness_html(result: Any) -> str:
    """A Faithfulness result: :func:`faithfulness_body` as a self-contained fragment."""
    return fragment(faithfulness_body(result))
