"""Label each head from its scores with explicit, configurable rules (Clark et al. 2019;
Kovaleva et al. 2019).

The input is the wide per-head score table (index columns ``stack, kind, layer, head,
head_id``, one column per score). Every label is a :class:`LabelRule` in :data:`RULES`: its
test ``test(row, thresholds) -> evidence | None``, its rank, its family and its colour. The test
returns the scores it used against their thresholds (e.g. ``"prev_nosink=0.83 > 0.5"``) when
it fires and ``None`` otherwise. A rule whose scores are missing or NaN does not fire.

Several rules may fire for one head. The label is the fired rule of lowest rank; the others are
listed in ``also``, so no evidence is thrown away. Each label maps to its **family**
(``family`` column; :data:`~attnprobe.heads.label_rules.FAMILIES`). :data:`PRECEDENCE` is the
order, read from the registry (so a rule registered later has its place in it too)::

    previous > next > self > offset > collapsed > vertical+diagonal > block
      > induction > retrieval > duplicate > broad > syntactic > sink > heterogeneous

**Sink-aware.** Trained heads put much of their mass on sink keys — the first token, BOS/CLS,
a column such as ``[SEP]`` or ``.`` — and do something with the rest (Xiao et al. 2023; Gu et
al. 2024). So a head's pattern is judged on the mass left after its sink keys, renormalised:
the positional, collapsed and broad rules read the ``*_nosink`` scores
(:mod:`attnprobe.heads.sinks`), and only when at least ``min_rest`` (5 %) of the mass is left.
``sink`` is a rule like the others, ranked last: a head is labelled ``sink`` only when nothing
else fires on the remaining mass; otherwise ``sink`` is listed in ``also`` (a head with 70 % on
the first token and 30 % on the previous token is ``previous``, also ``sink``).

This is the precedence of the head-pattern literature (special/sink > positional > broad >
syntactic > heterogeneous; Clark's overwrite order made explicit) with Kovaleva's
vertical+diagonal and block classes and the repeated-token induction/duplicate scores slotted in
after the positional labels, and two deliberate changes. ``sink`` moves from first to last, as
above. And that order puts ``collapsed`` first, but a perfect previous-token head is one-hot
too, and calling it "collapsed" would hide what it does. So ``collapsed`` (near-zero sink-free
entropy) names one-hot attention *without* a consistent target; when the target is a fixed
offset, that label wins and ``collapsed`` is listed in ``also``; a head one-hot on a sink key
has no mass left to collapse and is ``sink``. ``heterogeneous`` is the fallback when no rule
fires (Kovaleva's class). A new label is one ``@rule("name", rank=..., family=..., colour=...)``
function (or ``RULES.add(LabelRule(...))``) in any module: its place in the precedence, its
family, its share in ``layer_profile`` and its colour in the reports all follow from that one
entry.

Defaults (:class:`Thresholds`):

- previous / next / self: ``prev_nosink`` / ``next_nosink`` / ``self_nosink > 0.5`` (Clark),
  or a fixed-offset head (below) whose offset is -1 / +1 / 0.
- offset: ``pos_score_nosink >= 0.9`` and ``max_weight_nosink > 0.8`` (Voita) at any other
  offset; the evidence gives ``pos_offset_nosink``.
- collapsed: ``entropy_norm_nosink < 0.05`` and ``max_weight_nosink > 0.95`` (Zhai et al. give
  none; ours).
- vertical+diagonal: ``prev + self + next >= 0.3`` and ``max(special, first, sink) >= 0.3`` (our
  operationalization of Kovaleva, on the raw mass: it is the mix of the two), unless the head
  is broad (uniform rows on short inputs reach both by chance). Family ``local``.
- block: ``block >= 0.8`` and no positional rule fires.
- induction / duplicate: ``rep_induction`` or ``rep_induction_ahead`` / ``rep_duplicate`` or
  ``rep_duplicate_ahead > 0.4`` (repeated random tokens, §11.5), the evidence e.g.
  ``"rep_induction=0.95 > 0.4"``. The probe is the controlled experiment, so when the table
  has it, it decides. Without it (``classify(stored_maps)``, ``census(..., repeated=False)``)
  the rules read the corpus' own ``induction`` / ``induction_ahead`` / ``duplicate`` /
  ``duplicate_ahead`` mass, measured on the query rows that hold an earlier (later) copy of
  their token, when at least ``min_copy_rows`` (20) such rows back it (``induction_rows`` ...)
  and the head is not all sink (``min_rest``); the evidence says so:
  ``"induction=0.82 > 0.4 over 412 rows"``. A corpus score that passes on fewer rows does not
  fire, and the head's evidence says why (``"...; not induction: induction=0.9 > 0.4 over 3
  rows, fewer than min_copy_rows=20"``).
- retrieval: ``retrieval > 0.1`` when the table has a ``retrieval`` column (Wu et al. 2024:
  the share of copy steps whose most attended key is the token being copied).
- broad ("uniform collapse"): ``entropy_norm_nosink >= 0.78`` and
  ``max_weight_nosink <= max(0.1, 3.0 * chance_weight_nosink)``. The 0.1 is Clark's "at most
  10% of the mass on any word" (with 0.78 the length-free form of his 3.8 nats at n≈128). On
  short inputs a *uniform* row already puts ``1/n > 0.1`` on every key (n=8: 0.125), so a
  fixed 0.1 would never call it broad; allowing up to ``broad_max_ratio`` times the uniform
  row's maximum (``chance_weight``) keeps the rule meaningful there, and changes nothing once
  ``chance_weight <= 1/30`` (bidirectional inputs of 30+ tokens; causal rows see fewer keys,
  so their ``chance_weight`` is larger). Without a chance column the bound is 0.1.
- syntactic: ``syntax_margin >= 0.10`` (10 points over the offset baseline) and
  ``syntax_count >= 20``.
- sink: ``sink > 0.6`` (Clark's special-token threshold, on the mass of every sink key); the
  evidence adds the largest of ``first``, ``bos``, ``cls``, ``column_sink``.
"""

