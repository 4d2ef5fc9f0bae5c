"""Each head's mean direct part of a metric as an SVG layer × head heatmap (the twin of
:func:`attnprobe.plot.logit_attribution`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.heads.direct_logits import component_means
from attnprobe.report.charts import number
from attnprobe.report.figure_svg import svg_renderer
from attnprobe.report.result_figures import head_heatmap

RANK = 90


@svg_renderer("logit_attribution")
def render(table: pd.DataFrame) -> list[Any]:
    """The heads of a LogitAttribution's table (their mean part over the examples,
    :func:`~attnprobe.heads.direct_logits.component_means`); none without head rows."""
    components = component_means(table)
    heads = components[components["kind"] == "head"]
    if not len(heads):
        return []
    metric = ", ".join(dict.fromkeys(table["metric"].astype(str)))

    def tip(row: pd.Series) -> str:
        return (f"L{int(row['layer'])}H{int(row['head'])}: {number(row['value'])} of {metric} "
                "(mean per example)")
    return [head_heatmap(heads.astype({"layer": int, "head": int}), "value", tip,
                         caption=f"direct part of {metric}")]
