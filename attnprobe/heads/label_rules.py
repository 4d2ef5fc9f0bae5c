"""The machinery of head labels: :class:`Thresholds`, :class:`LabelRule` and the :data:`RULES`
registry (which derives the precedence, the families and the colours from the rules), the
:func:`rule` decorator, and the helpers that turn scores into evidence strings
(``"prev_nosink=0.83 > 0.5"``).

Every label belongs to one **family**, the coarse class people ask about; the family is part
of the label's rule, so a new label names its family in its one entry. The families of the
built-in labels (:data:`FAMILIES` documents each):

=================  ============================================================
family             labels
=================  ============================================================
local              previous, next, self, offset, vertical+diagonal
entropy_collapse   collapsed
block              block
copying            induction, retrieval, duplicate
uniform_collapse   broad
syntactic          syntactic
sink               sink
heterogeneous      heterogeneous (the fallback)
=================  ============================================================

The rules themselves, and the tables built from them, are in :mod:`attnprobe.heads.labels`.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields
from numbers import Real

from attnprobe.core.registry import Registry
from attnprobe.errors import InputError

__all__ = ["FALLBACK", "FALLBACK_COLOUR", "FALLBACK_FAMILY", "FAMILIES", "RULES", "LabelRule",
           "Row", "Rule", "RuleRegistry", "Thresholds", "all_hold", "check_judgeable",
           "comparison", "fixed_offset", "number_text", "rule", "score_of", "sink_free"]

FALLBACK = "heterogeneous"  # the label when no rule fires: last in the precedence
FALLBACK_COLOUR = "#555555"
FALLBACK_FAMILY = "heterogeneous"
FAMILIES = {  # what each built-in family means (a rule may name a new one)
    "local": "looks at a fixed relative position (previous, next, self, an offset)",
    "entropy_collapse": "one-hot rows without a consistent target (Zhai et al.)",
    "block": "stays inside its own segment of a sentence pair (Kovaleva et al.)",
    "copying": "looks at earlier copies of the token or what followed them (induction, "
               "duplicate, retrieval heads)",
    "uniform_collapse": "spreads its mass evenly (Clark et al.'s broad heads)",
    "syntactic": "finds a dependency relation better than any fixed offset",
    "sink": "puts its mass on sink keys (first token, BOS/CLS, a column) and nothing else "
            "fires on the rest",
    FALLBACK_FAMILY: "no rule fired (Kovaleva et al.'s heterogeneous class)",
}
FAMILY_NAME = re.compile(r"[a-z][a-z0-9_]*")

@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the rules (module docstring); defaults from the
    published head-pattern studies (Clark et al. 2019; Kovaleva et al. 2019).

    The sink-free rules (previous, next, self, offset, collapsed, broad, and the copying
    rules on corpus evidence) read the ``*_nosink`` scores or need ``min_rest``: the head is
    judged on the mass left after its sink keys.

    Attributes:
        min_rest: the sink-free rules fire only when at least this share of the mass is left
            after the sink keys (``1 - sink``): the pattern of the last few per cent of a
            head that is all sink is not what the head does.
        collapsed_entropy_norm: collapsed: ``entropy_norm_nosink`` below this ...
        collapsed_max_weight: ... and ``max_weight_nosink`` above this.
        sink: sink: ``sink`` (mass on the sink keys) above this.
        positional_mass: previous / next / self: ``prev_nosink`` / ``next_nosink`` /
            ``self_nosink`` above this.
        offset_pos_score: fixed offset: ``pos_score_nosink`` at least this ...
        offset_max_weight: ... and ``max_weight_nosink`` above this.
        diagonal_mass: vertical+diagonal: ``prev + self + next`` at least this ...
        vertical_mass: ... and ``max(special, first, sink)`` at least this.
        block: block: same-segment mass at least this (and no positional rule fires).
        induction: induction: ``rep_induction`` or ``rep_induction_ahead`` above this; without
            the probe, the corpus' ``induction`` or ``induction_ahead``.
        retrieval: retrieval: ``retrieval`` above this (Wu et al. 2024 call a head a
            retrieval head above 0.1).
        duplicate: duplicate: ``rep_duplicate`` or ``rep_duplicate_ahead`` above this; without
            the probe, the corpus' ``duplicate`` or ``duplicate_ahead``.
        min_copy_rows: the corpus' copying scores count only when measured on at least this
            many query rows that hold an earlier (``_ahead``: later) copy of their token
            (``induction_rows`` ...): a mean over a handful of chance repeats says little.
        broad_entropy_norm: broad: ``entropy_norm_nosink`` at least this ...
        broad_max_weight: ... and ``max_weight_nosink`` at most the larger of this (Clark's
            10%) ...
        broad_max_ratio: ... and this times ``chance_weight_nosink`` (short inputs).
        syntax_margin: syntactic: accuracy minus the best offset baseline at least this ...
        syntax_count: ... on at least this many dependency arcs.
    """

    min_rest: float = 0.05
    collapsed_entropy_norm: float = 0.05
    collapsed_max_weight: float = 0.95
    sink: float = 0.6
    positional_mass: float = 0.5
    offset_pos_score: float = 0.9
    offset_max_weight: float = 0.8
    diagonal_mass: float = 0.3
    vertical_mass: float = 0.3
    block: float = 0.8
    induction: float = 0.4
    retrieval: float = 0.1
    duplicate: float = 0.4
    min_copy_rows: float = 20
    broad_entropy_norm: float = 0.78
    broad_max_weight: float = 0.1
    broad_max_ratio: float = 3.0
    syntax_margin: float = 0.10
    syntax_count: float = 20

    def __post_init__(self) -> None:
        for f in fields(self):
            value = getattr(self, f.name)
            if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
                raise InputError(f"threshold {f.name} must be a finite number, got {value!r}")


