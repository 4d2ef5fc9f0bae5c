"""The copying labels: ``induction``, ``retrieval`` and ``duplicate`` (family ``copying``).

``induction`` / ``duplicate`` read the repeated-token probe when the table has it (it is the
controlled experiment, so it decides), else the corpus' own copy mass over the rows that
hold a copy (:class:`Copying`); ``retrieval`` reads Wu et al.'s retrieval score.
"""

from __future__ import annotations

from dataclasses import dataclass

from attnprobe.heads.label_evidence import Row, comparison, number_text, score_of
from attnprobe.heads.label_rules import (
    MIN_REST,
    RULES,
    LabelRule,
    Threshold,
    Thresholds,
    sink_free,
)

__all__ = ["DUPLICATE", "INDUCTION", "MIN_COPY_ROWS", "AnyOver", "Copying"]

MIN_COPY_ROWS = Threshold("min_copy_rows", 20, "the corpus' copying scores count only when "
                          "measured on at least this many query rows that hold an earlier "
                          "(_ahead: later) copy of their token (induction_rows ...): a mean "
                          "over a handful of chance repeats says little")


@dataclass(frozen=True)
class AnyOver:
    """Fires when any of ``columns`` is above a threshold; the evidence names the largest."""

    columns: tuple[str, ...]
    threshold: str  # name of the threshold

    def __call__(self, row: Row, t: Thresholds) -> str | None:
        limit = getattr(t, self.threshold)
        over = [(v, name) for name in self.columns
                if (v := score_of(row, name)) is not None and v > limit]
        if not over:
            return None
        value, name = max(over, key=lambda pair: pair[0])  # first of ties wins
        return comparison(name, value, ">", limit)


@dataclass(frozen=True)
class Copying:
    """A copying rule (induction, duplicate) on the best evidence the table has.

    The repeated-token probe's ``probe`` columns decide when the row has any of them: the
    probe is the controlled experiment (every token of the second copy has exactly one
    earlier copy). Without the probe (stored maps, ``repeated=False``) the corpus' own
    ``corpus`` columns are read, each over its ``<column>_rows`` query rows that hold a copy,
    and only when there are at least ``min_copy_rows`` of them and the head is not all sink
    (``min_rest``: the scores are renormalised over the content keys, so the last per cent of
    a sink head would otherwise pass for copying).
    """

    probe: tuple[str, ...]
    corpus: tuple[str, ...]
    threshold: str  # name of the threshold

    def _corpus(self, row: Row, t: Thresholds) -> list[tuple[float, str, float | None]]:
        """``(value, column, rows)`` of the corpus columns over the threshold (``rows``
        None without its ``_rows`` column); none when the probe decides or the head is all
        sink."""
        if any(score_of(row, name) is not None for name in self.probe) or not sink_free(row, t):
            return []
        limit = getattr(t, self.threshold)
        return [(v, name, score_of(row, f"{name}_rows")) for name in self.corpus
                if (v := score_of(row, name)) is not None and v > limit]

    def __call__(self, row: Row, t: Thresholds) -> str | None:
        if any(score_of(row, name) is not None for name in self.probe):
            return AnyOver(self.probe, self.threshold)(row, t)
        over = [(v, name, n) for v, name, n in self._corpus(row, t)
                if n is not None and n >= t.min_copy_rows]
        if not over:
            return None
        value, name, rows = max(over, key=lambda found: found[0])  # first of ties wins
        limit = getattr(t, self.threshold)
        return f"{comparison(name, value, '>', limit)} over {number_text(rows)} rows"

    def held_back(self, row: Row, t: Thresholds) -> str | None:
        """The corpus score that passed on too few rows (or on an unknown number)."""
        few = [(v, name, n) for v, name, n in self._corpus(row, t)
               if n is None or n < t.min_copy_rows]
        if not few:
            return None
        value, name, rows = max(few, key=lambda found: found[0])
        score = comparison(name, value, ">", getattr(t, self.threshold))
        if rows is None:
            return f"{score} on an unknown number of rows (no {name}_rows column)"
        return f"{score} over {number_text(rows)} rows, fewer than " \
               f"min_copy_rows={t.min_copy_rows:g}"


INDUCTION = Copying(("rep_induction", "rep_induction_ahead"), ("induction", "induction_ahead"),
                    "induction")
DUPLICATE = Copying(("rep_duplicate", "rep_duplicate_ahead"), ("duplicate", "duplicate_ahead"),
                    "duplicate")
RULES.add(LabelRule(
    "induction", INDUCTION, rank=90, colour="#9c755f", family="copying",
    held_back=INDUCTION.held_back,
    thresholds=(Threshold("induction", 0.4, "induction: rep_induction or rep_induction_ahead "
                          "above this; without the probe, the corpus' induction or "
                          "induction_ahead"), MIN_COPY_ROWS, MIN_REST),
    help="mass after earlier copies on repeated tokens > {induction}; without the probe the "
         "corpus' own, over ≥ {min_copy_rows} rows"))
RULES.add(LabelRule(
    "retrieval", AnyOver(("retrieval",), "retrieval"), rank=95, colour="#b6992d",
    family="copying",
    thresholds=(Threshold("retrieval", 0.1, "retrieval: retrieval above this (Wu et al. 2024 "
                          "call a head a retrieval head above 0.1)"),),
    help="retrieval score > {retrieval}, when the table has one"))
RULES.add(LabelRule(
    "duplicate", DUPLICATE, rank=100, colour="#bab0ac", family="copying",
    held_back=DUPLICATE.held_back,
    thresholds=(Threshold("duplicate", 0.4, "duplicate: rep_duplicate or rep_duplicate_ahead "
                          "above this; without the probe, the corpus' duplicate or "
                          "duplicate_ahead"), MIN_COPY_ROWS, MIN_REST),
    help="mass on earlier copies > {duplicate}, read as induction's"))
