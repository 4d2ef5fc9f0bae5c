"""The machinery of head labels: :class:`LabelRule` (a rule with its rank, family, colour and
the :class:`Threshold` s it reads), the :data:`RULES` registry (which derives the precedence,
the families, the colours and the threshold defaults from the rules), the :func:`rule`
decorator, and :class:`Thresholds`, a user's values laid over the rules' defaults. The
evidence strings (``"prev_nosink=0.83 > 0.5"``) are built by
:mod:`attnprobe.heads.label_evidence`.

Every label belongs to one **family**, the coarse class people ask about; the family is part
of the label's rule, so a new label names its family in its one entry (:data:`FAMILIES`
documents the built-in ones). The families and their labels are ``RULES.families()`` and
``RULES.labels_of(family)``; the README's list of them is generated from the registry
(``make readme``).

The rules themselves, and the tables built from them, are in :mod:`attnprobe.heads.labels`.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import partial
from numbers import Real

from attnprobe.core.registry import Registry, one_of
from attnprobe.errors import InputError
from attnprobe.heads.label_evidence import (
    Row,
    all_hold,
    check_judgeable,
    comparison,
    number_text,
    score_of,
)

__all__ = ["FALLBACK", "FALLBACK_COLOUR", "FALLBACK_FAMILY", "FAMILIES", "FIXED_OFFSET",
           "MIN_REST", "RULES", "LabelRule", "Row", "Rule", "RuleRegistry", "Threshold",
           "Thresholds", "all_hold", "check_judgeable", "comparison", "fixed_offset",
           "number_text", "rule", "score_of", "sink_free"]

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
class Threshold:
    """One threshold a label rule reads, declared with the rule (:attr:`LabelRule.thresholds`).

    Attributes:
        name: the keyword that overrides it (``Thresholds(name=value)``) and the attribute the
            rule reads (``thresholds.name``).
        default: its value unless overridden (from the published head-pattern studies where
            they give one: Clark et al. 2019, Kovaleva et al. 2019).
        help: what it bounds, one line.

    Several rules may declare one threshold (e.g. ``min_rest``): they must agree on its
    default.
    """

    name: str
    default: float
    help: str

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not THRESHOLD_NAME.fullmatch(self.name) \
                or hasattr(Thresholds, self.name):
            raise InputError(f"a threshold needs a lower-case name that is not an attribute of "
                             f"Thresholds, got {self.name!r}")
        check_threshold(self.name, self.default)
        if not isinstance(self.help, str) or not self.help.strip():
            raise InputError(f"threshold {self.name} needs a help text")


THRESHOLD_NAME = re.compile(r"[a-z][a-z0-9_]*")


def check_threshold(name: str, value: object) -> None:
    """Refuse a threshold value that is not a finite real number (a bool is not one)."""
    if isinstance(value, bool) or not isinstance(value, Real) or not math.isfinite(value):
        raise InputError(f"threshold {name} must be a finite number, got {value!r}")


class Thresholds:
    """The thresholds the rules read: each rule's declared defaults
    (:meth:`RuleRegistry.thresholds`), with the values given here laid over them by name.

    ``Thresholds(positional_mass=0.4)`` changes one threshold and keeps every other default,
    also those of rules registered later. An unknown name or a value that is not a finite
    number is a one-line :class:`~attnprobe.errors.InputError`. The names, defaults and what
    each bounds: ``RULES.thresholds()`` (and the README's label precedence, generated from
    the rules).

    Example:
        >>> t = Thresholds(sink=0.5)
        >>> t.sink, t.positional_mass  # given, and a rule's default
        (0.5, 0.5)
    """

    __slots__ = ("_given",)

    def __init__(self, **given: float) -> None:
        known = RULES.declared()
        for name, value in given.items():
            if name not in known:
                raise InputError(one_of("threshold", name, list(known)))
            check_threshold(name, value)
        object.__setattr__(self, "_given", dict(given))

    def __getattr__(self, name: str) -> float:
        if name.startswith("_"):
            raise AttributeError(name)
        given = object.__getattribute__(self, "_given")
        if name in given:
            return given[name]
        declared = RULES.threshold(name)
        if declared is None:
            raise AttributeError(f"no label rule declares a threshold {name!r}")
        return declared.default

    def __setattr__(self, name: str, value: object) -> None:
        raise AttributeError("Thresholds are frozen: build new ones, e.g. t.replace(sink=0.5)")

    @property
    def given(self) -> dict[str, float]:
        """The values laid over the defaults, by name."""
        return dict(self._given)

    def values(self) -> dict[str, float]:
        """Every declared threshold's value now (given, else its rule's default)."""
        return {name: self._given.get(name, entry.default)
                for name, entry in RULES.thresholds().items()}

    def replace(self, **changes: float) -> Thresholds:
        """These thresholds with ``changes`` laid over them."""
        return Thresholds(**{**self._given, **changes})

    def __repr__(self) -> str:
        return f"Thresholds({', '.join(f'{k}={v!r}' for k, v in self._given.items())})"

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Thresholds) and self._given == other._given

    def __hash__(self) -> int:
        return hash(tuple(sorted(self._given.items())))

    def __reduce__(self) -> tuple[object, tuple[()]]:
        return partial(Thresholds, **self._given), ()


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
        thresholds: the :class:`Threshold` s the test reads, with their defaults (keyword
            only): :class:`Thresholds` lays a user's values over them.
        help: what fires the rule, one phrase for the README's precedence sentence
            (keyword only); ``{name}`` stands for the default of the rule's threshold
            ``name`` (:meth:`summary`).
    """

    label: str
    test: Rule
    rank: float
    colour: str | None = None
    family: str = field(kw_only=True)
    held_back: Rule | None = field(default=None, kw_only=True)
    thresholds: tuple[Threshold, ...] = field(default=(), kw_only=True)
    help: str = field(default="", kw_only=True)

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
        object.__setattr__(self, "thresholds", tuple(self.thresholds))
        if not all(isinstance(entry, Threshold) for entry in self.thresholds):
            raise InputError(f"label rule {self.label!r}: thresholds must be Threshold "
                             "declarations")
        if not isinstance(self.help, str):
            raise InputError(f"label rule {self.label!r}: help must be a string")
        self.summary()  # every {name} of the help is one of the rule's thresholds

    def summary(self) -> str:
        """The help with the defaults of the rule's thresholds filled in."""
        defaults = {entry.name: f"{entry.default:g}" for entry in self.thresholds}
        try:
            return self.help.format(**defaults)
        except (KeyError, IndexError, ValueError) as err:
            raise InputError(f"label rule {self.label!r}: its help names {err} but declares "
                             f"only the thresholds {', '.join(defaults) or '(none)'}") from None

    def __call__(self, row: Row, thresholds: Thresholds) -> str | None:
        return self.test(row, thresholds)


