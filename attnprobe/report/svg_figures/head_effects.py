"""Effect per head of a perturbation run as SVG heatmaps (the twin of
:func:`attnprobe.plot.head_effects`)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd

from attnprobe.plot.perturbation import PREFERRED_METRICS
from attnprobe.report.charts import heatmap, number
from attnprobe.report.figure_svg import svg_renderer
from attnprobe.report.result_figures import head_heatmap

RANK = 60


def _scope_effects(table: pd.DataFrame, name: str) -> Any:
    """Scope × metric heatmap of the mean change (runs without one head per row)."""
    means = table.groupby(["scope", "metric"], sort=False)["change"].agg(["mean", "count"])
    scopes = list(dict.fromkeys(table["scope"].astype(str)))
    metrics = list(dict.fromkeys(table["metric"].astype(str)))
    values = np.full((len(scopes), len(metrics)), np.nan)
    tips = [["" for _ in metrics] for _ in scopes]
    for (scope, metric), row in means.iterrows():
        r, c = scopes.index(str(scope)), metrics.index(str(metric))
        values[r, c] = float(row["mean"])
        tips[r][c] = (f"{name} on {scope}: {metric} mean change {number(row['mean'])} over "
                      f"{int(row['count'])} row(s)")
    return heatmap(values, scopes, metrics, tips, caption="mean change (perturbed - baseline)",
                   rotate_columns=True)


def _head_figures(heads: pd.DataFrame, name: str) -> list[Any]:
    """A layer × head heatmap of the mean change per metric (``PREFERRED_METRICS`` first)."""
    out = []
    present = list(dict.fromkeys(heads["metric"].astype(str)))
    for metric in sorted(present, key=lambda m: (m not in PREFERRED_METRICS,
                                                 present.index(m))):
        rows = heads[heads["metric"].astype(str) == metric]
        n = rows["example_id"].nunique() if "example_id" in rows.columns else len(rows)
        means = rows.groupby(["layer", "head"], as_index=False).agg(
            change=("change", "mean"), baseline=("baseline", "mean"),
            perturbed=("perturbed", "mean"))

        def tip(row: pd.Series, metric: str = metric, n: int = n) -> str:
            return (f"L{int(row['layer'])}H{int(row['head'])} {name}: {metric} change "
                    f"{number(row['change'])} (baseline {number(row['baseline'])}, "
                    f"perturbed {number(row['perturbed'])}), mean of {n} example(s)")
        out.append(head_heatmap(means, "change", tip, caption=f"{name}: mean {metric} change"))
    return out


@svg_renderer("head_effects")
def render(table: pd.DataFrame) -> list[Any]:
    """Per experiment, a layer × head heatmap of the mean ``change`` per metric; an
    experiment without single-head rows gets a scope × metric heatmap. Rows with a ``step``
    are left out (their steps are not comparable)."""
    if not {"metric", "change", "scope"} <= set(table.columns) or table.empty:
        return []
    if "step" in table.columns and table["step"].notna().any():
        table = table[table["step"].isna()]
    out = []
    experiments = table["experiment"].astype(str) if "experiment" in table.columns else \
        pd.Series("", index=table.index)
    for name in dict.fromkeys(experiments):
        part = table[experiments == name]
        one = part["layer"].notna() & part["head"].notna()
        if not one.any():
            out.append(_scope_effects(part, name))
        else:
            out += _head_figures(part[one].astype({"layer": int, "head": int}), name)
    return out
