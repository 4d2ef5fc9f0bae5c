"""What :func:`~attnprobe.attribution.comparison.compare` returns: the :class:`Comparison`
with its tidy tables (column names below) and their summaries."""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from attnprobe.core import html_view
from attnprobe.core.display import counted, describe
from attnprobe.errors import InputError
from attnprobe.types import AttentionMap, TokenAttribution

__all__ = ["AGREEMENT_COLUMNS", "SIGNIFICANCE", "STEP_COLUMNS", "TRUTH_COLUMNS", "Comparison",
           "split_source", "summarise"]

# Tidy columns of Comparison.table and Comparison.truth_table.
AGREEMENT_COLUMNS = ("example_id", "source", "source_kind", "view", "layer", "method", "metric",
                     "value", "p_value")
TRUTH_COLUMNS = ("example_id", "source", "source_kind", "view", "layer", "metric", "value")
# Comparison.table with generate=N: one row per generated token (step 1..N, its position in
# the sequence and the token) and source, method and metric.
STEP_COLUMNS = ("example_id", "step", "position", "token", *AGREEMENT_COLUMNS[1:])
SIGNIFICANCE = 0.05


def split_source(source: str) -> tuple[str, int | None]:
    """``rollout@L3`` -> ("rollout", 3); ``saliency`` -> ("saliency", None)."""
    view, _, layer = source.partition("@L")
    return view, int(layer) if layer else None


@dataclass
class Comparison:
    """Everything :func:`compare` measured.

    Attributes:
        table: agreement per example, ``AGREEMENT_COLUMNS``: ``source`` is an attention view
            (``source_kind="attention"``, e.g. ``rollout@L3``) or a method
            (``"attribution"``), ``method`` the attribution it is compared with. With
            ``generate``, per generated token: ``STEP_COLUMNS`` (``step`` 1..N, ``position``
            in the sequence, ``token`` the generated token).
        truth_table: per example and source, scores against the known decisive tokens
            (``TRUTH_COLUMNS``; empty without ``truth``).
        attributions: every importance vector that went into the tables (with
            ``generate``, ``example_id`` reads ``<example>:step<k>``).
        skipped: ids of texts left out as too long (``truncation="skip"``).
        maps: with ``generate``, each text's map over prompt + generated tokens.
    """

    table: pd.DataFrame
    truth_table: pd.DataFrame
    attributions: list[TokenAttribution] = field(default_factory=list)
    skipped: tuple[str, ...] = ()
    maps: list[AttentionMap] = field(default_factory=list)

    def __repr__(self) -> str:
        table = self.table
        attention = table[table["source_kind"] == "attention"]
        views = ", ".join(map(str, attention["view"].unique()[:4]))
        layers = attention["layer"].dropna().nunique()
        return describe(
            "Comparison", counted(table["example_id"].nunique(), "text"),
            "methods " + ", ".join(map(str, table["method"].unique()[:4])),
            f"views {views} at {counted(layers, 'layer')}" if views else None,
            counted(len(table), "row"),
            f"{counted(table['step'].max(), 'generated token')}" if "step" in table else None,
            f"{counted(len(self.truth_table), 'truth row')}" if len(self.truth_table) else None,
            f"{counted(len(self.skipped), 'text')} skipped" if self.skipped else None)

    def summary(self) -> pd.DataFrame:
        """Mean ± std over examples, and the share with ``p <= 0.05`` (rank metrics), per
        (source, method, metric); sorted so layers read in order."""
        return summarise(self.table, ["source_kind", "view", "layer", "source", "method",
                                       "metric"])

    def truth_summary(self) -> pd.DataFrame:
        """Mean ± std over examples of each source's ground-truth scores."""
        if self.truth_table.empty:
            raise InputError("no ground truth was given (compare(..., truth=...))")
        return summarise(self.truth_table, ["source_kind", "view", "layer", "source", "metric"])

    def _repr_html_(self) -> str | None:
        """Agreement by layer and token heat in a notebook (:mod:`attnprobe.report`)."""
        return html_view.html(self, "comparison")


def summarise(table: pd.DataFrame, keys: list[str]) -> pd.DataFrame:
    """Mean, std and count (``n``) of ``value`` per ``keys``, and the share of rows with
    ``p_value <= SIGNIFICANCE`` where the table has p-values."""
    frame = table.copy()
    frame["layer"] = frame["layer"].astype("Int64")
    grouped = frame.groupby(keys, dropna=False, sort=False)
    out = grouped["value"].agg(["mean", "std", "count"]).reset_index()
    out = out.rename(columns={"count": "n"})
    if "p_value" in frame:
        significant = (frame["p_value"] <= SIGNIFICANCE).where(frame["p_value"].notna())
        frac = significant.groupby([frame[k] for k in keys], dropna=False, sort=False).mean()
        out["frac_significant"] = frac.to_numpy()
    return out.sort_values(keys, kind="stable", na_position="first").reset_index(drop=True)
