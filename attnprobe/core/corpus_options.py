"""The corpus options every corpus analysis shares, as one object.

Every analysis that reads a corpus (the census, capture, attribution, perturbation, patching,
logit attribution, the report) takes the corpus signature ``(model, tokenizer, texts, ...)``
plus its own options plus one :class:`CorpusOptions`: which heads, how many texts per forward,
how long a text may be, a progress bar, sharding over ``torch.distributed`` ranks, a cost
budget and a seed. A wrapper hands its ``CorpusOptions`` on instead of re-listing these
keywords, so a new corpus option is one field here.

Each analysis still accepts the fields as keywords (``census(model, tok, texts,
batch_size=8)``): :meth:`CorpusOptions.merged` folds them into the object, and a keyword that
is neither a corpus option nor the analysis's own is a one-line error naming both lists.

Example:
    >>> corpus = CorpusOptions(batch_size=8, seed=1)
    >>> corpus.replace(progress=True).batch_size
    8
    >>> CorpusOptions.merged(None, {"max_length": 64}).max_length
    64
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

from attnprobe.core.checks import check_number
from attnprobe.core.registry import one_of
from attnprobe.errors import InputError

__all__ = ["CORPUS_FIELDS", "DEFAULT_BATCH_SIZE", "TRUNCATIONS", "AnalysisOptions", "CorpusOptions",
           "Truncation", "truncation_mode"]

DEFAULT_BATCH_SIZE = 16  # texts per forward, the same default for every corpus analysis
Truncation = Literal["error", "cut", "skip"] | bool
TRUNCATIONS = ("error", "cut", "skip")


def truncation_mode(value: Truncation) -> str:
    """``"error"``, ``"cut"`` or ``"skip"`` (``False`` / ``True`` mean error / cut)."""
    if value is False:
        return "error"
    if value is True:
        return "cut"
    if value not in TRUNCATIONS:
        raise InputError(one_of("truncation", value, TRUNCATIONS))
    return value  # type: ignore[return-value]


@dataclass(frozen=True)
class CorpusOptions:
    """How an analysis walks a corpus (checked when built: a bad value is an InputError).

    Attributes:
        scope: which heads (:mod:`attnprobe.core.scope`: ``"all"``, ``"layer:3"``, ``"L3H5"``,
            a :class:`~attnprobe.core.scope.Scope` ...); resolved against the model by the
            analysis.
        batch_size: texts (or rows) per forward; ``None``: the analysis's default
            (:data:`DEFAULT_BATCH_SIZE` for most, :meth:`batch` reads it).
        max_length: tokens a text may have (default: what the model takes).
        truncation: texts over the limit: ``"error"`` names the first, ``"cut"`` cuts it,
            ``"skip"`` leaves it out (``False`` / ``True`` mean error / cut).
        progress: a progress bar (tqdm) over batches.
        distributed: split the work over the ranks of an initialised ``torch.distributed``
            group and gather the results (default ``None``: when a group is initialised).
        budget: the most work one text may cost, in the analysis's unit (token-forwards for
            attributions); ``None``: the analysis's default.
        seed: seeds every random choice; the same call gives the same table.
    """

    scope: Any = "all"
    batch_size: int | None = None
    max_length: int | None = None
    truncation: Truncation = "error"
    progress: bool = False
    distributed: bool | None = None
    budget: int | None = None
    seed: int = 0

    def __post_init__(self) -> None:
        for name in ("batch_size", "max_length", "budget"):
            value = getattr(self, name)
            # the wording every analysis used before these fields were gathered here
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)
                                      or value < 1):
                raise InputError(f"{name} must be a positive integer; got {value!r}")
        check_number("seed", self.seed, integer=True, minimum=0)
        truncation_mode(self.truncation)
        for name in ("progress",):
            if not isinstance(getattr(self, name), bool):
                raise InputError(f"{name} must be True or False; got {getattr(self, name)!r}")
        if self.distributed is not None and not isinstance(self.distributed, bool):
            raise InputError(f"distributed must be True, False or None; got "
                             f"{self.distributed!r}")

    @property
    def truncation_mode(self) -> str:
        """``truncation`` as ``"error"``, ``"cut"`` or ``"skip"``."""
        return truncation_mode(self.truncation)

    def batch(self, default: int = DEFAULT_BATCH_SIZE) -> int:
        """``batch_size``, or the analysis's ``default`` when it was not given."""
        return default if self.batch_size is None else self.batch_size

    def replace(self, **changes: Any) -> CorpusOptions:
        """A copy with ``changes`` (checked like a new object)."""
        return dataclasses.replace(self, **changes)

    @classmethod
    def merged(cls, corpus: CorpusOptions | None, keywords: Mapping[str, Any], *,
               own: Sequence[str] = (), owner: str = "this analysis") -> CorpusOptions:
        """``corpus`` (default: the defaults) with the corpus fields among ``keywords``
        replaced. A keyword that is neither a corpus field nor in ``own`` (the analysis's
        own keywords, taken elsewhere) is an InputError naming both."""
        unknown = sorted(set(keywords) - set(CORPUS_FIELDS) - set(own))
        if unknown:
            raise InputError(f"{owner} takes no option {unknown[0]!r}; corpus options: "
                             f"{', '.join(CORPUS_FIELDS)}"
                             + (f"; its own: {', '.join(sorted(own))}" if own else ""))
        base = corpus if corpus is not None else cls()
        if not isinstance(base, CorpusOptions):
            raise InputError(f"corpus must be a CorpusOptions; got {type(base).__name__}")
        changes = {k: v for k, v in keywords.items() if k in CORPUS_FIELDS}
        return base.replace(**changes) if changes else base

    @staticmethod
    def split(keywords: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
        """``keywords`` as (corpus fields, the rest)."""
        corpus = {k: v for k, v in keywords.items() if k in CORPUS_FIELDS}
        return corpus, {k: v for k, v in keywords.items() if k not in CORPUS_FIELDS}


CORPUS_FIELDS: tuple[str, ...] = tuple(f.name for f in fields(CorpusOptions))


class AnalysisOptions:
    """Base of an analysis's own frozen options dataclass (``CensusOptions``,
    ``ReportOptions`` ...): its keyword form, ``census(..., similarity=False)``.

    A subclass sets :attr:`owner`, the call named in the error for an unknown keyword.
    """

    owner: ClassVar[str] = "this analysis"

    def with_keywords(self, keywords: Mapping[str, Any], owner: str | None = None) -> Any:
        """These options with ``keywords`` (option names) replaced; an unknown name is an
        InputError naming the options."""
        known = sorted(f.name for f in fields(self))  # type: ignore[arg-type]
        unknown = sorted(set(keywords) - set(known))
        if unknown:
            raise InputError(f"{owner or self.owner} got unknown option(s) "
                             f"{', '.join(unknown)}; the options are {', '.join(known)} (corpus "
                             f"options: {', '.join(CORPUS_FIELDS)})")
        return dataclasses.replace(self, **keywords) if keywords else self  # type: ignore