from __future__ import annotations

from dataclasses import dataclass

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
    sink_free,
)
from attnprobe.heads.label_tables import (
    INDEX_COLUMNS,
    RESULT_COLUMNS,
    classify_row,
    classify_scores,
    label_counts,
    layer_profile,
)

__all__ = ["FALLBACK", "INDEX_COLUMNS", "PRECEDENCE", "RESULT_COLUMNS", "RULES",  # noqa: F822
           "LabelRule", "Thresholds", "classify_row", "classify_scores", "label_counts",
           "layer_profile", "rule"]

def __getattr__(name: str) -> tuple[str, ...]:
    # PRECEDENCE is derived from RULES on every read (not a copy taken at import), so a rule
    # registered later has its place in it.
    if name == "PRECEDENCE":
        return RULES.precedence()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- rules: rank = place in the precedence (gaps of 10 leave room), family, colour ----------

@dataclass(frozen=True)
class Positional:
    """Sink-free mass above ``positional_mass`` at ``column``, or a fixed-offset head at
    ``offset``."""

    column: str
    offset: int

    def __call__(self, row: Row, t: Thresholds) -> str | None:
        if not sink_free(row, t):
            return None
        evidence = all_hold(row, (f"{self.column}_nosink", ">", t.positional_mass))
        if evidence is not None:
            return evidence
        fixed = fixed_offset(row, t)
        return fixed[1] if fixed is not None and fixed[0] == self.offset else None


RULES.add(LabelRule("previous", Positional("prev", -1), rank=20, colour="#f28e2b",
                    family="local"))
RULES.add(LabelRule("next", Positional("next", 1), rank=30, colour="#e15759", family="local"))
RULES.add(LabelRule("self", Positional("self", 0), rank=40, colour="#76b7b2", family="local"))


@rule("offset", rank=50, family="local", colour="#59a14f")
def offset(row: Row, t: Thresholds) -> str | None:
    """Sink-free argmax at one relative offset other than -1/0/+1 (Voita's positional head)."""
    fixed = fixed_offset(row, t)
    return fixed[1] if fixed is not None and fixed[0] not in (-1, 0, 1) else None


POSITIONAL = ("previous", "next", "self", "offset")


@rule("collapsed", rank=60, family="entropy_collapse", colour="#edc948")
def collapsed(row: Row, t: Thresholds) -> str | None:
    """Nearly one-hot sink-free rows everywhere (entropy collapse, Zhai et al.)."""
    if not sink_free(row, t):
        return None
    return all_hold(row, ("entropy_norm_nosink", "<", t.collapsed_entropy_norm),
                    ("max_weight_nosink", ">", t.collapsed_max_weight))


