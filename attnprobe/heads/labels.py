"""Label each head from its scores with explicit, configurable rules (methods.md §13).

The input is the wide per-head score table (index columns ``stack, kind, layer, head,
head_id``, one column per score). Every label is a :class:`LabelRule` in :data:`RULES`: its
test ``test(row, thresholds) -> evidence | None``, its rank and its colour. The test returns the
scores it used against their thresholds (e.g. ``"prev=0.83 > 0.5"``) when it fires and ``None``
otherwise. A rule whose scores are missing or NaN does not fire.

Several rules may fire for one head. The label is the fired rule of lowest rank; the others are
listed in ``also``, so no evidence is thrown away. :data:`PRECEDENCE` is that order, read from
the registry (so a rule registered later has its place in it too)::

    sink > previous > next > self > offset > collapsed > vertical+diagonal > block
      > induction > duplicate > broad > syntactic > heterogeneous

This is methods.md §13 (special/sink > positional > broad > syntactic > heterogeneous;
Clark's overwrite order made explicit) with Kovaleva's vertical+diagonal and block classes
and the repeated-token induction/duplicate scores slotted in after the positional labels.
One deliberate change: §13 puts ``collapsed`` first, but a perfect previous-token or
one-column head is one-hot too, and calling it "collapsed" would hide what it does. So
``collapsed`` (near-zero entropy) names one-hot attention *without* a consistent target; when
the target is a fixed offset or a sink token, that label wins and ``collapsed`` is listed in
``also``. ``heterogeneous`` is the fallback when no rule fires (Kovaleva's class).
A new label is one ``@rule("name", rank=..., colour=...)`` function (or
``RULES.add(LabelRule(...))``) in any module: its place in the precedence, its share in
``layer_profile`` and its colour in the reports all follow from that one entry.

Defaults (:class:`Thresholds`):

- collapsed: ``entropy_norm < 0.05`` and ``max_weight > 0.95`` (Zhai et al. give none; ours).
- sink: any of ``cls, sep, bos, eos, first, punct, special > 0.6`` (Clark's special-token
  threshold). The evidence names the largest specific column over the threshold, or
  ``special`` when only the aggregate is over.
- previous / next / self: ``prev`` / ``next`` / ``self > 0.5`` (Clark), or a fixed-offset head
  (below) whose offset is -1 / +1 / 0.
- offset: ``pos_score >= 0.9`` and ``max_weight > 0.8`` (Voita) at any other offset; the
  evidence gives ``pos_offset``.
- vertical+diagonal: ``prev + self + next >= 0.3`` and ``max(special, first) >= 0.3`` (our
  operationalization of Kovaleva), unless the head is broad (uniform rows on short inputs
  reach both by chance).
- block: ``block >= 0.8`` and no positional rule fires.
- induction / duplicate: ``rep_induction`` or ``rep_induction_ahead`` / ``rep_duplicate`` or
  ``rep_duplicate_ahead > 0.4`` (repeated random tokens, §11.5).
- broad ("uniform collapse"): ``entropy_norm >= 0.78`` and
  ``max_weight <= max(0.1, 3.0 * chance_weight)``. The 0.1 is Clark's "at most 10% of the
  mass on any word" (with 0.78 the length-free form of his 3.8 nats at n≈128). On short inputs
  a *uniform* row already puts ``1/n > 0.1`` on every key (n=8: 0.125), so a fixed 0.1 would
  never call it broad; allowing up to ``broad_max_ratio`` times the uniform row's maximum
  (``chance_weight``) keeps the rule meaningful there, and changes nothing once
  ``chance_weight <= 1/30`` (bidirectional inputs of 30+ tokens; causal rows see fewer keys,
  so their ``chance_weight`` is larger). Without a ``chance_weight`` column the bound is 0.1.
- syntactic: ``syntax_margin >= 0.10`` (10 points over the offset baseline) and
  ``syntax_count >= 20``.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import pandas as pd

from attnprobe.errors import InputError
from attnprobe.heads.label_rules import (
    FALLBACK,
    RULES,
    LabelRule,
    Row,
    Thresholds,
    all_hold,
    comparison,
    fixed_offset,
    number_text,
    rule,
    score_of,
)

__all__ = ["FALLBACK", "INDEX_COLUMNS", "PRECEDENCE", "RESULT_COLUMNS", "RULES",  # noqa: F822
           "LabelRule", "Thresholds", "classify_row", "classify_scores", "layer_profile", "rule"]

INDEX_COLUMNS = ("stack", "kind", "layer", "head", "head_id")
RESULT_COLUMNS = ("label", "evidence", "also")
# Scores the rules read as numbers (checked when present; other columns pass through).
RULE_SCORES = ("entropy_norm", "max_weight", "chance_weight", "prev", "self", "next",
               "pos_score", "pos_offset", "cls", "sep", "bos", "eos", "first", "punct",
               "special", "block", "rep_induction", "rep_induction_ahead", "rep_duplicate",
               "rep_duplicate_ahead", "syntax_margin", "syntax_count")
# layer_profile: means always reported (NaN when the column is absent) and when present.
PROFILE_MEANS = ("entropy", "entropy_norm", "max_weight", "distance", "first", "special")
OPTIONAL_MEANS = ("syntax_accuracy", "dep_alignment")


def __getattr__(name: str) -> tuple[str, ...]:
    # PRECEDENCE is derived from RULES on every read (not a copy taken at import), so a rule
    # registered later has its place in it.
    if name == "PRECEDENCE":
        return RULES.precedence()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- rules: rank = place in the precedence (gaps of 10 leave room), colour for reports ------

@rule("collapsed", rank=60, colour="#edc948")
def collapsed(row: Row, t: Thresholds) -> str | None:
    """Nearly one-hot rows everywhere (entropy collapse, Zhai et al.)."""
    return all_hold(row, ("entropy_norm", "<", t.collapsed_entropy_norm),
                ("max_weight", ">", t.collapsed_max_weight))


@dataclass(frozen=True)
class AnyOver:
    """Fires when any of ``columns`` (else of ``fallback``) is above a threshold; the evidence
    names the largest such column."""

    columns: tuple[str, ...]
    threshold: str  # name of the Thresholds field
    fallback: tuple[str, ...] = ()

    def __call__(self, row: Row, t: Thresholds) -> str | None:
        limit = getattr(t, self.threshold)
        for group in (self.columns, self.fallback):
            over = [(v, name) for name in group
                    if (v := score_of(row, name)) is not None and v > limit]
            if over:
                value, name = max(over, key=lambda pair: pair[0])  # first of ties wins
                return comparison(name, value, ">", limit)
        return None


RULES.add(LabelRule("sink", AnyOver(("cls", "sep", "bos", "eos", "first", "punct"), "sink",
                                    fallback=("special",)), rank=10, colour="#4e79a7"))


@dataclass(frozen=True)
class Positional:
    """Mass above ``positional_mass`` at ``column``, or a fixed-offset head at ``offset``."""

    column: str
    offset: int

    def __call__(self, row: Row, t: Thresholds) -> str | None:
        evidence = all_hold(row, (self.column, ">", t.positional_mass))
        if evidence is not None:
            return evidence
        fixed = fixed_offset(row, t)
        return fixed[1] if fixed is not None and fixed[0] == self.offset else None


RULES.add(LabelRule("previous", Positional("prev", -1), rank=20, colour="#f28e2b"))
RULES.add(LabelRule("next", Positional("next", 1), rank=30, colour="#e15759"))
RULES.add(LabelRule("self", Positional("self", 0), rank=40, colour="#76b7b2"))


@rule("offset", rank=50, colour="#59a14f")
def offset(row: Row, t: Thresholds) -> str | None:
    """Argmax at one relative offset other than -1/0/+1 (Voita's positional head)."""
    fixed = fixed_offset(row, t)
    return fixed[1] if fixed is not None and fixed[0] not in (-1, 0, 1) else None


POSITIONAL = ("previous", "next", "self", "offset")


@rule("vertical+diagonal", rank=70, colour="#b07aa1")
def vertical_diagonal(row: Row, t: Thresholds) -> str | None:
    """Kovaleva's mix: local (±1, self) mass and special/first-token mass both substantial.

    A head that is broad does not count: on short inputs (causal ones above all, where row i
    sees only i + 1 keys) a uniform row already leaves over 0.3 on the diagonal and the first
    token by chance.
    """
    local = [score_of(row, name) for name in ("prev", "self", "next")]
    vertical = [(v, name) for name in ("special", "first")
                if (v := score_of(row, name)) is not None]
    if None in local or not vertical or broad(row, t) is not None:
        return None
    diagonal = sum(v for v in local if v is not None)
    value, name = max(vertical, key=lambda pair: pair[0])
    if diagonal < t.diagonal_mass or value < t.vertical_mass:
        return None
    return (f"{comparison('prev+self+next', diagonal, '>=', t.diagonal_mass)}, "
            f"{comparison(name, value, '>=', t.vertical_mass)}")


@rule("block", rank=80, colour="#ff9da7")
def block(row: Row, t: Thresholds) -> str | None:
    """Kovaleva's intra-segment block on two-segment inputs, when not explained by position."""
    evidence = all_hold(row, ("block", ">=", t.block))
    if evidence is None or any(RULES.get(label)(row, t) for label in POSITIONAL):
        return None
    return evidence


RULES.add(LabelRule("induction", AnyOver(("rep_induction", "rep_induction_ahead"), "induction"),
                    rank=90, colour="#9c755f"))
RULES.add(LabelRule("duplicate", AnyOver(("rep_duplicate", "rep_duplicate_ahead"), "duplicate"),
                    rank=100, colour="#bab0ac"))


@rule("broad", rank=110, colour="#86bcb6")
def broad(row: Row, t: Thresholds) -> str | None:
    """Clark's broad head, length-robust: high normalized entropy, no key much above uniform."""
    entropy = all_hold(row, ("entropy_norm", ">=", t.broad_entropy_norm))
    peak, chance = score_of(row, "max_weight"), score_of(row, "chance_weight")
    if entropy is None or peak is None:
        return None
    limit = t.broad_max_weight
    if chance is not None and t.broad_max_ratio * chance > limit:
        limit = t.broad_max_ratio * chance
        bound = (f"{number_text(limit)} ({t.broad_max_ratio:g} x "
                 f"chance_weight={number_text(chance)})")
    else:
        bound = f"{limit:g}"
    if peak > limit:
        return None
    return f"{entropy}, max_weight={number_text(peak, limit)} <= {bound}"


@rule("syntactic", rank=120, colour="#d37295")
def syntactic(row: Row, t: Thresholds) -> str | None:
    """Beats the best offset baseline on a dependency relation by a margin, on enough arcs."""
    evidence = all_hold(row, ("syntax_margin", ">=", t.syntax_margin),
                    ("syntax_count", ">=", t.syntax_count))
    relation = row.get("syntax_relation")
    if evidence is None or not isinstance(relation, str) or not relation:
        return evidence
    return f"syntax_relation={relation}, {evidence}"


# ---- tables -------------------------------------------------------------------------------

def _check_table(frame: pd.DataFrame, needed: Sequence[str], what: str) -> None:
    if not isinstance(frame, pd.DataFrame):
        raise InputError(f"{what} must be a pandas DataFrame, got {type(frame).__name__}")
    missing = [c for c in needed if c not in frame.columns]
    if missing:
        raise InputError(f"{what} lacks column(s) {', '.join(missing)}")
    if frame.empty:
        raise InputError(f"{what} is empty: it needs one row per head")


def _numeric(frame: pd.DataFrame, columns: Sequence[str], what: str) -> pd.DataFrame:
    """``columns`` of ``frame`` as numbers; a column that is not numeric raises InputError."""
    out = {}
    for name in columns:
        try:
            out[name] = pd.to_numeric(frame[name], errors="raise")
        except (TypeError, ValueError):
            raise InputError(f"{what} column {name!r} is not numeric") from None
    return pd.DataFrame(out, index=frame.index)


def _head_name(row: Row) -> str:
    return f"{row['stack']}/{row['kind']} {row['head_id']}"


def classify_row(row: Row, thresholds: Thresholds | None = None) -> tuple[str, str, str]:
    """``(label, evidence, also)`` of one head's scores (a mapping of score name to value)."""
    t = Thresholds() if thresholds is None else thresholds
    fired = [(entry.label, evidence) for entry in RULES.rules()
             if (evidence := entry(row, t)) is not None]
    if not fired:
        return FALLBACK, "no rule fired", ""
    return fired[0][0], fired[0][1], ", ".join(label for label, _ in fired[1:])


def classify_scores(scores: pd.DataFrame, thresholds: Thresholds | None = None) -> pd.DataFrame:
    """Label every head of a wide score table.

    Args:
        scores: one row per head: ``INDEX_COLUMNS`` plus any score columns (module docstring).
            Columns named ``label``, ``evidence`` or ``also`` are replaced.
        thresholds: rule thresholds (defaults: methods.md §13).

    Returns:
        ``INDEX_COLUMNS``, then ``label``, ``evidence`` (the winning rule's scores against its
        thresholds), ``also`` (other labels that fired, in precedence order, ``""`` if none),
        then every score column unchanged; rows in input order.

    Raises:
        InputError: missing index columns, an empty table, a duplicated head, a non-numeric
            score the rules read, or a head whose every score is NaN.
    """
    thresholds = Thresholds() if thresholds is None else thresholds
    if not isinstance(thresholds, Thresholds):
        raise InputError(f"thresholds must be a Thresholds, got {type(thresholds).__name__}")
    _check_table(scores, INDEX_COLUMNS, "score table")
    keys = list(INDEX_COLUMNS[:4])
    duplicated = scores.duplicated(keys)
    if duplicated.any():
        first = scores[duplicated].iloc[0]
        raise InputError(f"head {_head_name(first)} appears more than once in the score table")
    score_cols = [c for c in scores.columns if c not in INDEX_COLUMNS and c not in RESULT_COLUMNS]
    if not score_cols:
        raise InputError("score table has no score columns besides " + ", ".join(INDEX_COLUMNS))
    empty = scores[score_cols].isna().all(axis=1)
    if empty.any():
        head = _head_name(scores[empty].iloc[0])
        raise InputError(f"head {head} has no scores (all NaN); drop it or compute its scores")

    numeric = [c for c in score_cols if c in RULE_SCORES]
    rows = pd.concat([scores[[c for c in score_cols if c not in numeric]],
                      _numeric(scores, numeric, "score table")], axis=1)
    results = [classify_row(row, thresholds) for row in rows.to_dict("records")]
    labels = pd.DataFrame(results, columns=list(RESULT_COLUMNS), index=scores.index)
    out = pd.concat([scores[list(INDEX_COLUMNS)], labels, scores[score_cols]], axis=1)
    return out.reset_index(drop=True)


def layer_profile(classified: pd.DataFrame) -> pd.DataFrame:
    """Share of each label and mean scores per layer, from :func:`classify_scores`' output.

    Reading the rows from shallow to deep checks the usual story: shallow heads local
    (high ``local`` and ``share_previous``/``share_next``), middle heads syntactic, deep heads
    global (``share_broad``, high ``entropy_norm``, long ``distance``).

    Returns:
        One row per ``(stack, kind, layer)`` (sorted): ``n_heads``, ``share_<label>`` for every
        label in ``PRECEDENCE`` (fractions of the layer's heads, summing to 1), the mean
        ``entropy``, ``entropy_norm``, ``max_weight``, ``distance``, ``first``, ``special``
        (NaN when the column is absent), ``local`` = mean of ``prev + self + next``, and the
        mean ``syntax_accuracy`` / ``dep_alignment`` when present. Means skip heads without
        the score.

    Raises:
        InputError: missing index or ``label`` columns, an empty table, or an unknown label.
    """
    _check_table(classified, (*INDEX_COLUMNS, "label"), "classified table")
    precedence = RULES.precedence()
    unknown = sorted(set(classified["label"]) - set(precedence), key=str)
    if unknown:
        raise InputError(f"unknown label(s) {', '.join(map(repr, unknown))}; "
                         f"expected labels from PRECEDENCE")
    means = [*PROFILE_MEANS, *(c for c in OPTIONAL_MEANS if c in classified.columns)]
    present = [c for c in (*means, "prev", "self", "next") if c in classified.columns]
    values = _numeric(classified, present, "classified table").reindex(
        columns=[*means, "prev", "self", "next"])
    table = pd.DataFrame({c: classified[c] for c in INDEX_COLUMNS[:3]})
    for label in precedence:
        table[f"share_{label}"] = (classified["label"] == label).astype(float)
    for name in means:
        table[name] = values[name]
    table["local"] = values["prev"] + values["self"] + values["next"]
    grouped = table.groupby(list(INDEX_COLUMNS[:3]), sort=True)
    profile = grouped.mean()
    profile.insert(0, "n_heads", grouped.size())
    order = ["n_heads", *(f"share_{label}" for label in precedence), *PROFILE_MEANS, "local",
             *means[len(PROFILE_MEANS):]]
    return profile[order].reset_index()