Row = Mapping[str, object]
Rule = Callable[[Row, Thresholds], str | None]
HEX_COLOUR = re.compile(r"#[0-9a-fA-F]{6}")


@dataclass(frozen=True)
class LabelRule:
    """One head label with all it needs: the test that fires it, its rank, its family and its
    colour.

    Attributes:
        label: the name written in the ``label`` column.
        test: ``test(row, thresholds) -> evidence | None`` (module docstring).
        rank: its place in the precedence: of the rules that fire, the lowest rank is the
            label and the others go to ``also``. No two rules share a rank.
        colour: ``#rrggbb`` of the label in reports; None leaves it to the report's fallback.
        family: the coarse class written in the ``family`` column (keyword only; one of
            :data:`FAMILIES` or a new lower-case name).
        held_back: optional ``held_back(row, thresholds) -> note | None`` (keyword only):
            why the rule did not fire although its score passed (e.g. too few rows to
            trust it). The notes of rules ranked before the winning label are added to the
            evidence, so a head that is not ``induction`` says why.
    """

    label: str
    test: Rule
    rank: float
    colour: str | None = None
    family: str = field(kw_only=True)
    held_back: Rule | None = field(default=None, kw_only=True)

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label.strip():
            raise InputError(f"a label rule needs a non-empty label, got {self.label!r}")
        if not callable(self.test):
            raise InputError(f"label rule {self.label!r}: test must be callable")
        if self.held_back is not None and not callable(self.held_back):
            raise InputError(f"label rule {self.label!r}: held_back must be callable or None")
        if isinstance(self.rank, bool) or not isinstance(self.rank, Real) \
                or not math.isfinite(self.rank):
            raise InputError(f"label rule {self.label!r}: rank must be a finite number, "
                             f"got {self.rank!r}")
        if self.colour is not None and (not isinstance(self.colour, str)
                                        or not HEX_COLOUR.fullmatch(self.colour)):
            raise InputError(f"label rule {self.label!r}: colour must be '#rrggbb', "
                             f"got {self.colour!r}")
        if not isinstance(self.family, str) or not FAMILY_NAME.fullmatch(self.family):
            raise InputError(f"label rule {self.label!r}: family must be a lower-case name "
                             f"such as {', '.join(list(FAMILIES)[:3])}, got {self.family!r}")

    def __call__(self, row: Row, thresholds: Thresholds) -> str | None:
        return self.test(row, thresholds)


class RuleRegistry(Registry[LabelRule]):
    """The label rules. The precedence and the colours are read from the rules themselves, so
    they cannot drift from the set of labels."""

    def register(self, name: str) -> Callable[[LabelRule], LabelRule]:
        add = super().register(name)

        def checked(entry: LabelRule) -> LabelRule:
            if not isinstance(entry, LabelRule) or entry.label != name:
                raise InputError(f"register {name!r} with a LabelRule labelled {name!r}")
            if name == FALLBACK or name in self:
                raise InputError(f"label {name!r} is already "
                                 f"{'the fallback' if name == FALLBACK else 'registered'}")
            taken = [r.label for r in self.rules() if r.rank == entry.rank]
            if taken:
                raise InputError(f"label rule {name!r}: rank {entry.rank:g} is taken by "
                                 f"{taken[0]!r}; choose a free rank")
            return add(entry)

        return checked

    def add(self, entry: LabelRule) -> LabelRule:
        """Register ``entry`` under its label."""
        return self.register(entry.label)(entry)

    def remove(self, label: str) -> LabelRule:
        """Unregister the rule of ``label`` (e.g. a rule a test added); returns it."""
        return self.unregister(label)

    def rules(self) -> list[LabelRule]:
        """Every rule, in precedence order (lowest rank first)."""
        return sorted((self.get(name) for name in self.names()), key=lambda r: r.rank)

    def precedence(self) -> tuple[str, ...]:
        """Every label in precedence order, the fallback last."""
        return (*(r.label for r in self.rules()), FALLBACK)

    def colour(self, label: str) -> str | None:
        """The colour of ``label`` (None for an unknown label or a rule without one)."""
        if label == FALLBACK:
            return FALLBACK_COLOUR
        return self.get(label).colour if label in self else None

    def family(self, label: str) -> str | None:
        """The family of ``label`` (None for a label no rule knows)."""
        if label == FALLBACK:
            return FALLBACK_FAMILY
        return self.get(label).family if label in self else None

    def families(self) -> tuple[str, ...]:
        """Every family, ordered by its first label in the precedence; the fallback's last."""
        found = dict.fromkeys(r.family for r in self.rules() if r.family != FALLBACK_FAMILY)
        return (*found, FALLBACK_FAMILY)

    def labels_of(self, family: str) -> tuple[str, ...]:
        """The labels of ``family``, in precedence order."""
        return tuple(label for label in self.precedence() if self.family(label) == family)


