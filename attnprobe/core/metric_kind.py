"""The registry of metric kinds: what the text before a spec's colon names.

Each kind is one :class:`MetricKind` registered in :data:`METRIC_KINDS` by a module of
:mod:`attnprobe.core.metric_kinds` (discovered, ordered by its ``RANK``): its builder, the
forms a spec writes it in, its help line and example, and whether it reads the input's own
next token. A new kind is one module there; :func:`~attnprobe.core.metric.parse_metric`,
the ``--metric`` help of ``attnprobe patch`` / ``perturb`` (:func:`metric_help`) and the
README's metric table (``make readme``) follow.

Example:
    >>> [k.name for k in metric_kinds()][:3]
    ['logit', 'prob', 'logprob']
    >>> kind_of("logit_diff: Paris, Rome")
    (MetricKind('logit_diff'), ' Paris, Rome')
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from attnprobe.core.metric_base import Metric
from attnprobe.core.plugins import discover
from attnprobe.core.positions import Positions
from attnprobe.core.registry import Registry

__all__ = ["KINDS_PACKAGE", "METRIC_KINDS", "Builder", "MetricKind", "PairsBuilder",
           "kind_of", "metric_forms", "metric_help", "metric_kind", "metric_kinds"]

KINDS_PACKAGE = "attnprobe.core.metric_kinds"

# (argument after the colon, tokenizer, positions, examples or None) -> Metric
Builder = Callable[[str, Any, Positions, int | None], Metric]
# (one (correct, wrong) pair per example, tokenizer, positions) -> Metric
PairsBuilder = Callable[[Sequence[tuple[Any, Any]], Any, Positions], Metric]


def _never(argument: str) -> bool:
    return False


@dataclass(frozen=True)
class MetricKind:
    """One kind of metric spec.

    Attributes:
        name: the text before the colon (``logit_diff``), lower case.
        build: ``(argument, tokenizer, positions, n) -> Metric``; ``argument`` is the text
            after the colon (``""`` without one).
        forms: how specs write it, for help and tables (``("logit_diff:A,B",)``).
        help: the number it gives per example, one line.
        example: one spec of this kind that works on the reference models.
        rank: its place in help and tables (increasing).
        reads_next: ``argument -> bool``: whether the spec reads the input's own next token
            (its default positions are then every position whose next token is real).
        pairs: for kinds that also take one ``(A, B)`` pair per example from Python.
    """

    name: str
    build: Builder = field(repr=False)
    forms: tuple[str, ...]
    help: str
    example: str
    rank: int
    reads_next: Callable[[str], bool] = field(default=_never, repr=False)
    pairs: PairsBuilder | None = field(default=None, repr=False)

    def __repr__(self) -> str:
        return f"MetricKind({self.name!r})"


METRIC_KINDS: Registry[MetricKind] = Registry("metric kind")


def metric_kind(kind: MetricKind) -> MetricKind:
    """Register ``kind`` (a kind module calls this at import)."""
    return METRIC_KINDS.register(kind.name)(kind)


def metric_kinds() -> list[MetricKind]:
    """Every registered kind in rank order, the modules of :data:`KINDS_PACKAGE` imported
    first (Python imports each once, so this is cheap after the first call)."""
    discover(KINDS_PACKAGE)
    return sorted(METRIC_KINDS.values(), key=lambda k: (k.rank, k.name))


def kind_of(spec: str) -> tuple[MetricKind | None, str]:
    """The kind a spec string names (None when none is registered) and its argument."""
    name, _, argument = spec.strip().partition(":")
    name = name.strip().lower()
    known = {k.name: k for k in metric_kinds()}
    return known.get(name), argument


def metric_forms() -> str:
    """Every kind's forms, comma separated, in rank order (``logit:T, prob:T, ...``)."""
    return ", ".join(form for kind in metric_kinds() for form in kind.forms)


def metric_help(default: str | None = None) -> str:
    """The ``--metric`` help line of a command: ``default`` (what the command measures
    without a spec), then every kind's forms."""
    lead = f"{default}, or " if default else "what is measured: "
    return lead + metric_forms()
