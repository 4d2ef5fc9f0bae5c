"""The report's figures of attribution, perturbation and checkpoint-diff results (inline SVG).

They show what :mod:`attnprobe.plot` draws from the same tidy tables (agreement by layer,
token heat, effect per head, diff per head), as vector SVG with a tooltip per cell and point,
built by :mod:`attnprobe.report.charts`. Each function returns ``None`` when its table does
not hold what the figure needs (the page then shows the table instead).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd

from attnprobe.errors import InputError
from attnprobe.plot.attribution import METRIC_LABELS, agreement_summary, token_scores
from attnprobe.plot.perturbation import PREFERRED_METRICS, one_head_rows
from attnprobe.report.charts import heatmap, line_chart, number

__all__ = ["MAX_EXAMPLES", "agreement_figures", "diff_figures", "effect_figures",
           "head_heatmap", "token_heat_figures"]

MAX_EXAMPLES = 3  # token heat figures drawn (the first examples)
RANK_METRICS = ("kendall_tau", "spearman")


def head_heatmap(table: pd.DataFrame, value: str, tip: Callable[[pd.Series], str], *,
                 caption: str) -> Any:
    """Layer × head heatmap of ``table[value]`` (one row per head; ``stack``/``kind``
    columns, when present, give a grid row per (stack, kind, layer)). Cells are keyed
    ``L<layer>H<head>`` and titled ``tip(row)``.

    Shapes: ``table`` has one row per head; the figure is ``[rows, heads]``.
    """
    frame = table.copy()
    for column in ("stack", "kind"):
        if column not in frame.columns:
            frame[column] = ""
    frame = frame.sort_values(["stack", "kind", "layer", "head"], kind="stable")
    rows = list(dict.fromkeys(zip(frame["stack"].astype(str), frame["kind"].astype(str),
                                  frame["layer"].astype(int), strict=True)))
    heads = sorted({int(h) for h in frame["head"]})
    several = len({(s, k) for s, k, _ in rows}) > 1
    values = np.full((len(rows), len(heads)), np.nan)
    tips = [["" for _ in heads] for _ in rows]
    keys = [["" for _ in heads] for _ in rows]
    row_of, col_of = {r: i for i, r in enumerate(rows)}, {h: i for i, h in enumerate(heads)}
    for _, item in frame.iterrows():
        r = row_of[(str(item["stack"]), str(item["kind"]), int(item["layer"]))]
        c = col_of[int(item["head"])]
        values[r, c] = float(item[value])
        tips[r][c] = tip(item)
        keys[r][c] = f"L{int(item['layer'])}H{int(item['head'])}"
    names = [f"{s} {k} L{la}" if several else f"L{la}" for s, k, la in rows]
    return heatmap(values, names, [f"H{h}" for h in heads], tips, caption=caption, keys=keys)


# ------------------------------------------------------------------------------ perturbation
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


def effect_figures(table: pd.DataFrame) -> list[Any] | None:
    """Effect per head of a ``perturb.run`` table: a layer × head heatmap of the mean
    ``change`` over the examples, per experiment and metric (the metrics of
    ``PREFERRED_METRICS`` first). Runs without single-head rows get a scope × metric
    heatmap. Rows with a ``step`` are left out (their steps are not comparable)."""
    if not {"metric", "change", "scope"} <= set(table.columns) or table.empty:
        return None
    if "step" in table.columns and table["step"].notna().any():
        table = table[table["step"].isna()]
        if table.empty:
            return None
    out = []
    experiments = table["experiment"].astype(str) if "experiment" in table.columns else \
        pd.Series("", index=table.index)
    for name in dict.fromkeys(experiments):
        part = table[experiments == name]
        try:
            heads = one_head_rows(part)
        except InputError:
            heads = part.iloc[0:0]
        if heads.empty:
            out.append(_scope_effects(part, name))
            continue
        present = list(dict.fromkeys(heads["metric"].astype(str)))
        for metric in sorted(present, key=lambda m: (m not in PREFERRED_METRICS,
                                                     present.index(m))):
            rows = heads[heads["metric"].astype(str) == metric]
            n = rows["example_id"].nunique() if "example_id" in rows.columns else len(rows)
            means = rows.groupby(["layer", "head"], as_index=False).agg(
                change=("change", "mean"), baseline=("baseline", "mean"),
                perturbed=("perturbed", "mean"))

            def tip(row: pd.Series, metric: str = metric, n: int = n, name: str = name) -> str:
                return (f"L{int(row['layer'])}H{int(row['head'])} {name}: {metric} change "
                        f"{number(row['change'])} (baseline {number(row['baseline'])}, "
                        f"perturbed {number(row['perturbed'])}), mean of {n} example(s)")
            out.append(head_heatmap(means, "change", tip,
                                    caption=f"{name}: mean {metric} change"))
    return out


# ------------------------------------------------------------------------------ attribution
def agreement_figures(comparison: Any) -> list[Any] | None:
    """Agreement of each attention view with each attribution method by layer (a line per
    view, mean over examples), for the rank metric the comparison has (Kendall τ first);
    methods compared without a layer are dashed reference lines."""
    try:
        summary = agreement_summary(comparison)
    except InputError:
        return None
    metrics = list(dict.fromkeys(summary["metric"].astype(str)))
    metric = next((m for m in (*RANK_METRICS, *metrics) if m in metrics), None)
    summary = summary[summary["metric"].astype(str) == metric]
    layered = summary["layer"].notna()
    if "source_kind" in summary.columns:
        layered &= summary["source_kind"].astype(str) == "attention"
    if not layered.any():
        return None
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


def token_heat_figures(comparison: Any, max_examples: int = MAX_EXAMPLES) -> list[Any]:
    """Scores on the tokens of the first ``max_examples`` examples: a row per method or
    attention view, each row divided by its largest ``|score|`` (as ``plot.token_heat``)."""
    try:
        table = token_scores(comparison)
    except InputError:
        return []
    out = []
    for example in list(dict.fromkeys(table["example_id"].astype(str)))[:max_examples]:
        part = table[table["example_id"].astype(str) == example]
        if "target" in part.columns:
            targets = [t for t in dict.fromkeys(part["target"].fillna("").astype(str)) if t]
            if targets:
                cells = part["target"].fillna("").astype(str)
                part = part[(cells == targets[0]) | (cells == "")]
        methods = list(dict.fromkeys(part["method"].astype(str)))
        first = part[part["method"].astype(str) == methods[0]].sort_values("position")
        tokens = list(first["token"].astype(str))
        values = np.full((len(methods), len(tokens)), np.nan)
        raw = np.full_like(values, np.nan)
        for r, method in enumerate(methods):
            rows = part[part["method"].astype(str) == method].drop_duplicates("position")
            for _, item in rows.iterrows():
                if 0 <= int(item["position"]) < len(tokens):
                    raw[r, int(item["position"])] = float(item["score"])
            peak = np.nanmax(np.abs(raw[r])) if np.isfinite(raw[r]).any() else 0.0
            values[r] = raw[r] / peak if peak > 0 else 0.0 * raw[r]
        tips = [[f"{tokens[c]} (position {c}), {methods[r]}: score {number(raw[r, c])}"
                 for c in range(len(tokens))] for r in range(len(methods))]
        out.append(heatmap(values, methods, tokens, tips, rotate_columns=True, cell=18,
                           caption=f"example {example}: score / row max |score|"))
    return out


# ------------------------------------------------------------------------------ diff
def diff_figures(diff: Any) -> list[Any]:
    """Per head, how a checkpoint diff changed it: the attention change (mean JS per query
    row) when the diff measured it, and whether the label changed."""
    heads = diff.heads()

    def tip(row: pd.Series) -> str:
        text = f"{row['head_id']}: {row.get('label_a', '')} → {row.get('label_b', '')}"
        if "js" in row and pd.notna(row["js"]):
            text += f"; JS {number(row['js'])} nats, cosine {number(row.get('cosine'))}"
        return text
    out = []
    if "js" in heads.columns and heads["js"].notna().any():
        out.append(head_heatmap(heads, "js", tip,
                                caption="attention change: mean JS per row (nats)"))
    if "label_changed" in heads.columns:
        out.append(head_heatmap(heads.assign(changed=heads["label_changed"].astype(float)),
                                "changed", tip, caption="label changed (1) or kept (0)"))
    return out