class RuleRegistry(Registry[LabelRule]):
    """The label rules. The precedence and the colours are read from the rules themselves, so
    they cannot drift from the set of labels."""

    def __init__(self, kind: str) -> None:
        super().__init__(kind)
        self._declared: dict[str, Threshold] | None = None  # thresholds(), until a change

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
            declared = self.thresholds()
            for threshold in entry.thresholds:
                known = declared.get(threshold.name)
                if known is not None and known.default != threshold.default:
                    raise InputError(f"label rule {name!r}: threshold {threshold.name} has the "
                                     f"default {known.default:g} in another rule, not "
                                     f"{threshold.default:g}")
            self._declared = None
            return add(entry)

        return checked

    def unregister(self, name: str) -> LabelRule:
        self._declared = None
        return super().unregister(name)

    def thresholds(self) -> dict[str, Threshold]:
        """Every threshold the rules declare, by name, in precedence order of the first rule
        that declares it (what :class:`Thresholds` overrides)."""
        return dict(self.declared())

    def threshold(self, name: str) -> Threshold | None:
        """The declaration of threshold ``name`` (None when no rule declares it)."""
        return self.declared().get(name)

    def declared(self) -> Mapping[str, Threshold]:
        """:meth:`thresholds` without a copy (read-only use: it is the registry's cache)."""
        if self._declared is None:
            found: dict[str, Threshold] = {}
            for entry in self.rules():
                for threshold in entry.thresholds:
                    found.setdefault(threshold.name, threshold)
            self._declared = found
        return self._declared

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


def rule(label: str, *, rank: float, family: str, colour: str | None = None,
         thresholds: Sequence[Threshold] = (), help: str = "") -> Callable[[Rule], Rule]:
    """Register the decorated test as the rule of ``label`` (with the thresholds it reads and
    its help: :class:`LabelRule`); the test is returned unchanged, so other rules can call
    it."""
    def add(test: Rule) -> Rule:
        RULES.add(LabelRule(label, test, rank, colour, family=family,
                            thresholds=tuple(thresholds), help=help))
        return test

    return add


# ---- helpers of the built-in rules ------------------------------------------------------

MIN_REST = Threshold("min_rest", 0.05, "the sink-free rules fire only when at least this share "
                     "of the mass is left after the sink keys (1 - sink): the pattern of the "
                     "last few per cent of a head that is all sink is not what the head does")
FIXED_OFFSET = (
    Threshold("offset_pos_score", 0.9, "fixed offset: pos_score_nosink (share of rows whose "
              "sink-free argmax is at the head's usual offset) at least this ..."),
    Threshold("offset_max_weight", 0.8, "... and max_weight_nosink above this"),
)


def sink_free(row: Row, t: Thresholds) -> bool:
    """Whether enough mass is left after the sink keys (``1 - sink >= min_rest``) for the
    sink-free rules to read the ``*_nosink`` scores; True when the table has no ``sink``. A
    rule that calls it declares :data:`MIN_REST`."""
    sink = score_of(row, "sink")
    return sink is None or 1.0 - sink >= t.min_rest


def fixed_offset(row: Row, t: Thresholds) -> tuple[int, str] | None:
    """``(offset, evidence)`` for a head whose sink-free argmax sits at one relative offset,
    else None. A rule that calls it declares :data:`MIN_REST` and :data:`FIXED_OFFSET`."""
    offset = score_of(row, "pos_offset_nosink")
    evidence = all_hold(row, ("pos_score_nosink", ">=", t.offset_pos_score),
                        ("max_weight_nosink", ">", t.offset_max_weight))
    if offset is None or evidence is None or not sink_free(row, t):
        return None
    shift = round(offset)
    return shift, f"pos_offset_nosink={f'{shift:+d}' if shift else '0'}, {evidence}"
