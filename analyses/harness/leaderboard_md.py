"""The faithfulness leaderboard as markdown: one table per model, each metric as
``mean [low, high]`` (``analyses/faithfulness_study.py`` writes it; the README holds it)."""

from __future__ import annotations

import pandas as pd

from attnprobe.faithfulness.result import SUMMARY_METRICS

METRIC_NAMES = {"aopc_comprehensiveness": "AOPC comp. ↑", "aopc_sufficiency": "AOPC suff. ↓",
                "abpc": "ABPC ↑", "tau_loo": "τ LOO ↑"}


def _cell(row: pd.Series, metric: str) -> str:
    value = row[metric]
    if pd.isna(value):
        return "–"
    return f"{value:.3g} [{row[f'{metric}_low']:.3g}, {row[f'{metric}_high']:.3g}]"


def _share(truth: pd.DataFrame, source: str, mean: str, low: str, high: str) -> str:
    if source not in truth.index:
        return "–"
    row = truth.loc[source]
    return f"{row[mean]:.2f} [{row[low]:.2f}, {row[high]:.2f}]"


def leaderboard_md(tables: dict[str, pd.DataFrame]) -> str:
    """One markdown table per model: the sources by rank, each metric as mean [95 % CI]; the
    induction table adds the copy-source top-1 share."""
    truth = tables["truth"].set_index("source") if not tables["truth"].empty else None
    models = tables["models"].set_index("model")
    parts = []
    for name, board in tables["leaderboard"].groupby("model", sort=False):
        info = models.loc[name]
        head = ["rank", "source", "kind", *METRIC_NAMES.values()]
        induction = name == "induction" and truth is not None
        if induction:
            head += ["copy source top-1", "source or match top-1"]
        accuracy_note = "" if pd.isna(info["held_out_accuracy"]) else \
            f", held-out accuracy {info['held_out_accuracy']:.3f}"
        lines = [f"**{name}** ({int(info['texts'])} texts, {info['mean_tokens']:.1f} tokens on "
                 f"average, removal `{info['removal']}`{accuracy_note})", "",
                 "| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
        for _, row in board.iterrows():
            cells = [str(row["rank"]), f"`{row['source']}`", row["source_kind"],
                     *(_cell(row, m) for m in SUMMARY_METRICS)]
            if induction:
                cells += [_share(truth, row["source"], "copy_source_top1", "low", "high"),
                          _share(truth, row["source"], "match_or_source_top1",
                                 "match_or_source_low", "match_or_source_high")]
            lines.append("| " + " | ".join(cells) + " |")
        if induction:
            lines += ["", f"Top-1 chance (one candidate): {truth['chance'].iloc[0]:.3f}."]
        parts.append("\n".join(lines))
    return "\n\n".join(parts) + "\n"
