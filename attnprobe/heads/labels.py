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
order, read from the registry (so a rule registered later has its place in it too); the
README's precedence sentence is generated from the rules (``make readme``).

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
fires (Kovaleva's class). A new label is one ``@rule("name", rank=..., family=..., colour=...,
thresholds=..., help=...)`` function (or ``RULES.add(LabelRule(...))``) in one module of this
package (discovered: :func:`discover_rules`): its place in the precedence, its family, its
thresholds, its share in ``layer_profile``, its colour in the reports and its README entry all
follow from that one entry.

Thresholds are declared with the rules that read them (:class:`~attnprobe.heads.label_rules.
Threshold`: name, default, help; ``RULES.thresholds()`` lists them) and overridden by name
(``Thresholds(positional_mass=0.4)``). What each rule reads:

- previous / next / self: ``prev_nosink`` / ``next_nosink`` / ``self_nosink`` (Clark), or a
  fixed-offset head (below) whose offset is -1 / +1 / 0.
- offset: ``pos_score_nosink`` and ``max_weight_nosink`` (Voita) at any other offset; the
  evidence gives ``pos_offset_nosink``.
- collapsed: ``entropy_norm_nosink`` and ``max_weight_nosink`` (Zhai et al. give no
  thresholds; ours).
- vertical+diagonal: ``prev + self + next`` and ``max(special, first, sink)`` (our
  operationalization of Kovaleva, on the raw mass: it is the mix of the two), unless the head
  is broad (uniform rows on short inputs reach both by chance). Family ``local``.
- block: ``block``, when no positional rule fires.
- induction / duplicate: ``rep_induction`` or ``rep_induction_ahead`` / ``rep_duplicate`` or
  ``rep_duplicate_ahead`` (repeated random tokens, §11.5), the evidence e.g.
  ``"rep_induction=0.95 > 0.4"``. The probe is the controlled experiment, so when the table
  has it, it decides. Without it (``classify(stored_maps)``, ``census(..., repeated=False)``)
  the rules read the corpus' own ``induction`` / ``induction_ahead`` / ``duplicate`` /
  ``duplicate_ahead`` mass, measured on the query rows that hold an earlier (later) copy of
  their token, when at least ``min_copy_rows`` such rows back it (``induction_rows`` ...)
  and the head is not all sink (``min_rest``); the evidence says so:
  ``"induction=0.82 > 0.4 over 412 rows"``. A corpus score that passes on fewer rows does not
  fire, and the head's evidence says why (``"...; not induction: induction=0.9 > 0.4 over 3
  rows, fewer than min_copy_rows=20"``).
- retrieval: ``retrieval`` when the table has that column (Wu et al. 2024: the share of copy
  steps whose most attended key is the token being copied; a retrieval head above 0.1).
- broad ("uniform collapse"): ``entropy_norm_nosink`` high and ``max_weight_nosink`` at most
  ``max(broad_max_weight, broad_max_ratio * chance_weight_nosink)``. The 0.1 default is Clark's
  "at most 10% of the mass on any word" (with 0.78 the length-free form of his 3.8 nats at
  n≈128). On short inputs a *uniform* row already puts ``1/n > 0.1`` on every key (n=8:
  0.125), so a fixed 0.1 would never call it broad; allowing up to ``broad_max_ratio`` times
  the uniform row's maximum (``chance_weight``) keeps the rule meaningful there, and changes
  nothing once ``chance_weight <= 1/30`` (bidirectional inputs of 30+ tokens; causal rows see
  fewer keys, so their ``chance_weight`` is larger). Without a chance column the bound is
  ``broad_max_weight``.
