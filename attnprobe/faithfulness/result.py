"""What :func:`~attnprobe.faithfulness.evaluate` returns: the :class:`Faithfulness` result
with its tidy tables (column names below), the ranked summary with bootstrap confidence
intervals, and the mean curves.

Metrics (``metric`` column of :attr:`Faithfulness.table`; ``level`` is the share of real
tokens removed, NaN for the per-example aggregates):

- ``comprehensiveness`` ``f(x) − f(x \\ top k)`` and ``sufficiency`` ``f(x) − f(top k)`` at
  each level (DeYoung et al. 2020); higher comprehensiveness and lower sufficiency are better;
- ``aopc_comprehensiveness`` and ``aopc_sufficiency``: their means over the levels;
- ``deletion_morf_area``, ``deletion_lerf_area``, ``insertion_morf_area``,
  ``insertion_lerf_area``: areas under the curves of the output as tokens are deleted, or
  inserted into the emptied text, most-relevant-first or least-relevant-first (x axis: share
  of real tokens; a faithful ranking has a low deletion MoRF area and a high insertion MoRF
  area, Petsiuk et al. 2018);
- ``abpc``: area between the LeRF and MoRF deletion curves (higher is better);
- ``tau_loo``: Kendall τ between the importance and leave-one-out output drops (ferret).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from attnprobe.core import html_view
from attnprobe.core.display import counted, describe
from attnprobe.faithfulness.metrics import bootstrap_ci

__all__ = ["CURVE_COLUMNS", "HIGHER_IS_BETTER", "RANDOM_SOURCE", "SANITY_COLUMNS",
           "SUMMARY_METRICS", "TABLE_COLUMNS", "Faithfulness"]

TABLE_COLUMNS = ("example_id", "source", "source_kind", "metric", "level", "k", "value",
                 "removal", "target", "note")
# one row per point of a curve: ``fraction`` is the nominal share of real tokens (the
# step), ``k`` the tokens removed (deletion) or inserted (insertion), ``value`` the output
CURVE_COLUMNS = ("example_id", "source", "source_kind", "curve", "fraction", "k", "value",
                 "full", "removal")
# the model-randomisation check (Adebayo et al. 2018): per example and source, the Spearman
# correlation of the importance on the model and on the randomised copy
SANITY_COLUMNS = ("example_id", "source", "source_kind", "spearman")
SUMMARY_METRICS = ("aopc_comprehensiveness", "aopc_sufficiency", "abpc", "tau_loo")
HIGHER_IS_BETTER = {"aopc_comprehensiveness": True, "aopc_sufficiency": False, "abpc": True,
                    "tau_loo": True}
RANDOM_SOURCE = "random"


@dataclass
class Faithfulness:
    """Everything :func:`~attnprobe.faithfulness.evaluate` measured.

    Attributes:
        table: per example, source, metric and level: ``TABLE_COLUMNS``. ``source`` is an
            attention view (``source_kind="attention"``, e.g. ``rollout@L5``), an
            attribution method (``"attribution"``) or the random-order baseline
            (``"random"``); ``removal`` names the procedure (``delete``,
            ``replace:[MASK]``, ``attention``); ``note`` says why a value is NaN.
        curves_table: the deletion (MoRF, LeRF) and insertion curves, ``CURVE_COLUMNS``.
        sanity: the model-randomisation check, ``SANITY_COLUMNS`` (empty when not run).
        skipped: ids of texts left out as too long (``truncation="skip"``).
        sanity_threshold: a source whose mean Spearman correlation with its randomised-model
            ranking is above this is flagged in :meth:`summary`.
    """

    table: pd.DataFrame
    curves_table: pd.DataFrame
    sanity: pd.DataFrame = field(default_factory=lambda: pd.DataFrame(
        columns=list(SANITY_COLUMNS)))
    skipped: tuple[str, ...] = ()
    sanity_threshold: float = 0.5
    seed: int = 0

    def __repr__(self) -> str:
        sources = self.table["source"].unique()
        return describe(
            "Faithfulness", counted(self.table["example_id"].nunique(), "text"),
            counted(len(sources), "source"),
            f"removal {', '.join(map(str, self.table['removal'].unique()))}",
            counted(len(self.table), "row"),
            f"{counted(len(self.skipped), 'text')} skipped" if self.skipped else None)

    def summary(self, *, level: float = 0.95, n_boot: int = 1000) -> pd.DataFrame:
        """Per source, the mean over examples of each of ``SUMMARY_METRICS`` with a
        percentile-bootstrap confidence interval (``<metric>``, ``<metric>_low``,
        ``<metric>_high``), ``n`` (examples with an AOPC comprehensiveness), ``rank``
        (1 = highest AOPC comprehensiveness) and, when the sanity check ran,
        ``sanity_spearman`` and ``sanity_flag`` (True: the ranking barely changed on the
        randomised model). Sorted by rank; NaN rows (noted in the table) are left out of
        the means."""
        per = self.table[self.table["metric"].isin(SUMMARY_METRICS)]
        rows = []
        keys = per[["source", "source_kind"]].drop_duplicates()
        for source, kind in keys.itertuples(index=False):
            mine = per[per["source"] == source]
            row: dict[str, object] = {"source": source, "source_kind": kind}
            for metric in SUMMARY_METRICS:
                values = mine.loc[mine["metric"] == metric, "value"].dropna().to_numpy()
                mean, low, high = bootstrap_ci(values, n_boot=n_boot, level=level,
                                               seed=self.seed) if values.size else (
                    np.nan, np.nan, np.nan)
                row.update({metric: mean, f"{metric}_low": low, f"{metric}_high": high})
            row["n"] = int(mine.loc[mine["metric"] == SUMMARY_METRICS[0], "value"].notna().sum())
            rows.append(row)
        out = pd.DataFrame(rows)
        if not self.sanity.empty:
            spearman = self.sanity.groupby("source")["spearman"].mean()
            out["sanity_spearman"] = out["source"].map(spearman)
            out["sanity_flag"] = out["sanity_spearman"] > self.sanity_threshold
        out["rank"] = out["aopc_comprehensiveness"].rank(ascending=False, method="min",
                                                         na_option="bottom").astype(int)
        return out.sort_values(["rank", "source"], kind="stable").reset_index(drop=True)

    def curves(self, *, level: float = 0.95, n_boot: int = 1000) -> pd.DataFrame:
        """Mean curve per (source, curve, fraction) over examples, as the output's share of
        the full-text output is hard to compare across texts: ``value`` here is the drop
        ``full − output`` averaged, with its bootstrap band (``low``, ``high``) and ``n``."""
        frame = self.curves_table.assign(
            drop=self.curves_table["full"] - self.curves_table["value"])
        rows = []
        for (source, kind, curve, fraction), part in frame.groupby(
                ["source", "source_kind", "curve", "fraction"], sort=True):
            values = part["drop"].dropna().to_numpy()
            mean, low, high = bootstrap_ci(values, n_boot=n_boot, level=level,
                                           seed=self.seed) if values.size else (
                np.nan, np.nan, np.nan)
            rows.append((source, kind, curve, fraction, mean, low, high, values.size))
        return pd.DataFrame(rows, columns=["source", "source_kind", "curve", "fraction",
                                           "value", "low", "high", "n"])

    def _repr_html_(self) -> str | None:
        """The ranking with confidence intervals and the curves in a notebook
        (:mod:`attnprobe.report`)."""
        return html_view.html(self, "faithfulness")
