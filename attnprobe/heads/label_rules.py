"""The machinery of head labels: :class:`Thresholds`, :class:`LabelRule` and the :data:`RULES`
registry (which derives the precedence and the colours from the rules), the :func:`rule`
decorator, and the helpers that turn scores into evidence strings (``"prev=0.83 > 0.5"``).

The rules themselves, and the tables built from them, are in :mod:`attnprobe.heads.labels`.
"""

from __future__ import annotations

import math
import operator
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields
from numbers import Real

from attnprobe.core.registry import Registry
from attnprobe.errors import InputError

__all__ = ["FALLBACK", "FALLBACK_COLOUR", "RULES", "LabelRule", "Row", "Rule", "RuleRegistry",
           "Thresholds", "all_hold", "comparison", "fixed_offset", "number_text", "rule",
           "score_of"]

FALLBACK = "heterogeneous"  # the label when no rule fires: last in the precedence
FALLBACK_COLOUR = "#555555"


@dataclass(frozen=True)
class Thresholds:
    """Every threshold of the rules (module docstring); defaults from methods.md §13.

    Attributes:
        collapsed_entropy_norm: collapsed: ``entropy_norm`` below this ...
        collapsed_max_weight: ... and ``max_weight`` above this.
        sink: sink: any of ``cls, sep, bos, eos, first, punct, special`` above this.
        positional_mass: previous / next / self: ``prev`` / ``next`` / ``self`` above this.
        offset_pos_score: fixed offset: ``pos_score`` at least this ...
        offset_max_weight: ... and ``max_weight`` above this.
        diagonal_mass: vertical+diagonal: ``prev + self + next`` at least this ...
        vertical_mass: ... and ``max(special, first)`` at least this.
        block: block: same-segment mass at least this (and no positional rule fires).
        induction: induction: ``rep_induction`` or ``rep_induction_ahead`` above this.
        duplicate: duplicate: ``rep_duplicate`` or ``rep_duplicate_ahead`` above this.
        broad_entropy_norm: broad: ``entropy_norm`` at least this ...
        broad_max_weight: ... and ``max_weight`` at most the larger of this (Clark's 10%) ...
        broad_max_ratio: ... and this times ``chance_weight`` (short inputs, see above).
        syntax_margin: syntactic: accuracy minus the best offset baseline at least this ...
        syntax_count: ... on at least this many dependency arcs.
    """

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
    duplicate: float = 0.4
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
    """One head label with all it needs: the test that fires it, its rank, its colour.

    Attributes:
        label: the name written in the ``label`` column.
        test: ``test(row, thresholds) -> evidence | None`` (module docstring).
        rank: its place in the precedence: of the rules that fire, the lowest rank is the
            label and the others go to ``also``. No two rules share a rank.
        colour: ``#rrggbb`` of the label in reports; None leaves it to the report's fallback.
    """

    label: str
    test: Rule
    rank: float
    colour: str | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.label, str) or not self.label.strip():
            raise InputError(f"a label rule needs a non-empty label, got {self.label!r}")
        if not callable(self.test):
            raise InputError(f"label rule {self.label!r}: test must be callable")
        if isinstance(self.rank, bool) or not isinstance(self.rank, Real) \
                or not math.isfinite(self.rank):
            raise InputError(f"label rule {self.label!r}: rank must be a finite number, "
                             f"got {self.rank!r}")
        if self.colour is not None and (not isinstance(self.colour, str)
                                        or not HEX_COLOUR.fullmatch(self.colour)):
            raise InputError(f"label rule {self.label!r}: colour must be '#rrggbb', "
                             f"got {self.colour!r}")

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


RULES = RuleRegistry("head rule")


def rule(label: str, *, rank: float, colour: str | None = None) -> Callable[[Rule], Rule]:
    """Register the decorated test as the rule of ``label``; the test is returned unchanged,
    so other rules can call it."""
    def add(test: Rule) -> Rule:
        RULES.add(LabelRule(label, test, rank, colour))
        return test

    return add


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


def fixed_offset(row: Row, t: Thresholds) -> tuple[int, str] | None:
    """``(offset, evidence)`` for a head whose argmax sits at one relative offset, else None."""
    offset = score_of(row, "pos_offset")
    evidence = all_hold(row, ("pos_score", ">=", t.offset_pos_score),
                    ("max_weight", ">", t.offset_max_weight))
    if offset is None or evidence is None:
        return None
    shift = round(offset)
    return shift, f"pos_offset={f'{shift:+d}' if shift else '0'}, {evidence}"
