"""Agreement of each attention view with each attribution method by layer, as SVG lines
(the twin of :func:`attnprobe.plot.agreement_by_layer`)."""

from __future__ import annotations

from typing import Any

import pandas as pd

from attnprobe.plot.attribution import METRIC_LABELS
from attnprobe.report.charts import line_chart, number
from attnprobe.report.figure_svg import svg_renderer

RANK = 50
RANK_METRICS = ("kendall_tau", "spearman")


@svg_renderer("agreement_by_layer")
def render(summary: pd.DataFrame) -> list[Any]:
    """A line chart per method: a line per view over the layers (mean over examples), for
    the rank metric the summary has (Kendall τ first); methods compared without a layer
    are dashed reference lines. None drawn when no attention view has a layer."""
    metrics = list(dict.fromkeys(summary["metric"].astype(str)))
    metric = next((m for m in (*RANK_METRICS, *metrics) if m in metrics), None)
    summary = summary[summary["metric"].astype(str) == metric]
    layered = summary["layer"].notna()
    if "source_kind" in summary.columns:
        layered &= summary["source_kind"].astype(str) == "attention"
    out = []
    for method in dict.fromkeys(summary.loc[layered, "method"].astype(str)):
        rows = summary[layered & (summary["method"].astype(str) == method)]
        series = []
        for view in dict.fromkeys(rows["view"].astype(str)):
            line = rows[rows["view"].astype(str) == view].sort_values("layer")
            series.append({"name": view, "points": [
                (int(r["layer"]), float(r["mean"]),
                 f"{view} L{int(r['layer'])} vs {method}: {metric} {number(r['mean'])}"
                 + (f" ± {number(r['std'])}" if "std" in r and pd.notna(r["std"]) else "")
                 + (f" over {int(r['n'])} example(s)" if "n" in r and pd.notna(r["n"]) else ""))
                for _, r in line.iterrows()]})
        flat = summary[~layered & (summary["method"].astype(str) == method)]
        refs = [(str(r.get("source", r["view"])), float(r["mean"])) for _, r in flat.iterrows()]
        out.append(line_chart(series, x_label="layer",
                              y_label=f"{METRIC_LABELS.get(metric, metric)} vs {method}",
                              references=refs, zero_line=metric in RANK_METRICS))
    return out