- syntactic: ``syntax_margin`` (points over the offset baseline) on ``syntax_count`` arcs.
- sink: ``sink`` (Clark's special-token threshold, on the mass of every sink key); the
  evidence adds the largest of ``first``, ``bos``, ``cls``, ``column_sink``.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import ModuleType

from attnprobe.core.plugins import import_modules
from attnprobe.heads.label_rules import (
    FALLBACK,
    FIXED_OFFSET,
    MIN_REST,
    RULES,
    LabelRule,
    Row,
    Threshold,
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
           "LabelRule", "Threshold", "Thresholds", "classify_row", "classify_scores",
           "discover_rules", "label_counts", "layer_profile", "rule"]

def __getattr__(name: str) -> tuple[str, ...]:
    # PRECEDENCE is derived from RULES on every read (not a copy taken at import), so a rule
    # registered later has its place in it.
    if name == "PRECEDENCE":
        return RULES.precedence()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# ---- thresholds several rules read (min_rest and the fixed offset's: label_rules) -----------

POSITIONAL_MASS = Threshold("positional_mass", 0.5, "previous / next / self: prev_nosink / "
                            "next_nosink / self_nosink above this")
BROAD = (
    Threshold("broad_entropy_norm", 0.78, "broad: entropy_norm_nosink at least this ..."),
    Threshold("broad_max_weight", 0.1, "... and max_weight_nosink at most the larger of this "
              "(Clark's 10%) ..."),
    Threshold("broad_max_ratio", 3.0, "... and this times chance_weight_nosink (short "
              "inputs)"),
)


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


POSITIONAL_THRESHOLDS = (MIN_REST, POSITIONAL_MASS, *FIXED_OFFSET)
RULES.add(LabelRule("previous", Positional("prev", -1), rank=20, colour="#f28e2b",
                    family="local", thresholds=POSITIONAL_THRESHOLDS,
                    help="sink-free mass on the previous token > {positional_mass}, or a "
                         "fixed-offset head at -1"))
RULES.add(LabelRule("next", Positional("next", 1), rank=30, colour="#e15759", family="local",
                    thresholds=POSITIONAL_THRESHOLDS,
                    help="sink-free mass on the next token > {positional_mass}, or a "
                         "fixed-offset head at +1"))
RULES.add(LabelRule("self", Positional("self", 0), rank=40, colour="#76b7b2", family="local",
                    thresholds=POSITIONAL_THRESHOLDS,
                    help="sink-free mass on the token itself > {positional_mass}, or a "
                         "fixed-offset head at 0"))


@rule("offset", rank=50, family="local", colour="#59a14f", thresholds=(MIN_REST, *FIXED_OFFSET),
      help="sink-free argmax at one other offset in ≥ {offset_pos_score} of the rows, max "
           "weight > {offset_max_weight}")
def offset(row: Row, t: Thresholds) -> str | None:
    """Sink-free argmax at one relative offset other than -1/0/+1 (Voita's positional head)."""
    fixed = fixed_offset(row, t)
    return fixed[1] if fixed is not None and fixed[0] not in (-1, 0, 1) else None


POSITIONAL = ("previous", "next", "self", "offset")


@rule("collapsed", rank=60, family="entropy_collapse", colour="#edc948",
      thresholds=(MIN_REST,
                  Threshold("collapsed_entropy_norm", 0.05, "collapsed: entropy_norm_nosink "
                            "below this ..."),
                  Threshold("collapsed_max_weight", 0.95, "... and max_weight_nosink above "
                            "this")),
      help="sink-free normalised entropy < {collapsed_entropy_norm}, max weight > "
           "{collapsed_max_weight}")
def collapsed(row: Row, t: Thresholds) -> str | None:
    """Nearly one-hot sink-free rows everywhere (entropy collapse, Zhai et al.)."""
    if not sink_free(row, t):
        return None
    return all_hold(row, ("entropy_norm_nosink", "<", t.collapsed_entropy_norm),
                    ("max_weight_nosink", ">", t.collapsed_max_weight))


@rule("vertical+diagonal", rank=70, family="local", colour="#b07aa1",
      thresholds=(Threshold("diagonal_mass", 0.3, "vertical+diagonal: prev + self + next at "
                            "least this ..."),
                  Threshold("vertical_mass", 0.3, "... and max(special, first, sink) at least "
                            "this"),
                  MIN_REST, *BROAD),
      help="±1/self mass ≥ {diagonal_mass} and special/first/sink mass ≥ {vertical_mass}, "
           "not broad")
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


@rule("block", rank=80, family="block", colour="#ff9da7",
      thresholds=(Threshold("block", 0.8, "block: same-segment mass at least this (and no "
                            "positional rule fires)"), *POSITIONAL_THRESHOLDS),
      help="same-segment mass ≥ {block}, not positional")
def block(row: Row, t: Thresholds) -> str | None:
    """Kovaleva's intra-segment block on two-segment inputs, when not explained by position."""
    evidence = all_hold(row, ("block", ">=", t.block))
    if evidence is None or any(RULES.get(label)(row, t) for label in POSITIONAL):
        return None
    return evidence


@rule("broad", rank=110, family="uniform_collapse", colour="#86bcb6",
      thresholds=(MIN_REST, *BROAD),
      help="uniform collapse: sink-free normalised entropy ≥ {broad_entropy_norm} and max "
           "weight ≤ max({broad_max_weight}, {broad_max_ratio} × chance)")
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


@rule("syntactic", rank=120, family="syntactic", colour="#d37295",
      thresholds=(Threshold("syntax_margin", 0.10, "syntactic: accuracy minus the best offset "
                            "baseline at least this ..."),
                  Threshold("syntax_count", 20, "... on at least this many dependency arcs")),
      help="≥ {syntax_margin} over the offset baseline on ≥ {syntax_count} arcs")
def syntactic(row: Row, t: Thresholds) -> str | None:
    """Beats the best offset baseline on a dependency relation by a margin, on enough arcs."""
    evidence = all_hold(row, ("syntax_margin", ">=", t.syntax_margin),
                        ("syntax_count", ">=", t.syntax_count))
    relation = row.get("syntax_relation")
    if evidence is None or not isinstance(relation, str) or not relation:
        return evidence
    return f"syntax_relation={relation}, {evidence}"


SINK_PARTS = ("first", "bos", "cls", "column_sink")  # named in the sink rule's evidence


@rule("sink", rank=130, family="sink", colour="#4e79a7",
      thresholds=(Threshold("sink", 0.6, "sink: sink (mass on the sink keys) above this"),),
      help="sink mass > {sink}")
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


def discover_rules() -> list[ModuleType]:
    """Import every rule module of :mod:`attnprobe.heads.rules` (those already imported are
    kept): each registers its rules, with their thresholds, on import.

    Example:
        >>> "attnprobe.heads.rules.copying" in [m.__name__ for m in discover_rules()]
        True
    """
    return import_modules("attnprobe.heads.rules")


discover_rules()