@rule("vertical+diagonal", rank=70, family="local", colour="#b07aa1")
def vertical_diagonal(row: Row, t: Thresholds) -> str | None:
    """Kovaleva's mix: local (±1, self) mass and sink/special mass both substantial.

    A head that is broad does not count: on short inputs (causal ones above all, where row i
    sees only i + 1 keys) a uniform row already leaves over 0.3 on the diagonal and the first
    token by chance.
    """
    local = [score_of(row, name) for name in ("prev", "self", "next")]
    vertical = [(v, name) for name in ("special", "first", "sink")
                if (v := score_of(row, name)) is not None]
    if None in local or not vertical or broad(row, t) is not None:
        return None
    diagonal = sum(v for v in local if v is not None)
    value, name = max(vertical, key=lambda pair: pair[0])
    if diagonal < t.diagonal_mass or value < t.vertical_mass:
        return None
    return (f"{comparison('prev+self+next', diagonal, '>=', t.diagonal_mass)}, "
            f"{comparison(name, value, '>=', t.vertical_mass)}")


@rule("block", rank=80, family="block", colour="#ff9da7")
def block(row: Row, t: Thresholds) -> str | None:
    """Kovaleva's intra-segment block on two-segment inputs, when not explained by position."""
    evidence = all_hold(row, ("block", ">=", t.block))
    if evidence is None or any(RULES.get(label)(row, t) for label in POSITIONAL):
        return None
    return evidence


@dataclass(frozen=True)
class AnyOver:
    """Fires when any of ``columns`` is above a threshold; the evidence names the largest."""

    columns: tuple[str, ...]
    threshold: str  # name of the Thresholds field

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
    threshold: str  # name of the Thresholds field

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
RULES.add(LabelRule("induction", INDUCTION, rank=90, colour="#9c755f", family="copying",
                    held_back=INDUCTION.held_back))
RULES.add(LabelRule("retrieval", AnyOver(("retrieval",), "retrieval"), rank=95,
                    colour="#b6992d", family="copying"))
RULES.add(LabelRule("duplicate", DUPLICATE, rank=100, colour="#bab0ac", family="copying",
                    held_back=DUPLICATE.held_back))


@rule("broad", rank=110, family="uniform_collapse", colour="#86bcb6")
def broad(row: Row, t: Thresholds) -> str | None:
    """Clark's broad head, length-robust and sink-free: high normalized entropy, no key much
    above uniform."""
    if not sink_free(row, t):
        return None
    entropy = all_hold(row, ("entropy_norm_nosink", ">=", t.broad_entropy_norm))
    peak, chance = score_of(row, "max_weight_nosink"), score_of(row, "chance_weight_nosink")
    if entropy is None or peak is None:
        return None
    limit = t.broad_max_weight
    if chance is not None and t.broad_max_ratio * chance > limit:
        limit = t.broad_max_ratio * chance
        bound = (f"{number_text(limit)} ({t.broad_max_ratio:g} x "
                 f"chance_weight_nosink={number_text(chance)})")
    else:
        bound = f"{limit:g}"
    if peak > limit:
        return None
    return f"{entropy}, max_weight_nosink={number_text(peak, limit)} <= {bound}"


@rule("syntactic", rank=120, family="syntactic", colour="#d37295")
def syntactic(row: Row, t: Thresholds) -> str | None:
    """Beats the best offset baseline on a dependency relation by a margin, on enough arcs."""
    evidence = all_hold(row, ("syntax_margin", ">=", t.syntax_margin),
                        ("syntax_count", ">=", t.syntax_count))
    relation = row.get("syntax_relation")
    if evidence is None or not isinstance(relation, str) or not relation:
        return evidence
    return f"syntax_relation={relation}, {evidence}"


SINK_PARTS = ("first", "bos", "cls", "column_sink")  # named in the sink rule's evidence


@rule("sink", rank=130, family="sink", colour="#4e79a7")
def sink(row: Row, t: Thresholds) -> str | None:
    """Most of the mass on sink keys; the label only when nothing fires on the rest."""
    evidence = all_hold(row, ("sink", ">", t.sink))
    if evidence is None:
        return None
    parts = [(v, name) for name in SINK_PARTS if (v := score_of(row, name)) is not None]
    if parts:
        value, name = max(parts, key=lambda pair: pair[0])  # first of ties wins
        evidence += f", {name}={number_text(value)}"
    return evidence