RULES = RuleRegistry("head rule")


def rule(label: str, *, rank: float, family: str, colour: str | None = None
         ) -> Callable[[Rule], Rule]:
    """Register the decorated test as the rule of ``label``; the test is returned unchanged,
    so other rules can call it."""
    def add(test: Rule) -> Rule:
        RULES.add(LabelRule(label, test, rank, colour, family=family))
        return test

    return add


# ---- what the rules can judge -------------------------------------------------------------

# The mean over the rows that may see two keys or more (heads/stats/rows.py): NaN when no row
# of the corpus does.
SEVERAL_KEYS = "entropy_norm"


def check_judgeable(rows: Sequence[Row]) -> None:
    """Refuse a table in which no head saw a row with more than one key (a corpus of one-token
    texts: 1 x 1 maps). Every head then puts its whole weight on the lone key, which every rule
    would read as a sink or a one-hot pattern: there is nothing to tell the heads apart by.
    Tables without the ``entropy_norm`` column are not checked."""
    if not rows or any(SEVERAL_KEYS not in row for row in rows):
        return
    if all(score_of(row, SEVERAL_KEYS) is None for row in rows):
        raise InputError("no attention row of the corpus sees more than one key (every text "
                         "is one token: 1 x 1 maps), so the heads cannot be told apart "
                         f"({SEVERAL_KEYS} is NaN for every head); give texts of two tokens "
                         "or more")


# ---- evidence helpers ---------------------------------------------------------------------

def score_of(row: Row, name: str) -> float | None:
    """The score as a float, or None when it is missing or not finite."""
    value = row.get(name)
    if value is None:
        return None
    try:
        value = float(value)  # type: ignore[arg-type]
    except (TypeError, ValueError):
        return None
    return value if math.isfinite(value) else None


def number_text(value: float, other: float | None = None) -> str:
    """Short form of a number: 3 significant digits, more when needed to differ from ``other``."""
    if float(value).is_integer() and abs(value) < 1e6:
        return str(int(value))
    for digits in range(3, 8):
        text = f"{value:.{digits}g}"
        if other is None or text != f"{other:g}":
            return text
    return text


def comparison(name: str, value: float, op: str, threshold: float) -> str:
    """``"prev=0.83 > 0.5"``."""
    return f"{name}={number_text(value, threshold)} {op} {threshold:g}"


OPERATORS: dict[str, Callable[[float, float], bool]] = {
    ">": operator.gt, ">=": operator.ge, "<": operator.lt, "<=": operator.le}


def all_hold(row: Row, *tests: tuple[str, str, float]) -> str | None:
    """Evidence when every ``(column, op, threshold)`` holds, else None."""
    parts = []
    for name, op, threshold in tests:
        value = score_of(row, name)
        if value is None or not OPERATORS[op](value, threshold):
            return None
        parts.append(comparison(name, value, op, threshold))
    return ", ".join(parts)


def sink_free(row: Row, t: Thresholds) -> bool:
    """Whether enough mass is left after the sink keys (``1 - sink >= min_rest``) for the
    sink-free rules to read the ``*_nosink`` scores; True when the table has no ``sink``."""
    sink = score_of(row, "sink")
    return sink is None or 1.0 - sink >= t.min_rest


def fixed_offset(row: Row, t: Thresholds) -> tuple[int, str] | None:
    """``(offset, evidence)`` for a head whose sink-free argmax sits at one relative offset,
    else None."""
    offset = score_of(row, "pos_offset_nosink")
    evidence = all_hold(row, ("pos_score_nosink", ">=", t.offset_pos_score),
                        ("max_weight_nosink", ">", t.offset_max_weight))
    if offset is None or evidence is None or not sink_free(row, t):
        return None
    shift = round(offset)
    return shift, f"pos_offset_nosink={f'{shift:+d}' if shift else '0'}, {evidence}"
